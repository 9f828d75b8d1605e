"""Errors raised while reading RLJob manifests.

`FieldProblem` is what the spec's cross-field validators raise: it names the offending field
relative to the model that raised it, so `omnirl validate` can print the full dotted path
(`spec.algorithm.flowGrpo.window.range`) instead of the path of the model that ran the check;
`FieldProblems` several of them at once (one line each).
`ManifestError` is what the loader raises: every problem of a file, one line each.
`ConfigError` is what a role raises at start-up for a setting that cannot work where it runs (a
model directory without the family's layout, an unreadable checkpoint): permanent, so the role exits
`omnirl.api.exits.CONFIG_ERROR_EXIT` and neither the launcher nor the operator restarts it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def format_value(value: Any, limit: int = 80) -> str:
    """A short JSON rendering of a bad value for a problem line (`8`, `"eight"`, `[4, 12]`).

    Tuples print as JSON lists; anything JSON cannot encode prints as its `str`. The text is cut to
    `limit` characters with a trailing `...`.
    """
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):  # e.g. a dict with non-string keys mixed with others
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class FieldProblem(ValueError):
    """A bad value found by a cross-field check, with the field it belongs to.

    Args:
        path: dotted path relative to the model whose validator raises it (`"window.range"`);
            list indices are written `reward[0]`.
        value: the offending value (printed as JSON).
        requirement: what is allowed, phrased to follow "is invalid:" (`"must be >= 2"`).
    """

    def __init__(self, path: str, value: Any, requirement: str) -> None:
        self.path = path
        self.value = value
        self.requirement = requirement
        super().__init__(f"{path}: {format_value(value)} is invalid: {requirement}")


class FieldProblems(FieldProblem):
    """Several `FieldProblem`s found by one cross-field check, each with its own field, so a user
    fixes them all at once (e.g. every env entry of a role template that the operator owns). Reads as
    the first for a caller that handles one (`path`, `value`, `requirement`); `problems` has them all.

    Args:
        problems: at least one; paths relative to the same model.
    """

    def __init__(self, problems: list[FieldProblem]) -> None:
        if not problems:
            raise ValueError("FieldProblems needs at least one problem")
        self.problems = [q for p in problems for q in (p.problems if isinstance(p, FieldProblems) else [p])]
        first = self.problems[0]
        super().__init__(first.path, first.value, first.requirement)
        self.args = ("; ".join(str(p) for p in self.problems),)

    @staticmethod
    def raise_any(problems: list[FieldProblem]) -> None:
        """Raise the one problem of `problems`, or `FieldProblems` of several; nothing when empty."""
        if len(problems) == 1:
            raise problems[0]
        if problems:
            raise FieldProblems(problems)


class ManifestError(ValueError):
    """A manifest that cannot be read or does not validate.

    Attributes:
        problems: one human-readable line per problem, each starting with the file name, e.g.
            `job.yaml: spec.algorithm.groupSize: 1 is invalid: must be >= 2 (line 12)`.
    """

    def __init__(self, problems: list[str]) -> None:
        if not problems:
            raise ValueError("ManifestError needs at least one problem line")
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class ConfigError(ValueError):
    """A setting the job cannot run with, found by a role at start-up; restarting cannot help.

    The message names the field (`spec.model.path: ...`) and what is wrong with it.
    """


def error_text(err: BaseException) -> str:
    """The message of `err` as raised, for a one-line report.

    A `KeyError`'s `str` is the `repr` of its argument (`KeyError("OMNIRL_JOB_NAME is not set")`
    prints `'OMNIRL_JOB_NAME is not set'`), so a KeyError with one string argument gives that string;
    any other error its `str` unchanged: quotes around a user's value at either end stay.
    """
    if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str):
        return err.args[0]
    return str(err)


@contextmanager
def config_errors(field: str, *kinds: type[BaseException], fix: str = "") -> Iterator[None]:
    """Turn the `kinds` of errors raised inside (default: OSError, ValueError) into a `ConfigError`
    `"{field}: {error}[; {fix}]"` (just the error's text when it already starts with `field`): for the start-up steps that only read the job's own files (model weights,
    tokenizers, prompt files, checkpoints), where such an error comes back on every restart.

    Raises:
        ConfigError: chained to the original error.
    """
    caught = kinds or (OSError, ValueError)
    try:
        yield
    except ConfigError:
        raise
    except caught as err:
        text = error_text(err)
        text = text if text.startswith(field) else f"{field}: {text}"
        raise ConfigError(f"{text}; {fix}" if fix else text) from err

"""The reward-kind registry: one module per kind registers itself with `register_kind`.

A kind module (`omnirl/reward/kinds/` holds the built-in ones; any module under `omnirl/reward/` may register) defines
its params class (a pydantic `SpecModel`: what `spec.reward[].params` may hold) and calls
`register_kind(RewardKind(...))` with where it runs and how its scorer is built. Its top imports only pydantic and
`omnirl.api`: the spec imports the module for the params class wherever a manifest is checked (the operator's
image has no numpy), so the scorer's own imports go inside `build` (or in a module `build` imports).
`get_kind(name)` imports only that kind's module, named by the spec's generated table
(`omnirl.api.extensions_generated`, written by `python -m omnirl.extensions --write`). How to add one:
docs/extending.md.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omnirl.api.extensions import REWARD_KINDS, RewardKindInfo, import_registered

if TYPE_CHECKING:
    from omnirl.api._base import SpecModel
    from omnirl.api.spec import RewardSpec


class NotOnThisMachine(ValueError):
    """A `check_environment` refusal that is about this machine, not the manifest (a module or variable it lacks):
    `omnirl run` and the reward role refuse it as any ValueError; `omnirl validate` notes it (the manifest may be
    meant for a cluster, whose pods have it), as it notes a model directory that is not here."""


def _never(params: Any) -> bool:
    return False


@dataclass(frozen=True)
class RewardKind:
    """A reward kind: its name, params class, where it runs, and its hooks.

    Attributes:
        name: `spec.reward[].kind`.
        params: its params class (a `SpecModel`; no fields for none).
        build: `(spec: RewardSpec, params, *, threads: int, field: str) -> Scorer` (`GroupScorer` for runs
            `group`): the scorer of one reward entry. `threads` is the reward process's CPU threads, `field` the
            entry's path (`spec.reward[1]`) for messages. Raises ValueError naming `field` for a setting the
            scorer cannot take.
        runs: `in-process`, `remote` or `group` (`omnirl.api.extensions.Runs`).
        endpoint: for `remote`: `http`, `grpc` or `openai` (how `url` is checked).
        modalities: what it scores.
        reads_text: `params -> bool`: its reward is the OCR rule on the prompt's quoted text (counted by
            `val_exact_match`).
        check_environment: `(params, field) -> None`, before anything starts (`omnirl run`, `omnirl eval`, the
            reward role) and in `omnirl validate`: e.g. an API key's variable is set. Raises ValueError naming the
            field; `NotOnThisMachine` for what this machine lacks (validate notes it instead of refusing).
        check_prompts: `(params, prompts, field, where) -> None`, on the job's prompt files (`omnirl run`'s
            pre-flight): prompts are `(line number, text)`. Raises ValueError naming the field, file and line.
        check_endpoint: `(spec, params, field, strict) -> None`: the `url` answers as this kind's scorer should
            (strict False: a scorer that does not answer yet passes). Raises ValueError naming the field.
    """

    name: str
    params: type[SpecModel]
    build: Callable[..., Any]
    runs: str = "in-process"
    endpoint: str | None = None
    modalities: Sequence[str] = ("image",)
    reads_text: Callable[[Any], bool] = _never
    check_environment: Callable[[Any, str], None] | None = None
    check_prompts: Callable[[Any, list[tuple[int, str]], str, str], None] | None = None
    check_endpoint: Callable[[RewardSpec, Any, str, bool], None] | None = None
    module: str = field(default="", compare=False)

    def info(self) -> RewardKindInfo:
        """What the spec knows of this kind (its row of the generated table)."""
        return RewardKindInfo(name=self.name, module=self.module, params=self.params.__name__,
                              params_keys=tuple(self.params.model_fields), runs=self.runs, endpoint=self.endpoint,
                              modalities=tuple(self.modalities))


_REGISTERED: dict[str, RewardKind] = {}
_RUNS = ("in-process", "remote", "group")
_ENDPOINTS = ("http", "grpc", "openai")


def register_kind(kind: RewardKind) -> RewardKind:
    """Register `kind` under `kind.name` (call it at the top level of the kind's module); returns it.

    Raises:
        ValueError: the name is taken by another module, `runs`/`endpoint` is not one of the allowed values, or
            a remote kind without an endpoint.
    """
    module = sys._getframe(1).f_globals["__name__"]  # the registering module: what `get_kind` imports
    if getattr(sys.modules[module], kind.params.__name__, None) is not kind.params:
        raise ValueError(f"reward kind {kind.name!r}: its params class {kind.params.__name__} must be a top-level "
                         f"name of {module} (the spec imports it from there)")
    if kind.runs not in _RUNS:
        raise ValueError(f"reward kind {kind.name!r}: runs must be one of {_RUNS}, got {kind.runs!r}")
    if (kind.runs == "remote") != (kind.endpoint is not None) or kind.endpoint not in (None, *_ENDPOINTS):
        raise ValueError(f"reward kind {kind.name!r}: a remote kind has an endpoint ({', '.join(_ENDPOINTS)}) and "
                         f"only a remote one; got runs {kind.runs!r}, endpoint {kind.endpoint!r}")
    old = _REGISTERED.get(kind.name)
    if old is not None and old.module != module:
        raise ValueError(f"reward kind {kind.name!r} is registered twice: {old.module} and {module}")
    kind = RewardKind(**{**kind.__dict__, "module": module})
    _REGISTERED[kind.name] = kind
    return kind


def get_kind(name: str) -> RewardKind:
    """The registered kind `name`, importing its module (and only it).

    Raises:
        ValueError: an unknown kind, or a module that does not register it (a stale table:
            `python -m omnirl.extensions --write`).
    """
    return import_registered(name, REWARD_KINDS, _REGISTERED, unknown="reward kind", what="reward kind")


def registered_kinds() -> dict[str, RewardKind]:
    """Every kind registered by the modules imported so far (`omnirl.extensions` imports them all)."""
    return dict(_REGISTERED)

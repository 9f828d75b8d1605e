"""RewardSpec → scorer, and the pre-flight checks of `spec.reward`, through each kind's registration
(`omnirl.reward.kinds`). The params were checked when the spec was validated (`omnirl.api.spec_reward`)."""

from __future__ import annotations

from omnirl.api.spec import RewardSpec
from omnirl.scorers.base import Scorer
from omnirl.scorers.kinds import NotOnThisMachine, get_kind


def build_scorer(spec: RewardSpec, threads: int = 1, field: str | None = None) -> Scorer:
    """Construct the scorer a `RewardSpec` names, from its typed params (its kind's `build`).

    Args:
        spec: the reward entry.
        threads: CPU threads of the reward process (`OMNIRL_THREADS`): the default of CPU scorers'
            own `threads` parameter, so a scorer on a GPU machine uses the cores it was given.
        field: the entry's path (`spec.reward[1]`), named by scorers' messages about its
            settings (default `spec.reward[NAME]`).

    Raises:
        ValueError: a scorer cannot be built (e.g. an OCR alphabet the recogniser does not know), or the kind
            is group-level (`omnirl.scorers.group_registry`).
    """
    kind = get_kind(spec.kind)
    if kind.runs == "group":
        raise ValueError(f"reward {spec.name!r}: kind {spec.kind!r} is a group-level scorer "
                         "(omnirl.scorers.group_registry)")
    return kind.build(spec, spec.typed_params(), threads=threads, field=field or f"spec.reward[{spec.name}]")


def check_api_keys(specs: list[RewardSpec]) -> None:
    """Each entry's kind checks this process's environment (`RewardKind.check_environment`: a `vlm` entry's
    `params.apiKeyEnv` names a variable that is set): before `omnirl run` starts anything, before `omnirl eval`
    loads a model, and when the reward role builds its scorers.

    Raises:
        ValueError: naming `spec.reward[i].params.…`, the variable and the fix.
    """
    for i, spec in enumerate(specs):
        check = get_kind(spec.kind).check_environment
        if check is not None:
            check(spec.typed_params(), f"spec.reward[{i}]")


def environment_lines(specs: list[RewardSpec]) -> tuple[list[str], list[str]]:
    """`omnirl validate`'s reading of each entry's `RewardKind.check_environment` on this machine: (notes of what
    this machine lacks, `NotOnThisMachine`, which a cluster's pods may have; problems, every other refusal).
    Each line names `spec.reward[i]`."""
    notes, problems = [], []
    for i, spec in enumerate(specs):
        check = get_kind(spec.kind).check_environment
        if check is None:
            continue
        try:
            check(spec.typed_params(), f"spec.reward[{i}]")
        except NotOnThisMachine as err:
            notes.append(f"{err} (omnirl run here refuses it)")
        except ValueError as err:
            problems.append(str(err))
    return notes, problems


def check_in_process(specs: list[RewardSpec]) -> None:
    """Build every in-process scorer of `spec.reward` once (OCR: its recogniser and alphabet), before
    `omnirl run` starts a process: left to the reward worker, a setting its model cannot take stops
    the job only after every role has loaded.

    Raises:
        ValueError: naming `spec.reward[i].params.…` (e.g. an alphabet the recogniser cannot read).
    """
    for i, spec in enumerate(specs):
        if get_kind(spec.kind).runs == "in-process":
            build_scorer(spec, field=f"spec.reward[{i}]")


def check_readable(specs: list[RewardSpec], prompts: list[tuple[int, str]], where: str) -> None:
    """Each entry's kind checks the prompts it will score (`RewardKind.check_prompts`): an `ocr` reward's
    `params.alphabet` can spell the text each prompt asks for.

    Args:
        specs: the job's whole `spec.reward` (the message indexes it).
        prompts: (line number, prompt) pairs, as `controller.data.numbered_prompts` returns them.
        where: the field or flag and the file, e.g. `spec.data.trainPrompts: p.txt`.
    Raises:
        ValueError: naming `spec.reward[i].params.…`, the file and line, and the fix.
    """
    for i, spec in enumerate(specs):
        check = get_kind(spec.kind).check_prompts
        if check is not None:
            check(spec.typed_params(), prompts, f"spec.reward[{i}]", where)


def check_judges(specs: list[RewardSpec], only: set[str] | None = None, *, strict: bool = True) -> None:
    """Every remote entry with a `url` answers as its kind should (`RewardKind.check_endpoint`; entries whose
    `server` the job has not started yet have no url and are skipped): a `vlm` judge answers, takes its key and
    serves its `params.model` (`vlm.check_judge`); an `http`/`grpc` scorer answers an empty request of the
    scorer protocol at that url (`remote.check_remote`). Run before `omnirl run` starts the roles, before
    `omnirl eval` loads a model, and (strict=False) when a reward worker starts.

    Args:
        specs: the job's whole `spec.reward` (the messages index it).
        only: the names of the entries to check (None: every one).
        strict: False in a reward worker: a scorer that does not answer yet passes (it may be loading).

    Raises:
        ValueError: naming `spec.reward[i]`'s url, params.apiKeyEnv or params.model and the fix.
    """
    for i, spec in enumerate(specs):
        if not spec.url or (only is not None and spec.name not in only):
            continue
        check = get_kind(spec.kind).check_endpoint
        if check is not None:
            check(spec, spec.typed_params(), f"spec.reward[{i}]", strict)

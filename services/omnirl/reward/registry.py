"""RewardSpec → scorer. The params were checked when the spec was validated (`omnirl.api.spec_reward`)."""

from __future__ import annotations

from omnirl.api.spec import RewardSpec
from omnirl.reward.base import Scorer


def build_scorer(spec: RewardSpec, threads: int = 1, field: str | None = None) -> Scorer:
    """Construct the scorer a `RewardSpec` names, from its typed params.

    Args:
        spec: the reward entry.
        threads: CPU threads of the reward process (`OMNIRL_THREADS`): the default of CPU scorers'
            own `threads` parameter, so a scorer on a GPU machine uses the cores it was given.
        field: the entry's path (`spec.reward[1]`), named by remote scorers' messages about its
            settings (default `spec.reward[NAME]`).

    Raises:
        ValueError: a scorer cannot be built (e.g. an OCR alphabet the recogniser does not know).
    """
    params = spec.typed_params()
    if spec.kind == "ocr":
        from omnirl.reward.ocr import OCRScorer

        try:
            return OCRScorer(alphabet=params.alphabet, threads=params.threads or threads, batch_size=params.batchSize)
        except ValueError as err:  # the only one it raises on a checked spec: an alphabet the model cannot read
            raise ValueError(f"{field or f'spec.reward[{spec.name}]'}.params.{err}") from err
    if spec.kind == "jpeg":
        from omnirl.reward.jpeg import JPEGCompressibilityScorer

        return JPEGCompressibilityScorer(quality=params.quality)
    if spec.kind.startswith("avdigits-"):
        from omnirl.reward.avdigits import SCORERS, FrameOCRScorer

        if spec.kind == "avdigits-ocr":
            return FrameOCRScorer(threads=params.threads or threads, batch_size=params.batchSize)
        return SCORERS[spec.kind]()
    if spec.kind == "http":
        from omnirl.reward.remote import HTTPScorer

        return HTTPScorer(spec.name, spec.url, timeout_s=spec.timeoutSeconds, max_retries=params.maxRetries, field=field)
    if spec.kind == "grpc":
        from omnirl.reward.remote import GRPCScorer

        return GRPCScorer(spec.name, spec.url, timeout_s=spec.timeoutSeconds, max_retries=params.maxRetries, field=field)
    if spec.kind == "vlm":
        from omnirl.reward.vlm import VLMScorer

        return VLMScorer(spec.name, spec.url, params, timeout_s=spec.timeoutSeconds, field=field)
    raise ValueError(f"reward {spec.name!r}: kind {spec.kind!r} is a group-level scorer (omnirl.reward.group_registry)")


def check_api_keys(specs: list[RewardSpec]) -> None:
    """Every `kind: vlm` entry of `spec.reward` whose `params.apiKeyEnv` names a variable finds it
    set in this process's environment: before `omnirl run` starts anything, before `omnirl eval`
    loads a model, and when the reward role builds its scorers.

    Raises:
        ValueError: naming `spec.reward[i].params.apiKeyEnv`, the variable and the fix (`vlm.api_key`).
    """
    for i, spec in enumerate(specs):
        if spec.kind == "vlm":
            from omnirl.reward.vlm import api_key  # the openai client only for jobs with a VLM judge

            api_key(spec.typed_params().apiKeyEnv, f"spec.reward[{i}].params.apiKeyEnv")


def check_in_process(specs: list[RewardSpec]) -> None:
    """Build every in-process scorer of `spec.reward` once (OCR: its recogniser and alphabet), before
    `omnirl run` starts a process: left to the reward worker, a setting its model cannot take stops
    the job only after every role has loaded.

    Raises:
        ValueError: naming `spec.reward[i].params.…` (e.g. an alphabet the recogniser cannot read).
    """
    for i, spec in enumerate(specs):
        if spec.kind in ("ocr", "jpeg", "avdigits-ocr"):
            build_scorer(spec, field=f"spec.reward[{i}]")


def check_readable(specs: list[RewardSpec], prompts: list[tuple[int, str]], where: str) -> None:
    """Every `ocr` reward's `params.alphabet` can spell the text each prompt asks for: the reading is
    restricted to the alphabet, so a character outside it is never read and no sample of that prompt
    reaches 1 (alphabet "αβ" with the digit prompts trained a whole run on rewards of 0.000).

    Args:
        specs: the job's whole `spec.reward` (the message indexes it).
        prompts: (line number, prompt) pairs, as `controller.data.numbered_prompts` returns them.
        where: the field or flag and the file, e.g. `spec.data.trainPrompts: p.txt`.
    Raises:
        ValueError: naming `spec.reward[i].params.alphabet`, the characters it lacks, the file and line,
            and the fix.
    """
    from omnirl.api.prompts import target_text

    for i, spec in enumerate(specs):
        if spec.kind != "ocr":
            continue
        alphabet = spec.typed_params().alphabet
        for n, text in prompts:
            try:
                target = target_text(text)
            except (TypeError, ValueError):
                continue  # an unbalanced quote: the tokenizer's check names the line
            missing = "".join(sorted({ch for ch in target if ch != " " and ch not in alphabet}))
            if missing:
                raise ValueError(f"spec.reward[{i}].params.alphabet: {alphabet!r} lacks {missing!r}, which {where} "
                                 f"line {n} asks for ({text!r}): no sample of it could score 1; add the characters "
                                 "to the alphabet, or fix or remove that line")


def check_judges(specs: list[RewardSpec], only: set[str] | None = None, *, strict: bool = True) -> None:
    """Every remote entry with a `url` answers as its kind should (entries whose `server` the job has
    not started yet have no url and are skipped): a `vlm` judge answers, takes its key and serves its
    `params.model` (`vlm.check_judge`); an `http`/`grpc` scorer answers an empty request of the
    scorer protocol at that url (`remote.check_remote`). Run before `omnirl run` starts the roles,
    before `omnirl eval` loads a model, and (strict=False) when a reward worker starts.

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
        if spec.kind == "vlm":
            from omnirl.reward.vlm import check_judge

            check_judge(f"spec.reward[{i}]", spec.url, spec.typed_params(), spec.timeoutSeconds, strict=strict)
        elif spec.kind in ("http", "grpc"):
            from omnirl.reward.remote import check_remote

            check_remote(f"spec.reward[{i}]", spec.kind, spec.url, spec.timeoutSeconds, strict=strict)

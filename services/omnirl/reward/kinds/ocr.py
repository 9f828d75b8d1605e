"""`kind: ocr`: PP-OCRv4 recogniser restricted to an alphabet, scored in the reward workers (`omnirl.reward.ocr`)."""

from __future__ import annotations

from pydantic import Field

from omnirl.api._base import SpecModel
from omnirl.scorers.kinds import RewardKind, register_kind


class OCRParams(SpecModel):
    """`kind: ocr`: PP-OCRv4 recogniser restricted to an alphabet (`omnirl.reward.ocr`)."""

    alphabet: str = Field("0123456789", min_length=1, max_length=256, description="Characters a reading may contain.")
    threads: int | None = Field(None, ge=1, le=64, description="onnxruntime intra-op threads (default: the reward "
                                "process's threads, OMNIRL_THREADS: the CPU cores `omnirl run` left to it, else 1).")
    batchSize: int = Field(64, ge=1, le=4096, description="Images per recogniser call.")


def build(spec, params: OCRParams, *, threads: int, field: str):
    """An `OCRScorer`. Raises ValueError naming `field.params.alphabet` for an alphabet the recogniser cannot read."""
    from omnirl.reward.ocr import OCRScorer

    try:
        return OCRScorer(alphabet=params.alphabet, threads=params.threads or threads, batch_size=params.batchSize)
    except ValueError as err:  # the only one it raises on a checked spec: an alphabet the model cannot read
        raise ValueError(f"{field}.params.{err}") from err


def check_prompts(params: OCRParams, prompts: list[tuple[int, str]], field: str, where: str) -> None:
    """`params.alphabet` can spell the text each prompt asks for: the reading is restricted to the alphabet, so a
    character outside it is never read and no sample of that prompt reaches 1 (alphabet "αβ" with the digit
    prompts trained a whole run on rewards of 0.000).

    Raises:
        ValueError: naming `field.params.alphabet`, the characters it lacks, the file and line, and the fix.
    """
    from omnirl.api.prompts import target_text

    for n, text in prompts:
        try:
            target = target_text(text)
        except (TypeError, ValueError):
            continue  # an unbalanced quote: the tokenizer's check names the line
        missing = "".join(sorted({ch for ch in target if ch != " " and ch not in params.alphabet}))
        if missing:
            raise ValueError(f"{field}.params.alphabet: {params.alphabet!r} lacks {missing!r}, which {where} "
                             f"line {n} asks for ({text!r}): no sample of it could score 1; add the characters "
                             "to the alphabet, or fix or remove that line")


KIND = register_kind(RewardKind(name="ocr", params=OCRParams, build=build, reads_text=lambda params: True,
                                check_prompts=check_prompts))

"""Reward scorers: images + prompts → float32 rewards, or a `ScorerError` (never a silent 0).

Scorers live in their own modules (`omnirl.reward.ocr.OCRScorer`,
`omnirl.reward.jpeg.JPEGCompressibilityScorer`) and each reward kind in one module of `omnirl.reward.kinds`, so
importing this package loads no model runtime, not even numpy: the spec imports a kind's module for its params
class wherever a manifest is checked, the operator included. `Scorer` and `ScorerError` come from
`omnirl.scorers.base` on first use.
"""

__all__ = ["Scorer", "ScorerError"]


def __getattr__(name: str):
    if name in __all__:
        from omnirl.scorers import base

        return getattr(base, name)
    raise AttributeError(f"module 'omnirl.reward' has no attribute {name!r}")

"""Reward scorers: images + prompts → float32 rewards, or a `ScorerError` (never a silent 0).

Scorers live in their own modules (`omnirl.reward.ocr.OCRScorer`,
`omnirl.reward.jpeg.JPEGCompressibilityScorer`) so importing this package loads no model runtime.
"""

from omnirl.scorers.base import Scorer, ScorerError

__all__ = ["Scorer", "ScorerError"]

"""Reward scorers: images + prompts → float32 rewards, or a `ScorerError` (never a silent 0)."""

from omnirl.reward.base import Scorer, ScorerError
from omnirl.reward.jpeg import JPEGCompressibilityScorer
from omnirl.reward.ocr import OCRScorer

__all__ = ["JPEGCompressibilityScorer", "OCRScorer", "Scorer", "ScorerError"]

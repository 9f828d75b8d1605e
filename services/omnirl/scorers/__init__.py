"""What the scorers' users share, below the roles: the scorer contract (`base.py`: `ScorerError`, the
`Scorer` and `GroupScorer` protocols, the batch checks), the OCR text rules (`text.py`), and the group-level
scorers the controller runs (`group_registry.py`, `pairwise.py`). The reward role, `omnirl eval`, the
scorer servers and the controller import them here, so no role imports another's package; the per-sample
scorers and the reward role stay in `omnirl.reward`. Loads no model runtime.
"""

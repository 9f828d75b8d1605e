"""Group-level rewards (`reward[].kind` in `GROUP_KINDS`), scored by the controller.

A group scorer sees one prompt's G samples at once, so it runs where whole groups exist: when
a group of a training step is complete (every member scored by the per-sample rewards, none
failed), its images are loaded from the TransferQueue and each group scorer adds its component
to the members' `rewards`. The step's totals are then recombined with the normalisation of
`omnirl.controller.normalize`.
"""

from __future__ import annotations

import numpy as np

from omnirl.api.spec import GROUP_KINDS, RewardSpec
from omnirl.controller.groups import Group
from omnirl.scorers.base import ScorerError, check_rewards
from omnirl.scorers.group_registry import build_group_scorer
from omnirl.transfer import TransferQueue


class GroupScoring:
    """The job's group scorers.

    Args:
        specs: `spec.reward` (only the group kinds are used).
        queue: where the samples' images are (`image` tensor under each score's tensor key).
    """

    def __init__(self, specs: list[RewardSpec], queue: TransferQueue) -> None:
        self.specs = [s for s in specs if s.kind in GROUP_KINDS]
        self.scorers = {s.name: build_group_scorer(s) for s in self.specs}
        self.queue = queue
        self._scored: set[str] = set()  # group ids (attempts) already scored

    def apply(self, group: Group) -> list[str]:
        """Score a complete, unfailed group in place (once); returns the reasons of failed
        required group scorers (empty: train it)."""
        if not self.specs or group.request.group_id in self._scored:
            return []
        ids = sorted(group.scores)
        try:
            images = np.stack([self.queue.load_image(group.tensor_keys[i]).numpy() for i in ids])
        except (LookupError, ValueError) as err:  # lost tensors (MissingTensors), or members of different sizes
            return [f"group {group.request.group_id}: cannot load its images: {err}"]
        reasons = []
        for spec in self.specs:
            try:
                values = check_rewards(self.scorers[spec.name].score_group(
                    images, [group.request.prompt] * len(ids), ids), ids)
            except ScorerError as err:
                if spec.required:
                    reasons.append(err.named(spec.name))
                continue  # a non-required one contributes nothing, like a failed per-sample reward
            for i, v in zip(ids, values.tolist(), strict=True):
                group.scores[i].rewards[spec.name] = float(v)
        if not reasons:
            self._scored.add(group.request.group_id)
        return reasons

"""In-run validation: held-out prompts through the real rollout and reward workers.

Each validation publishes one ODE request per held-out prompt (`omnirl.rollout.requests.heldout_request`:
`kind="val"`, no SDE window, `validation.numSteps` steps), the very requests `omnirl eval` runs
through its in-process engine and scores with the same weighted rewards, so the number in
`metrics.jsonl` and the one `omnirl eval --checkpoint` prints agree. It writes an image grid
`OUT/samples/step-XXXXX.png` of the first 32 prompts with their rewards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from omnirl.api.messages import ScoreMeta
from omnirl.api.spec import GROUP_KINDS, RLJobSpec
from omnirl.controller.data import read_prompts
from omnirl.controller.grid import save_image_grid
from omnirl.reward.text import exact_match, text_rewards
from omnirl.rollout.requests import heldout_request
from omnirl.transfer import TransferQueue

GRID_SIZE = 32


def background_darkness(images: list[np.ndarray], rows: int = 2) -> float:
    """Mean darkness (0 = white, 1 = black) of the top and bottom `rows` pixel rows of `[H, W, 3]`
    uint8 images: where no glyph is drawn. A reward rising with it is reward hacking (speckle,
    halos), not better glyphs (`references/demo-task.md`)."""
    border = [np.concatenate([im[:rows], im[-rows:]]).astype(np.float32) for im in images]
    return float(np.mean([1.0 - b.mean() / 255.0 for b in border]))


class SampleUnscored(RuntimeError):
    """A validation sample could not be scored: the reward role already retried it, so the
    controller fails the job (`JobFailed`, not restarted) rather than crash into a restart."""


class Validator:
    """Publishes a validation round and collects its scores.

    `nonce` tells this controller's rounds from a dead predecessor's: sample ids are
    `val{step}:{prompt}:{nonce}`, so a round redone after a controller restart is generated anew
    (the rollout's exactly-once markers would otherwise skip it) and the old round's late scores are
    dropped.
    """

    def __init__(self, queue: TransferQueue, spec: RLJobSpec, tokenize: Callable[[str], list[int]], out: Path,
                 nonce: int = 0) -> None:
        self.queue, self.spec, self.out, self.nonce = queue, spec, out, nonce
        self.prompts = read_prompts(spec.data.validationPrompts, "spec.data.validationPrompts")[: spec.validation.maxPrompts]
        self.ids = [list(tokenize(p)) for p in self.prompts]
        self.round: int | None = None
        self.version = 0
        self.scores: dict[int, ScoreMeta] = {}
        self.keys: dict[int, str] = {}
        self.t0 = 0.0

    def publish(self, at_step: int, version: int) -> None:
        """Send one ODE request per held-out prompt, tagged with the training step it follows."""
        self.round, self.version, self.t0 = at_step, version, time.time()
        self.scores, self.keys = {}, {}
        for i, (prompt, ids) in enumerate(zip(self.prompts, self.ids, strict=True)):
            req = heldout_request(self.spec, i, prompt, ids, step=at_step, sample_id=f"val{at_step}:{i}:{self.nonce}")
            self.queue.publish(self.queue.streams.requests, req.model_dump())

    def record(self, score: ScoreMeta, tensor_key: str | None) -> None:
        """File a validation score (ignores leftovers of an earlier round)."""
        if self.round is None or score.step != self.round or score.sample_id.rsplit(":", 1)[1] != str(self.nonce):
            if tensor_key:
                self.queue.delete_tensors([tensor_key])
            return
        index = int(score.group_id.split(":")[1])
        self.scores[index] = score
        if tensor_key:
            self.keys[index] = tensor_key

    @property
    def complete(self) -> bool:
        """Every prompt of the current round is scored."""
        return self.round is not None and len(self.scores) == len(self.prompts)

    def finish(self) -> dict:
        """Summarise the round, write its grid, delete its tensors.

        Raises:
            SampleUnscored: a sample's scoring failed (after the reward role's own retries).
        """
        failed = [s for s in self.scores.values() if s.failed]
        if failed:
            raise SampleUnscored(f"validation sample {failed[0].sample_id} could not be scored: {failed[0].reason}")
        rewards = [self.scores[i].reward for i in range(len(self.prompts))]
        images = [self.queue.load_image(self.keys[i]).numpy() for i in range(len(self.prompts))]
        first = list(range(min(GRID_SIZE, len(self.prompts))))
        grid = self.out / "samples" / f"step-{self.round:05d}.png"
        save_image_grid([images[i] for i in first], grid, ncols=8, captions=[f"{rewards[i]:.2f}" for i in first])
        self.queue.delete_tensors(list(self.keys.values()))
        summary = {
            "step": self.round, "policy_version": self.version, "n": len(rewards),
            "val_reward_mean": sum(rewards) / len(rewards),
            # each OCR-rule reward's own score, not the weighted sum (None: the job matches no text)
            "val_exact_match": exact_match([self.scores[i].rewards for i in range(len(self.prompts))],
                                           text_rewards(self.spec.reward)),
            "val_background_darkness": background_darkness(images),
            "val_seconds": time.time() - self.t0, "grid": str(grid),
        }
        for spec in self.spec.reward:  # each per-sample component's raw mean, e.g. val_reward_ocr
            if spec.kind in GROUP_KINDS:  # a validation group has one sample: no group scorer runs
                continue
            parts = [s.rewards[spec.name] for s in self.scores.values() if spec.name in s.rewards]
            summary[f"val_reward_{spec.name}"] = sum(parts) / len(parts) if parts else None
            summary[f"val_component_missing_{spec.name}"] = len(rewards) - len(parts)  # a non-required one failed
        self.round = None
        return summary

"""In-run validation: held-out prompts through the real rollout and reward workers.

Each validation publishes one ODE request per held-out prompt (`omnirl.api.heldout.heldout_request`:
`kind="val"`, no SDE window, `validation.numSteps` steps) in cohorts of `roles.rollout.maxBatchSize`
consecutive prompts, one stream entry each (`api/heldout.py::heldout_cohorts`), the very requests and batches `omnirl
eval` runs through its in-process engine and scores with the same weighted rewards, so the number in
`metrics.jsonl` and the one `omnirl eval --checkpoint` prints agree. It writes an image grid
`OUT/samples/step-XXXXX.png` of the first 32 prompts with their rewards and texts (`tile_caption`); for an
audio+video family a contact sheet there instead (frames and loudness) and MP4s with sound,
`OUT/samples/step-XXXXX/NN.mp4` (`controller/media_files.py`).

A sample whose tensors are gone before the round is summarised (expired after
`spec.transferQueue.tensorTtlSeconds`, or deleted: the reward role's `lost` score, or an image gone when
the grid reads it) is left out and counted: the line's `n` is the samples the mean is over, `missing` the
others, and one warning names them and the fix; the job goes on (a lost sample failed the job before).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from omnirl.api.extensions import FAMILIES
from omnirl.api.heldout import heldout_cohorts, heldout_request
from omnirl.api.messages import ScoreMeta
from omnirl.api.spec import GROUP_KINDS, RLJobSpec
from omnirl.controller.data import read_prompts
from omnirl.controller.grid import save_image_grid, tile_caption
from omnirl.controller.media_files import SHEET_SAMPLES, write_media
from omnirl.scorers.text import exact_match, text_rewards
from omnirl.transfer import MissingTensors, TransferQueue

GRID_SIZE = 32
log = logging.getLogger("omnirl.controller")


def background_darkness(images: list[np.ndarray], rows: int = 2) -> float:
    """Mean darkness (0 = white, 1 = black) of the top and bottom `rows` pixel rows of `[H, W, 3]`
    uint8 images: where no glyph is drawn. A reward rising with it is reward hacking (speckle,
    halos), not better glyphs (`references/demo-task.md`)."""
    border = [np.concatenate([im[:rows], im[-rows:]]).astype(np.float32) for im in images]
    return float(np.mean([1.0 - b.mean() / 255.0 for b in border]))


class SampleUnscored(RuntimeError):
    """A validation sample could not be scored: the reward role already retried it, so the
    controller fails the job (`JobFailed`, not restarted) rather than crash into a restart."""


def gone_reason(key: str, age_s: float, ttl_s: float) -> str:
    """Why the image `key` of a held-out sample generated `age_s` seconds ago (the rollout's clock) was gone
    when the round was summarised: expired (`age_s` ≥ `ttl_s`, spec.transferQueue.tensorTtlSeconds: raise it),
    or deleted within its TTL (a Redis restarted without persistence, a key evicted or deleted), where a
    higher TTL cannot help (the reward role tells the two apart the same way)."""
    if age_s >= ttl_s:
        return (f"{key} was gone when the controller read it for the round, {age_s:.0f} s after the sample was "
                f"generated (spec.transferQueue.tensorTtlSeconds {ttl_s:g}); raise spec.transferQueue."
                "tensorTtlSeconds above the longest a validation round takes")
    return (f"{key} was deleted before the controller read it for the round, {age_s:.0f} s after the sample was "
            f"generated (within spec.transferQueue.tensorTtlSeconds {ttl_s:g}: not expired; a Redis restarted "
            "without persistence, or a key evicted or deleted)")


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
        self.tag = str(nonce)  # the last part of the current round's sample ids
        self.version = 0
        self.scores: dict[int, ScoreMeta] = {}
        self.keys: dict[int, str] = {}
        self.t0 = 0.0
        self.media = bool({"video", "audio"} & set(FAMILIES[spec.model.family].modalities))

    def _caption(self, i: int) -> str:
        """A contact-sheet caption: the sum and each per-sample reward of held-out prompt i, and its prompt."""
        score = self.scores[i]
        parts = " ".join(f"{name} {value:.2f}" for name, value in score.rewards.items())
        return f"{score.reward:.2f} ({parts})  {self.prompts[i]}"

    def publish(self, at_step: int, version: int, attempt: int = 0) -> None:
        """Send one ODE request per held-out prompt, tagged with the training step it follows, in cohorts
        (`heldout_cohorts`: one stream entry per `roles.rollout.maxBatchSize` consecutive prompts).

        `attempt` ≥ 1 runs the round again (every sample of the previous attempt was missing): the same
        prompts and noise seeds under new sample ids (`val{step}:{i}:{nonce}a{attempt}`), which the rollout's
        exactly-once markers do not skip and which tell its scores from the previous attempt's; the round's clock
        (`val_seconds`) keeps running from attempt 0's publish."""
        if not attempt:  # a rerun is part of the same round: its time counts from the first attempt
            self.t0 = time.monotonic()
        self.round, self.version = at_step, version
        self.scores, self.keys = {}, {}
        self.tag = f"{self.nonce}a{attempt}" if attempt else str(self.nonce)
        # said at the start too: the CPU demo's first round took 14 s idle, 300 s on a busy box, without a line
        log.info("validation after %d training steps (v%d): sampling %d held-out prompts, %d ODE steps each%s",
                 at_step, version, len(self.prompts), self.spec.validation.numSteps,
                 f" (attempt {attempt + 1}: every sample of the last one was missing)" if attempt else "")
        requests = [heldout_request(self.spec, i, prompt, ids, step=at_step, sample_id=f"val{at_step}:{i}:{self.tag}")
                    for i, (prompt, ids) in enumerate(zip(self.prompts, self.ids, strict=True))]
        for cohort in heldout_cohorts(requests, self.spec.roles.rollout.maxBatchSize):
            self.queue.publish(self.queue.streams.requests, cohort.model_dump())

    def record(self, score: ScoreMeta, tensor_key: str | None) -> None:
        """File a validation score (ignores leftovers of an earlier round)."""
        if self.round is None or score.step != self.round or score.sample_id.rsplit(":", 1)[1] != self.tag:
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
        """Summarise the round over the samples it has, write their grid, delete the round's tensors.

        Returns the `validation` line: `n` samples in the means, `missing` samples whose tensors were gone
        (the reward role's `lost` scores, images gone before this read); the means are None when `n` is 0;
        `val_tensor_age_seconds`, the oldest remaining tensor's age of `tensorTtlSeconds` (None: none left);
        `val_seconds`, the whole round's time in seconds, from the publish of its first attempt (`attempt` 0) to
        this summary: a round run again counts both attempts (before: only the rerun's).

        Raises:
            SampleUnscored: a sample's scoring failed for another reason (after the reward role's own retries).
        """
        failed = [s for s in self.scores.values() if s.failed and not s.lost]
        if failed:
            raise SampleUnscored(f"validation sample {failed[0].sample_id} could not be scored: {failed[0].reason}")
        missing = {i: s.reason for i, s in self.scores.items() if s.lost}
        images: dict[int, np.ndarray] = {}
        for i in range(len(self.prompts)):
            if i in missing:
                continue
            try:
                images[i] = self.queue.load_image(self.keys[i]).numpy()
            except MissingTensors as err:  # e.g. a controller stopped for longer than the TTL mid-round
                missing[i] = gone_reason(err.key, time.time() - self.scores[i].generated_at, self.queue.tensor_ttl_s)
        have = sorted(images)  # prompt indices in the means
        rewards = [self.scores[i].reward for i in have]
        first = have[:GRID_SIZE]
        grid = self.out / "samples" / f"step-{self.round:05d}.png"
        videos: list[str] = []
        if first and self.media:  # a contact sheet with the audio's loudness, and MP4s with sound
            sheet = [i for i in have[:SHEET_SAMPLES] if i not in missing]
            media = {i: self.queue.load_media(self.keys[i]) for i in sheet}
            videos = write_media([media[i] for i in sheet], grid, grid.with_suffix(""),
                                 [self._caption(i) for i in sheet])["videos"]
        elif first:
            save_image_grid([images[i] for i in first], grid, ncols=8,
                            captions=[tile_caption(self.prompts[i], self.scores[i].reward) for i in first])
        # how near the round came to tensorTtlSeconds (Redis's clock; `TtlWatch` warns): its oldest tensor still there
        ages = [a for a in self.queue.ages(list(self.keys.values())) if a is not None]
        self.queue.delete_tensors(list(self.keys.values()))
        if missing:
            lost = sorted(missing)
            log.warning("validation at step %d: %d of %d samples missing, left out of the means (n=%d): %s: %s",
                        self.round, len(lost), len(self.prompts), len(have),
                        ", ".join(self.scores[i].sample_id for i in lost[:4]) + (" …" if len(lost) > 4 else ""),
                        missing[lost[0]])
        summary = {
            "step": self.round, "policy_version": self.version, "n": len(have), "missing": len(missing),
            "val_reward_mean": sum(rewards) / len(rewards) if rewards else None,
            # each OCR-rule reward's own score, not the weighted sum (None: the job matches no text)
            "val_exact_match": exact_match([self.scores[i].rewards for i in have], text_rewards(self.spec.reward)),
            "val_background_darkness": background_darkness([images[i] for i in have]) if have else None,
            "val_seconds": time.monotonic() - self.t0, "grid": str(grid) if first else None,
            **({"videos": videos} if self.media else {}),
            "val_tensor_age_seconds": max(ages) if ages else None,
        }
        for spec in self.spec.reward:  # each per-sample component's raw mean, e.g. val_reward_ocr
            if spec.kind in GROUP_KINDS:  # a validation group has one sample: no group scorer runs
                continue
            parts = [self.scores[i].rewards[spec.name] for i in have if spec.name in self.scores[i].rewards]
            summary[f"val_reward_{spec.name}"] = sum(parts) / len(parts) if parts else None
            summary[f"val_component_missing_{spec.name}"] = len(have) - len(parts)  # a non-required one failed
        self.round = None
        return summary

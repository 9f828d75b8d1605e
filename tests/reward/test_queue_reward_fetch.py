"""The reward role reads each sample's image alone, never its trajectory: a real RewardService (the
JPEG scorer, in process) against a real redis-server, with Redis's own counters of what it sent."""

from __future__ import annotations

import numpy as np
import redis
import torch
from tests.helpers import jpeg_reward_job

from omnirl.api.messages import SampleMeta
from omnirl.reward.jpeg import JPEGCompressibilityScorer
from omnirl.reward.service import GROUP, RewardService
from omnirl.transfer import TransferQueue
from omnirl.transfer.codec import encode_tensors

JOB, N = "fetch", 3


def _sample(i: int, g: torch.Generator) -> tuple[dict, dict[str, torch.Tensor], torch.Tensor]:
    meta = SampleMeta(sample_id=f"0:0:{i}", kind="train", step=0, group_id="0:0", prompt="a sign", prompt_ids=[1],
                      policy_version=0, noise_level=0.7, sde_type="sde", worker="rollout-0", generated_at=1.0,
                      rollout_seconds=1.0).model_dump()
    trajectory = {"latents": torch.randn(3, 4, 32, 32, generator=g), "x0": torch.randn(4, 32, 32, generator=g),
                  "log_probs": torch.randn(2, generator=g), "sigmas": torch.linspace(1, 0.5, 3)}
    image = torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8, generator=g)
    return meta, trajectory, image


def test_the_reward_role_fetches_only_the_images(tmp_path, redis_url: str, redis_client: redis.Redis) -> None:
    job, env = jpeg_reward_job(JOB, redis_url, tmp_path)
    g = torch.Generator().manual_seed(0)
    samples = [_sample(i, g) for i in range(N)]
    with TransferQueue(redis_client, JOB) as rollout:
        for meta, trajectory, image in samples:
            rollout.publish(rollout.streams.samples, meta, trajectory, image=image, done_kind="rollout")
    reward = RewardService(job, env)
    try:
        msgs = reward.queue.consume(reward.queue.streams.samples, GROUP, env.worker_id, count=N, block_ms=0)
        assert len(msgs) == N
        redis_client.config_resetstat()
        before = redis_client.info("stats")["total_net_output_bytes"]
        reward.score_batch(msgs)
        sent = redis_client.info("stats")["total_net_output_bytes"] - before
        gets = redis_client.info("commandstats").get("cmdstat_get", {}).get("calls", 0)
    finally:
        reward.close()
    image_bytes = sum(len(encode_tensors({"image": image})) for _, _, image in samples)
    trajectory_bytes = sum(len(encode_tensors(trajectory)) for _, trajectory, _ in samples)
    assert gets == N  # one GET per sample: its image key
    # Redis sent the images, the replies of publish/ack and one INFO reply: far less than one trajectory
    assert image_bytes <= sent < image_bytes + 8_000 < trajectory_bytes / N
    scores = redis_client.xrange(f"omnirl:{JOB}:scores")
    assert len(scores) == N
    with TransferQueue(redis_client, JOB) as q:
        got = {m.meta["sample_id"]: m.meta["reward"] for m in q.consume(q.streams.scores, "c", "c", count=N, block_ms=0)}
        expected = JPEGCompressibilityScorer(90).score(np.stack([im.numpy() for _, _, im in samples]), ["a sign"] * N,
                                                       [m["sample_id"] for m, _, _ in samples])
        assert got == {m["sample_id"]: float(r) for (m, _, _), r in zip(samples, expected, strict=True)}
        q.cleanup()

"""A publish's payload reaches Redis by plain SETs under staged keys that its script renames: the bytes never
pass through Lua, the entry and its keys still appear together or not at all."""

from __future__ import annotations

import pytest
import redis
import torch

from omnirl.transfer import TransferQueue
from omnirl.transfer._scripts import STAGED_MISSING
from omnirl.transfer.keys import done_key, image_key, staged_key, tensor_key

JOB = "staged"


def _payload(seed: int = 0) -> tuple[dict, dict[str, torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    meta = {"sample_id": f"0:0:{seed}", "kind": "train"}
    return meta, {"latents": torch.randn(3, 4, 16, 16, generator=g)}, torch.randint(0, 256, (16, 16, 3),
                                                                                     dtype=torch.uint8, generator=g)


def test_publish_renames_its_staged_payload_and_leaves_no_staged_key(redis_client: redis.Redis) -> None:
    q = TransferQueue(redis_client, JOB, tensor_ttl_s=600)
    redis_client.config_resetstat()
    meta, trajectory, image = _payload()
    assert q.publish(q.streams.samples, meta, trajectory, image=image, done_kind="rollout") is not None
    key = tensor_key(JOB, meta["sample_id"])
    stats = redis_client.info("commandstats")
    assert stats["cmdstat_rename"]["calls"] == 2  # trajectory and image moved, not copied
    assert stats["cmdstat_set"]["calls"] == 4  # the two staged payloads (plain SETs), the marker (token, then id)
    assert list(redis_client.scan_iter(f"omnirl:{JOB}:staged:*")) == []
    assert torch.equal(q.load_tensors(key)["latents"], trajectory["latents"]) and torch.equal(q.load_image(key), image)
    assert 0 < redis_client.pttl(key) <= 600_000 and 0 < redis_client.pttl(image_key(key)) <= 600_000

    # a duplicate writes nothing and deletes what it staged
    assert q.publish(q.streams.samples, meta, trajectory, image=image, done_kind="rollout") is None
    assert q.stream_length(q.streams.samples) == 1
    assert list(redis_client.scan_iter(f"omnirl:{JOB}:staged:*")) == []
    q.cleanup()


def test_a_staged_payload_that_is_gone_writes_nothing(redis_client: redis.Redis) -> None:
    q = TransferQueue(redis_client, JOB)
    meta, _, _ = _payload()
    key = tensor_key(JOB, meta["sample_id"])
    marker = done_key(JOB, "rollout", meta["sample_id"])
    # the script alone, as if Redis had lost the staged SET before it ran (restarted without persistence)
    with pytest.raises(redis.ResponseError, match=STAGED_MISSING):
        q._publish_script(keys=[q.streams.samples, key, staged_key(JOB, "t0", "t"), marker],
                          args=[b"m", "1", "1", "0", "1", 60_000, "0", "t0"])
    assert redis_client.exists(q.streams.samples, key, marker) == 0

    # publish stages again (once) and then succeeds: drop the staged keys the first time the script runs
    real = q._publish_script
    calls = []

    def losing(keys, args, client):
        if not calls:
            for k in keys:
                if ":staged:" in k:
                    client.unlink(k)
        calls.append(1)
        return real(keys=keys, args=args, client=client)

    q._publish_script = losing
    meta2, trajectory, image = _payload(1)
    assert q.publish(q.streams.samples, meta2, trajectory, image=image, done_kind="rollout") is not None
    assert len(calls) == 2 and q.stream_length(q.streams.samples) == 1
    assert torch.equal(q.load_image(tensor_key(JOB, meta2["sample_id"])), image)
    q.cleanup()

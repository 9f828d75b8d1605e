"""The TransferQueue overhead benchmark: byte accounting, exactly-once delivery, nothing left behind."""

from __future__ import annotations

import pytest
import torch
from benchmarks.transfer_overhead import (
    GROUP,
    JOB,
    MB,
    get_step,
    make_step_payload,
    measure_transfer_overhead,
    overhead_bound_bytes,
    put_step,
)

from omnirl.transfer import TransferQueue
from omnirl.transfer.codec import encode_meta, encode_tensors
from omnirl.transfer.keys import image_key, tensor_key

SAMPLES, WINDOW, LATENT = 8, 2, (4, 8, 8)
# per sample: image 8·8·3 B + x0 4·8·8·4 B + latents 3·256·4 B + log_probs 2·4 B + sigmas 3·4 B
RAW_PER_SAMPLE = 192 + 1024 + 3072 + 8 + 12


def test_payload_shapes_and_codec_overhead_bound() -> None:
    payload = make_step_payload(3, SAMPLES, WINDOW, LATENT)
    assert [m["sample_id"] for m, _ in payload] == [f"3:0:{i}" for i in range(8)]
    meta, tensors = payload[0]
    assert {k: (tuple(t.shape), t.dtype) for k, t in tensors.items()} == {
        "image": ((8, 8, 3), torch.uint8), "x0": ((4, 8, 8), torch.float32),
        "latents": ((3, 4, 8, 8), torch.float32), "log_probs": ((2,), torch.float32),
        "sigmas": ((3,), torch.float32)}
    assert sum(t.numel() * t.element_size() for t in tensors.values()) == RAW_PER_SAMPLE
    overhead = len(encode_tensors(tensors)) - RAW_PER_SAMPLE
    assert 8 < overhead <= overhead_bound_bytes(len(tensors))
    with pytest.raises(ValueError, match="latent_shape"):
        make_step_payload(0, 1, 1, (16, 64))


def test_measure_accounts_every_byte_and_sample() -> None:
    torch.set_num_threads(1)
    out = measure_transfer_overhead(SAMPLES, WINDOW, LATENT, repeats=2)

    assert out["delivered_per_step"] == [SAMPLES, SAMPLES]
    assert round(out["raw_tensor_mb_per_step"] * MB) == SAMPLES * RAW_PER_SAMPLE
    meta_bytes = sum(len(encode_meta(m)) for m, _ in make_step_payload(0, SAMPLES, WINDOW, LATENT))
    assert round(out["meta_mb_per_step"] * MB) == meta_bytes
    codec = round(out["transfer_mb_per_step"] * MB) - SAMPLES * RAW_PER_SAMPLE - meta_bytes
    assert SAMPLES * 16 < codec <= SAMPLES * (overhead_bound_bytes(4) + overhead_bound_bytes(1))  # trajectory + image
    assert len(out["total_seconds_all"]) == 2 and all(s > 0 for s in out["total_seconds_all"])
    assert out["total_seconds_all"] == [p + g for p, g in zip(out["put_seconds_all"], out["get_seconds_all"],
                                                               strict=True)]
    assert out["mb_per_s"] == pytest.approx(out["transfer_mb_per_step"] / out["transfer_seconds_per_step"])


def test_put_get_is_exactly_once_and_leaves_nothing(redis_client) -> None:
    queue = TransferQueue(redis_client, JOB)
    stream = queue.streams.samples
    queue.ensure_group(stream, GROUP)
    payload = make_step_payload(0, SAMPLES, WINDOW, LATENT)

    assert put_step(queue, payload)[1] == SAMPLES
    assert put_step(queue, payload)[1] == 0  # done:rollout markers: a re-put writes nothing
    assert queue.stream_length(stream) == SAMPLES
    seconds, received = get_step(queue, SAMPLES, timeout_s=10)

    assert seconds > 0
    assert sorted(received) == sorted(m["sample_id"] for m, _ in payload)
    for meta, tensors in payload:
        got = received[meta["sample_id"]]
        assert set(got) == set(tensors) and all(torch.equal(got[k], tensors[k]) for k in tensors)
    assert queue.consume(stream, GROUP, "actor-0", count=SAMPLES, block_ms=0) == []
    assert queue.pending_count(stream, GROUP) == 0 and queue.stream_length(stream) == 0
    keys = [tensor_key(JOB, m["sample_id"]) for m, _ in payload]
    assert redis_client.exists(*keys, *map(image_key, keys)) == 0
    with pytest.raises(RuntimeError, match="0 of 1 samples"):
        get_step(queue, 1, timeout_s=0.3)
    queue.cleanup()  # the done-markers stay until the job is cleaned up (the Redis is shared by the session)
    assert redis_client.keys(f"omnirl:{JOB}:*") == []

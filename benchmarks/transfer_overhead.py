"""TransferQueue overhead per RL step: one SD3.5 512² FlowGRPO step's trajectories through real Redis.

Run: ``python -m benchmarks.transfer_overhead [--samples 64] [--window 3] [--repeats 3]``

One step's payload is `samples` trajectories, each with the tensors the rollout service publishes
(`omnirl.rollout.service`): ``latents`` fp32 ``[W+1, 16, 64, 64]`` (the SDE window's inputs and
last output), ``log_probs`` fp32 ``[W]``, ``sigmas`` fp32 ``[W+1]``, ``x0`` fp32 ``[16, 64, 64]``
and ``image`` uint8 ``[64, 64, 3]`` (the latent preview of `benchmarks.gpu.model.BenchSD3Adapter`;
a VAE-decoded 512² image would add 0.79 MB), plus its `SampleMeta` (msgpack) with 63 prompt ids.

Timed per step, sequentially in one process over two Redis connections (no overlap, so the sum is
what a step pays if nothing hides it):

- put (rollout): `TransferQueue.publish(streams.samples, meta, trajectory, image=image, done_kind="rollout")`
  per sample — safetensors encode, the Lua append, the trajectory and image keys with their TTL, the
  done marker;
- get (reward + actor): `consume` until every sample arrived, `load_image` (the reward's GET) and
  `load_tensors` (the actor's GET, + safetensors decode), `ack` (XACK + trim) and `delete_tensors`.

Then, untimed, every decoded tensor is compared bit for bit with what was put, and the stream, its
pending list and the tensor keys are checked to be empty. MB are 10^6 bytes; the wire MB count the
stored safetensors bytes and the msgpack metadata (see `overhead_bound_bytes` for the codec's share).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from omnirl.api.messages import SampleMeta
from omnirl.transfer import TransferQueue, start_redis_server
from omnirl.transfer.codec import encode_meta
from omnirl.transfer.keys import image_key, tensor_key

MB = 1e6
JOB = "bench-transfer"
GROUP = "actor"
CONSUMER = "actor-0"
PROMPT_IDS = [20, 20, 20, *range(49_400, 49_420), *range(49_400, 49_420), *range(32_000, 32_020)]
"""An SD3 prompt's ids as `SD3Adapter.tokenize` lays them out: header [n_l, n_g, n_t5] + 3 × 20 tokens."""
HEADER_BYTES_PER_TENSOR = 128
"""Upper bound on one tensor's entry in the safetensors JSON header (name ≤ 16 chars, dtype, ≤ 4-dim
shape of ≤ 6 digits each, two ≤ 12-digit offsets, quotes and separators: < 110 bytes)."""


def overhead_bound_bytes(n_tensors: int) -> int:
    """Most bytes safetensors adds to one sample's raw tensor bytes.

    The format (safetensors README) is an 8-byte little-endian header length, a JSON header of one
    entry per tensor (≤ `HEADER_BYTES_PER_TENSOR` each, plus ``{}`` and commas), padded with spaces
    to a multiple of 8 (≤ 7 bytes), then the raw data. So overhead ≤ 8 + 2 + n·128 + 7.
    """
    return 8 + 2 + n_tensors * HEADER_BYTES_PER_TENSOR + 7


def make_step_payload(step: int, samples: int, window: int, latent_shape: tuple[int, int, int],
                      seed: int = 0) -> list[tuple[dict, dict[str, torch.Tensor]]]:
    """One step's trajectories: ``[(SampleMeta dict, tensors), ...]`` of length `samples`.

    Tensors (random, so incompressible): ``latents`` fp32 ``[window+1, C, H, W]``, ``log_probs`` fp32
    ``[window]``, ``sigmas`` fp32 ``[window+1]`` (decreasing in (0, 1]), ``x0`` fp32 ``[C, H, W]``,
    ``image`` uint8 ``[H, W, 3]``. Sample ids are ``{step}:{prompt}:{index}`` with groups of 8.

    Raises:
        ValueError: samples or window < 1, or a latent_shape that is not 3 positive ints.
    """
    if samples < 1 or window < 1:
        raise ValueError(f"samples ({samples}) and window ({window}) must be >= 1")
    if len(latent_shape) != 3 or min(latent_shape) < 1:
        raise ValueError(f"latent_shape={latent_shape!r}: expected (C, H, W) of positive ints, e.g. (16, 64, 64)")
    c, h, w = latent_shape
    gen = torch.Generator().manual_seed(seed + step)
    payload = []
    for i in range(samples):
        prompt = i // 8
        meta = SampleMeta(
            sample_id=f"{step}:{prompt}:{i % 8}", kind="train", step=step, group_id=f"{step}:{prompt}",
            prompt=f"a photo of a sign that says {prompt}", prompt_ids=PROMPT_IDS, policy_version=step,
            noise_level=0.7, sde_type="sde", worker="rollout-0", generated_at=time.time(), rollout_seconds=1.0,
        ).model_dump()
        tensors = {
            "image": torch.randint(0, 256, (h, w, 3), generator=gen, dtype=torch.uint8),
            "x0": torch.randn(c, h, w, generator=gen),
            "latents": torch.randn(window + 1, c, h, w, generator=gen),
            "log_probs": torch.randn(window, generator=gen),
            "sigmas": torch.linspace(1.0, 0.5, window + 1),
        }
        payload.append((meta, tensors))
    return payload


def put_step(queue: TransferQueue, payload: list[tuple[dict, dict[str, torch.Tensor]]]) -> tuple[float, int]:
    """Publish every sample as the rollout service does; returns (seconds, entries published).

    A sample whose ``done:rollout`` marker exists is not written again (exactly-once effect), so
    re-putting a payload publishes 0 entries.
    """
    t0 = time.perf_counter()
    published = sum(queue.publish(queue.streams.samples, meta, {k: t for k, t in tensors.items() if k != "image"},
                                  image=tensors["image"], done_kind="rollout") is not None
                    for meta, tensors in payload)
    return time.perf_counter() - t0, published


def get_step(queue: TransferQueue, expected: int, timeout_s: float = 60.0) -> tuple[float, dict[str, dict]]:
    """Consume, load (image and trajectory), ack and delete `expected` samples as the reward and the
    actor do; returns (seconds, sample_id → tensors, the image included).

    Raises:
        RuntimeError: a sample delivered twice, or fewer than `expected` within `timeout_s` (names counts).
    """
    stream = queue.streams.samples
    received: dict[str, dict] = {}
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    while len(received) < expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"get_step: {len(received)} of {expected} samples arrived within {timeout_s} s")
        msgs = queue.consume(stream, GROUP, CONSUMER, count=expected - len(received), block_ms=200)
        for msg in msgs:
            if msg.sample_id in received:
                raise RuntimeError(f"get_step: sample {msg.sample_id} delivered twice (entry {msg.id})")
            received[msg.sample_id] = {**queue.load_tensors(msg), "image": queue.load_image(msg)}
        queue.ack(stream, GROUP, [m.id for m in msgs])
        queue.delete_tensors([m.tensor_key for m in msgs if m.tensor_key is not None])
    return time.perf_counter() - t0, received


def _wire_bytes(queue: TransferQueue, payload: list[tuple[dict, dict]]) -> tuple[int, int]:
    """(stored safetensors bytes of trajectories and images, msgpack metadata bytes) of a published payload."""
    with queue.redis.pipeline(transaction=False) as pipe:
        for key in _keys(queue, payload):
            pipe.strlen(key)
        tensor_bytes = sum(pipe.execute())
    return tensor_bytes, sum(len(encode_meta(meta)) for meta, _ in payload)


def _keys(queue: TransferQueue, payload: list[tuple[dict, dict]]) -> list[str]:
    """The trajectory and image keys of a payload's samples."""
    keys = [tensor_key(queue.job, meta["sample_id"]) for meta, _ in payload]
    return keys + [image_key(key) for key in keys]


def _check_step(queue: TransferQueue, payload: list[tuple[dict, dict]], received: dict[str, dict]) -> None:
    """Every sample back bit for bit, nothing pending, stream trimmed, tensor keys gone; else RuntimeError."""
    for meta, tensors in payload:
        got = received[meta["sample_id"]]
        bad = [k for k in tensors if got.get(k) is None or not torch.equal(got[k], tensors[k])]
        if bad or set(got) != set(tensors):
            raise RuntimeError(f"sample {meta['sample_id']}: tensors {bad or sorted(set(got) ^ set(tensors))} "
                               "differ after the round trip")
    stream = queue.streams.samples
    left = (queue.pending_count(stream, GROUP), queue.stream_length(stream), queue.redis.exists(*_keys(queue, payload)))
    if left != (0, 0, 0):
        raise RuntimeError(f"after the step: pending={left[0]}, stream length={left[1]}, tensor keys={left[2]} "
                           "(all must be 0)")


def measure_transfer_overhead(samples: int = 64, window: int = 3, latent_shape: tuple[int, int, int] = (16, 64, 64),
                              repeats: int = 3, *, redis_url: str | None = None, timeout_s: float = 60.0) -> dict:
    """Time put (rollout) and get (actor) of one step's trajectories through the TransferQueue.

    Args:
        samples: trajectories per step (SD3.5 FlowGRPO: 64 = 8 prompts × group 8).
        window: SDE window length W (stochastic steps kept per trajectory).
        latent_shape: ``(C, H, W)`` of one latent (16, 64, 64 for 512² SD3.5).
        repeats: steps timed (≥ 1), each with fresh sample ids.
        redis_url: an existing Redis to use (its db is left with this job's keys removed); None
            starts an embedded ``redis-server`` (`omnirl.transfer.start_redis_server`) and stops it.
        timeout_s: bound on waiting for a step's samples in `get_step`.

    Returns:
        ``transfer_seconds_per_step`` (median put + get, s), ``put_seconds_per_step``,
        ``get_seconds_per_step`` (medians, s), ``transfer_mb_per_step`` (stored safetensors + msgpack
        metadata, 10^6 bytes), ``raw_tensor_mb_per_step`` (Σ numel × element size), ``meta_mb_per_step``,
        ``mb_per_s`` (transfer MB / transfer seconds), raw lists ``{put,get,total}_seconds_all``,
        ``delivered_per_step`` (distinct samples the actor got per step), and the inputs.

    Raises:
        ValueError: bad sizes (see `make_step_payload`) or repeats < 1.
        RuntimeError: a sample lost, duplicated, altered, or left behind (pending, stream, tensor key).
        RedisServerError: the embedded redis-server could not start.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    server = start_redis_server() if redis_url is None else None
    url = server.url if server is not None else redis_url
    rollout = TransferQueue.from_url(url, JOB, max_stream_length=max(10_000, 2 * samples))
    actor = TransferQueue.from_url(url, JOB)
    try:
        rollout.cleanup()
        actor.ensure_group(actor.streams.samples, GROUP)
        rows = [_one_step(rollout, actor, step, samples, window, latent_shape, timeout_s) for step in range(repeats)]
    finally:
        rollout.cleanup()
        rollout.close()
        actor.close()
        if server is not None:
            server.stop()
    total = [r["put_s"] + r["get_s"] for r in rows]
    wire = rows[0]["tensor_bytes"] + rows[0]["meta_bytes"]
    median = statistics.median(total)
    return {
        "transfer_seconds_per_step": median, "put_seconds_per_step": statistics.median(r["put_s"] for r in rows),
        "get_seconds_per_step": statistics.median(r["get_s"] for r in rows), "transfer_mb_per_step": wire / MB,
        "raw_tensor_mb_per_step": rows[0]["raw_bytes"] / MB, "meta_mb_per_step": rows[0]["meta_bytes"] / MB,
        "mb_per_s": wire / MB / median, "put_seconds_all": [r["put_s"] for r in rows],
        "get_seconds_all": [r["get_s"] for r in rows], "total_seconds_all": total,
        "delivered_per_step": [r["delivered"] for r in rows], "samples": samples, "window": window,
        "latent_shape": list(latent_shape), "repeats": repeats,
    }


def _one_step(rollout: TransferQueue, actor: TransferQueue, step: int, samples: int, window: int,
              latent_shape: tuple[int, int, int], timeout_s: float) -> dict:
    """Put, measure the stored bytes, get, check; returns the step's timings and byte counts."""
    payload = make_step_payload(step, samples, window, latent_shape)
    put_s, published = put_step(rollout, payload)
    if published != samples:
        raise RuntimeError(f"step {step}: {published} of {samples} samples published (done markers left over?)")
    tensor_bytes, meta_bytes = _wire_bytes(rollout, payload)
    get_s, received = get_step(actor, samples, timeout_s)
    _check_step(actor, payload, received)
    raw = sum(t.numel() * t.element_size() for _, tensors in payload for t in tensors.values())
    return {"put_s": put_s, "get_s": get_s, "tensor_bytes": tensor_bytes, "meta_bytes": meta_bytes,
            "raw_bytes": raw, "delivered": len(received)}


def main() -> None:
    """Print the per-step table and the summary as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--latent", type=int, nargs=3, default=[16, 64, 64], metavar=("C", "H", "W"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = measure_transfer_overhead(args.samples, args.window, tuple(args.latent), args.repeats)
    print(f"{out['samples']} samples × window {out['window']}, latents {out['latent_shape']} fp32: "
          f"{out['transfer_mb_per_step']:.2f} MB per step ({out['raw_tensor_mb_per_step']:.2f} MB raw tensors)")
    print(f"{'put s':>9}{'get s':>9}{'total s':>9}{'MB/s':>9}")
    for put_s, get_s, total in zip(out["put_seconds_all"], out["get_seconds_all"], out["total_seconds_all"],
                                   strict=True):
        print(f"{put_s:>9.4f}{get_s:>9.4f}{total:>9.4f}{out['transfer_mb_per_step'] / total:>9.1f}")
    print(f"median {out['transfer_seconds_per_step']:.4f} s per step, {out['mb_per_s']:.1f} MB/s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Measure the CPU-side constants the scale simulation needs and that no other benchmark records.

Run: ``python -m benchmarks.scale.measure [--out benchmarks/results]`` → ``<date>-cpu-scale-constants.json``.

- ``jpeg_s_per_image_512``: CPU seconds (``time.process_time``, one thread) of the JPEG
  compressibility scorer (`omnirl.reward.jpeg`, quality 95, the service's reward) per 512² image
  (a smooth gradient plus noise of σ 8, an image that compresses as generated ones do);
- ``ocr_s_per_frame_240x416``: CPU seconds of the OCR scorer (`omnirl.reward.ocr`, RapidOCR's
  recogniser on onnxruntime, one thread) per 240×416 frame, the Wan job's reward reads every 4th frame;
- ``store_rtt_s``: one request to a `torch.distributed.TCPStore` served by this process (the
  weight sync's store; the actor hosts it), median of ``check`` calls on loopback;
- ``controller_s_per_score``: the controller's CPU seconds per sample on a step's critical path (decode,
  validate and file the score; advantages, `TrainItem`s, the `TrainRequest` and the stored book at the
  hand-over), with the real classes (`controller_s_per_score`).

CPU seconds are what the work costs, not wall time, so a loaded host changes them less than wall
time (caches and frequency still move them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import date, timedelta
from pathlib import Path

import numpy as np


def _cpu_per_call(fn, repeats: int) -> float:
    fn()  # warm (lazy model load, allocator)
    t0 = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - t0) / repeats


def _image(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, w)[None, :, None] * np.ones((h, 1, 3))
    return np.clip(ramp + rng.normal(0, 8, (h, w, 3)), 0, 255).astype(np.uint8)


def controller_s_per_score(samples: int = 512, group: int = 8, repeats: int = 5) -> float:
    """CPU seconds the controller spends per sample of a step on its critical path: per score entry msgpack
    decode, `ScoreMeta` validation and filing into the step's `StepBook` (`controller/loop.py::_file_score`);
    then the hand-over (`_hand_over`): the group advantages, one `TrainItem` per sample, the `TrainRequest`
    encoded for the stream and, with the book, as JSON for ``kv:trainreqs``. Divided by `samples`."""
    import torch

    from omnirl.algorithms.advantages import group_advantages
    from omnirl.api.messages import GenerateRequest, SampleSeed, ScoreMeta, TrainItem, TrainRequest
    from omnirl.controller.groups import StepBook
    from omnirl.transfer.codec import decode_meta, encode_meta

    def one_step() -> None:
        book = StepBook(step=3)
        for g in range(samples // group):
            book.add(f"3:{g}", GenerateRequest(kind="train", step=3, group_id=f"3:{g}", prompt="a sign", prompt_ids=[1] * 63,
                                               samples=[SampleSeed(sample_id=f"3:{g}:{i}", seed=i) for i in range(group)],
                                               num_steps=10))
        wire = [encode_meta(ScoreMeta(sample_id=f"3:{k // group}:{k % group}", kind="train", step=3,
                                      group_id=f"3:{k // group}", policy_version=2, reward=0.5, rewards={"ocr": 0.5},
                                      generated_at=1.0, scored_at=2.0).model_dump()) for k in range(samples)]
        t0 = time.process_time()
        for k, data in enumerate(wire):
            book.entry_ids.append(f"{k}-0")
            book.record(ScoreMeta.model_validate(decode_meta(data)), f"omnirl:j:tensors:{k}")
        scores = [(key, sc) for key, grp in book.groups.items() for sc in grp.scores.values()]
        gids = {key: i for i, key in enumerate(book.groups)}
        adv = group_advantages(torch.tensor([sc.reward for _, sc in scores]),
                               torch.tensor([gids[key] for key, _ in scores]))
        items = [TrainItem(sample_id=sc.sample_id, group_id=key, prompt_ids=book.groups[key].request.prompt_ids,
                           advantage=a, tensor_key=book.groups[key].tensor_keys[sc.sample_id], noise_level=0.7,
                           sde_type="sde") for (key, sc), a in zip(scores, adv.advantages.tolist(), strict=True)]
        req = TrainRequest(step=3, policy_version=2, items=items, checkpoint=False, controller_state={})
        encode_meta(req.model_dump())
        json.dumps({"request": req.model_dump(), "book": book.to_json()})
        times.append(time.process_time() - t0)

    times: list[float] = []
    for _ in range(repeats):
        one_step()
    return statistics.median(times) / samples


def measure(repeats: int = 20) -> dict:
    """The constants above, with the host they were measured on."""
    import torch
    import torch.distributed as dist

    from omnirl.reward.jpeg import JPEGCompressibilityScorer
    from omnirl.reward.ocr import OCRScorer

    torch.set_num_threads(1)
    jpeg = JPEGCompressibilityScorer(95)
    img = _image(512, 512)[None]
    jpeg_s = _cpu_per_call(lambda: jpeg.score(img, ["p"], ["s"]), repeats)
    ocr = OCRScorer(threads=1)
    frames = np.stack([_image(240, 416, i) for i in range(4)])
    ocr_s = _cpu_per_call(lambda: ocr.score(frames, ['"12"'] * 4, [f"s{i}" for i in range(4)]), max(2, repeats // 4)) / 4
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", store.port, 1, False, timeout=timedelta(seconds=10))
    client.set("k", "v")
    rtts = []
    for _ in range(2000):
        t0 = time.perf_counter()
        client.check(["k"])
        rtts.append(time.perf_counter() - t0)
    return {"jpeg_s_per_image_512": jpeg_s, "ocr_s_per_frame_240x416": ocr_s,
            "controller_s_per_score": controller_s_per_score(),
            "store_rtt_s": statistics.median(rtts), "store_rtt_p90_s": float(np.percentile(rtts, 90)),
            "cpus": os.cpu_count(), "load_average": os.getloadavg()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--note", default="", help="about the machine, stored in the JSON")
    args = p.parse_args()
    result = {"date": str(date.today()), "command": "python -m benchmarks.scale.measure", "note": args.note,
              **measure()}
    path = Path(args.out) / f"{date.today()}-cpu-scale-constants.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

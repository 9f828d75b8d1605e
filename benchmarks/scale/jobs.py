"""The jobs the simulation runs, built from measured costs (`benchmarks/results/*.json`); every number
names its source here.

- **image**: SD3.5-Medium, 512², 10 denoising steps, FlowGRPO LoRA r32, window 3, compiled, cuDNN,
  512 images per step (64 prompts × 8, VeRL-Omni's Qwen-Image recipe's batch), JPEG reward on CPU.
  Rollout: the step-wise engine, uniform burst, 18.9 images/s on one H200 (``2026-12-03-nvidia-h200.json``
  ``rollout``); smaller batches: the eager batch curve of ``shared/references/gpu-baseline.md``
  (1 → 0.19, 4 → 0.81, ≥ 8 → 1 of batch 32's rate; compiled batches of 8–32 measured flat). Actor: LoRA
  bypass, compiled, 41.9 image-steps/s at micro-batch 8 (``2026-11-29-nvidia-h200.json`` ``actor``);
  micro-batch 4 at 0.65 of 8's rate (gpu-baseline.md, fwd + bwd 21.8 vs 33.6 image-steps/s), 1 at 0.2
  (extrapolated). FSDP gathers the 2.24 B frozen bf16 weights 3× per micro-step. Sync: the measured LoRA
  sync (47.8 MB) of ``sync_nccl_2gpu``.
- **video**: Wan2.1-T2V-1.3B, 33 × 240×416 (latent 9 × 30 × 52), 20 steps, CFG 4.5 (two forwards per
  step, in rollout and in training), FlowGRPO LoRA r32, window 3, 256 videos per step (VeRL-Omni's
  LTX-2 recipe: 32 prompts × 8), OCR of every 4th frame (9 frames) on CPU. No Wan run was measured
  here: rollout and actor times are the SD3 measurements scaled by FLOPs (`benchmarks.scale.flops`),
  i.e. the same achieved FLOP/s (Wan's head dim 128 runs attention faster, so this errs slow); the
  VAE decode of 33 frames is not counted.
- **cpu**: the built-in digits job (`examples/ocr-awm.yaml`, 64 samples per step) on this host, its
  per-role CPU seconds measured by `benchmarks.scale.cpu_runs` with one replica and one rank.

Redis: the load test (``<date>-cpu*-transfer-load.json``): CPU seconds per sample of the payload kind
(``img512`` for the image job, ``video33`` for the video job; ``tiny`` for metadata only).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.gpu.flops import sd3_forward_flops
from benchmarks.scale.comm import GLOO_LOOPBACK, WeightSync
from benchmarks.scale.flops import WAN_1_3B, wan_forward_flops, wan_lora_parameters, wan_parameters
from benchmarks.scale.model import Cluster, Job, Redis, interpolate

RESULTS = Path(__file__).resolve().parents[1] / "results"
ROLLOUT_EFF = ((1, 0.19), (4, 0.81), (8, 1.0))
"""Rollout batch efficiency (batch, fraction of full rate): gpu-baseline.md's eager curve 2.1 / 8.9 / 10.2–11.0
images/s at batch 1 / 4 / 8–32; compiled batches 8–32 measured 19.6 / 19.4 / 19.8 (flat)."""
MICRO_EFF = ((1, 0.2), (4, 0.65), (8, 1.0))
"""Actor micro-batch efficiency: gpu-baseline.md fwd + bwd 21.8 (batch 4) vs 33.6 (batch 8) image-steps/s;
batch 1 extrapolated."""
CFG_FORWARDS = 2
WINDOW = 3
GATHERS_PER_MICRO = 3
WAN_LATENT = (9, 30, 52)
WAN_STEPS = 20
WAN_FRAMES_SCORED = 9  # every 4th of 33
LORA_RANK = 32


def read(name: str) -> dict:
    """A results file by name.

    Raises:
        FileNotFoundError: naming the file and the command that writes it.
    """
    path = RESULTS / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the simulation's costs come from it (see benchmarks/README.md "
                                "for the command that writes it)")
    return json.loads(path.read_text())


def latest(suffix: str) -> tuple[str, dict]:
    """The newest ``<date>-<suffix>.json`` in benchmarks/results: (its name, its content).

    Raises:
        FileNotFoundError: none exists; the message names the suffix.
    """
    paths = sorted(RESULTS.glob(f"20*-{suffix}.json"))
    if not paths:
        raise FileNotFoundError(f"no benchmarks/results/<date>-{suffix}.json: run the benchmark that writes it "
                                f"(benchmarks/README.md)")
    return paths[-1].name, json.loads(paths[-1].read_text())


LOAD_TEST: list[str] = []
"""A load-test file name in benchmarks/results to use instead of the newest (``--load-test``)."""


def load_test(host: str = "gpu") -> tuple[str, dict]:
    """The transfer load test: `LOAD_TEST`'s file, else for a ``gpu`` host (the cluster the predictions are for) the
    newest ``<date>-cpu*-transfer-load.json`` (of one day's, ``cpu16-`` sorts after ``cpu-``: the run on the idle
    16-core device machine, where Redis, not its clients, saturated; docs/scale.md §1), and for ``this`` host (the
    `--check` runs made here) the newest ``<date>-cpu-transfer-load.json``, measured on this loaded 2-core host."""
    if LOAD_TEST:
        return LOAD_TEST[-1], read(LOAD_TEST[-1])
    return latest("cpu*-transfer-load" if host == "gpu" else "cpu-transfer-load")


def _kind_rows(data: dict, kind: str) -> list[dict]:
    rows = [r for r in data["rows"] if r["kind"] == kind and r["redis_cpu_s_per_sample"]]
    if not rows:
        raise ValueError(f"the load test has no rows of kind {kind!r}: run `python -m benchmarks.transfer_load "
                         f"--kinds {kind} --merge`")
    return rows


def redis_for(kind: str, host: str = "gpu") -> Redis:
    """Redis costs for samples of load-test kind `kind`.

    The per-sample command cost is the ``tiny`` kind's (metadata only), the per-byte cost the kind's own
    Redis CPU per sample beyond that, over its network bytes per sample; each the median over the kind's
    runs. The client's per-byte cost (encode or decode and the socket, in the role's process): on a
    ``gpu`` host the one-H200 service's measured load (`client_s_per_byte_gpu_host`); on ``this`` host
    the kind's median publish time at 1 × 1 over its bytes (the load test's own clients).

    Raises:
        ValueError: an unknown `host`, or a kind the load test has no rows of.
    """
    if host not in ("gpu", "this"):
        raise ValueError(f"host {host!r}: expected 'gpu' or 'this'")
    _, data = load_test(host)
    tiny = sorted(r["redis_cpu_s_per_sample"] for r in _kind_rows(data, "tiny"))
    s_sample = tiny[len(tiny) // 2]
    rows = _kind_rows(data, kind)
    per_byte = sorted((r["redis_cpu_s_per_sample"] - s_sample) / (r["redis_net_bytes"] / r["window_samples"])
                      for r in rows)
    s_byte = max(per_byte[len(per_byte) // 2], 0.0)
    if host == "gpu":
        client = client_s_per_byte_gpu_host()
    else:
        single = min(rows, key=lambda r: r["producers"])
        client = max(0.0, single["publish_p50_ms"] / 1000 / single["sample_bytes"])
    return Redis(s_per_sample=s_sample, s_per_byte=s_byte, client_s_per_byte=client)


def client_s_per_byte_gpu_host() -> float:
    """A role's own seconds per payload byte on the GPU host: the one-H200 service's actor load of one
    step's trajectories (``2026-12-01-nvidia-h200.json`` ``service_cudnn`` ``load``, 64 samples of the
    ``transfer_overhead`` payload, ``2026-11-29-nvidia-h200.json``) per byte. Redis's own share is in it
    too (counted twice where Redis's per-byte cost applies: a bound on the high side)."""
    load = read("2026-12-01-nvidia-h200.json")["service_cudnn"]["omnirl"]["load"]
    nbytes = read("2026-11-29-nvidia-h200.json")["transfer_overhead"]["transfer_mb_per_step"] * 1e6
    return load / nbytes


def _sample_bytes(kind: str) -> tuple[int, int]:
    _, data = load_test()
    row = _kind_rows(data, kind)[0]
    return row["trajectory_bytes"], row["media_bytes"]


def constants() -> dict:
    """``benchmarks.scale.measure``'s newest constants (JPEG, OCR, TCPStore round trip)."""
    return latest("cpu-scale-constants")[1]


def weight_sync(mode: str = "ring", one_gpu: bool = False, store_rtt_s: float | None = None) -> WeightSync:
    """The LoRA sync: fixed cost measured over NCCL on two H200s (over CUDA IPC on one with `one_gpu`);
    the actor's store round trip measured on loopback unless `store_rtt_s` is given."""
    fixed = (read("2026-12-01-nvidia-h200.json")["weight_sync_one_gpu"]["result"]["lora_sync_seconds"] if one_gpu
             else read("2026-11-29-nvidia-h200.json")["sync_nccl_2gpu"]["lora_sync_seconds"])
    rtt = constants()["store_rtt_s"] if store_rtt_s is None else store_rtt_s
    return WeightSync(fixed_s=fixed, store_rtt_s=rtt, mode=mode)


def controller_costs() -> tuple[float, float]:
    """(CPU s per sample, CPU s per step) of the controller on a step's critical path: per sample
    `benchmarks.scale.measure`'s ``controller_s_per_score`` (file the score; advantages, TrainItem,
    TrainRequest and the stored book at the hand-over); per step 0: the rest of its CPU (0.14–0.19 s per
    step in the CPU runs, ``<date>-cpu-scale-runs.json``) is the polling of its waits, spread over the step."""
    return constants()["controller_s_per_score"], 0.0


def _h200() -> dict:
    r03, r29 = read("2026-12-03-nvidia-h200.json"), read("2026-11-29-nvidia-h200.json")
    run = next(x for x in r03["rollout"]["runs"]
               if (x["workload"], x["batching"], x["arrival"]) == ("uniform", "stepwise", "burst"))
    actor = r29["actor"]["lora_bypass"]
    return {"images_per_s": run["images_per_second"], "image_steps_per_s": actor["compiled"]["image_steps_per_second"],
            "actor_flops_per_image_step": actor["flops_per_update"] / (actor["samples"] * actor["window"]),
            "params": r29["actor"]["full_bypass"]["trainable_parameters"], "lora_bytes": r29["sync"]["lora_payload_mb"] * 1e6,
            "sd3_config": r29["model_config"], "text_tokens": r29["text_tokens"]}


def image_job(samples_per_step: int = 512, reward_threads: int = 8) -> Job:
    """The SD3.5-M 512² job (module docstring)."""
    h = _h200()
    traj, media = _sample_bytes("img512")
    per_sample, per_step = controller_costs()
    return Job(
        name="image SD3.5-M 512²", samples_per_step=samples_per_step, group=8,
        rollout_s_per_sample=1 / h["images_per_s"], rollout_eff=ROLLOUT_EFF, max_batch=32,
        trajectory_bytes=traj, media_bytes=media,
        reward_s_per_sample=constants()["jpeg_s_per_image_512"], reward_batch=16, reward_threads=reward_threads,
        train_s_per_sample=WINDOW / h["image_steps_per_s"], micro_batch=8, micro_eff=MICRO_EFF, window=WINDOW,
        model_bytes=2 * h["params"], gathers_per_micro=GATHERS_PER_MICRO, sync_bytes=h["lora_bytes"],
        controller_s_per_sample=per_sample, controller_s_per_step=per_step)


def video_job(samples_per_step: int = 256, reward_threads: int = 8) -> Job:
    """The Wan2.1-1.3B 33 × 240×416 job (module docstring): SD3's achieved FLOP/s applied to Wan's FLOPs."""
    h = _h200()
    sd3 = sd3_forward_flops(h["sd3_config"], (64, 64), h["text_tokens"])
    wan = wan_forward_flops(WAN_1_3B, WAN_LATENT)
    rollout_flops_per_s = h["images_per_s"] * 10 * sd3  # the SD3 engine: 10 forwards per image
    actor_flops_per_s = h["image_steps_per_s"] * h["actor_flops_per_image_step"]
    traj, media = _sample_bytes("video33")
    per_sample, per_step = controller_costs()
    return Job(
        name="video Wan2.1-1.3B 33×240×416", samples_per_step=samples_per_step, group=8,
        rollout_s_per_sample=WAN_STEPS * CFG_FORWARDS * wan / rollout_flops_per_s,
        rollout_eff=tuple((b * 1357 / (wan_tokens_per_sample() + 512), e) for b, e in ROLLOUT_EFF),
        max_batch=8, trajectory_bytes=traj, media_bytes=media,
        reward_s_per_sample=WAN_FRAMES_SCORED * constants()["ocr_s_per_frame_240x416"], reward_batch=4,
        reward_threads=reward_threads,
        train_s_per_sample=WINDOW * CFG_FORWARDS * wan * (h["actor_flops_per_image_step"] / sd3) / actor_flops_per_s,
        micro_batch=2, micro_eff=tuple((b * 1357 / (wan_tokens_per_sample() + 512), e) for b, e in MICRO_EFF),
        window=WINDOW, model_bytes=2 * wan_parameters(WAN_1_3B), gathers_per_micro=GATHERS_PER_MICRO,
        sync_bytes=2 * wan_lora_parameters(WAN_1_3B, LORA_RANK),
        controller_s_per_sample=per_sample, controller_s_per_step=per_step)


def wan_tokens_per_sample() -> int:
    """Video tokens of one 33 × 240×416 sample (9 × 15 × 26)."""
    t, h, w = WAN_LATENT
    return t * (h // 2) * (w // 2)


def cpu_job(row: dict, samples_per_step: int = 64) -> Job:
    """The digits job from the CPU seconds per step of each role in `row` (a `cpu_runs` row, one replica,
    one rank): rollout and reward per sample, actor per sample, controller per step."""
    cpu = row["cpu_s_per_step"]
    n = row["samples_per_step"]

    def role(prefix: str) -> float:
        return sum(v for k, v in cpu.items() if k.startswith(prefix))

    return Job(
        name="cpu digits (ocr-awm)", samples_per_step=samples_per_step, group=8,
        rollout_s_per_sample=role("rollout") / n, rollout_eff=((1, 1.0),), max_batch=64,
        trajectory_bytes=4 * 4 * 16 * 16, media_bytes=3 * 64 * 64,
        reward_s_per_sample=role("reward") / n, reward_batch=64, reward_threads=1,
        train_s_per_sample=role("actor") / n, micro_batch=16, micro_eff=((1, 1.0),), window=1,
        model_bytes=4 * 1.0e6, gathers_per_micro=GATHERS_PER_MICRO, sync_bytes=4 * 1.0e6,
        controller_s_per_sample=0.0, controller_s_per_step=role("controller") / 2)


def cpu_cluster(rollout: int, actor: int, background_cores: float, cores: int = 2) -> Cluster:
    """This host: `cores` cores, `background_cores` of them used by other programs (taken away)."""
    return Cluster(devices=rollout + actor, rollout=rollout, actor=actor, reward_workers=1,
                   cpu_cores=max(cores - background_cores, 0.25), fabric=GLOO_LOOPBACK)


def gpu_split(gpus: int, job: Job, mode: str) -> tuple[int, int]:
    """(rollout replicas, actor ranks) for `gpus` split devices: the split a user would pick, the one with
    the shortest compute per step by a first-order estimate (no queueing).

    Rollout: the step's groups spread evenly, ⌈groups / R⌉ groups per replica at its batch's efficiency;
    training: ⌈samples / A⌉ per rank in micro-batches. ``fully-async`` overlaps the two (the step is the
    slower side), the other modes add them. At least one of each.
    """
    groups = math.ceil(job.samples_per_step / job.group)

    def rollout_s(r: int) -> float:
        per = math.ceil(groups / r) * job.group
        batches = math.ceil(per / job.max_batch)
        return sum(job.batch_s(min(job.max_batch, per - b * job.max_batch)) for b in range(batches))

    def train_s(a: int) -> float:
        share = math.ceil(job.samples_per_step / a)
        m = min(job.micro_batch, share)
        return math.ceil(share / m) * m * job.train_s_per_sample / interpolate(job.micro_eff, m)

    def step_s(r: int) -> float:
        ro, tr = rollout_s(r), train_s(gpus - r)
        return max(ro, tr) if mode == "fully-async" else ro + tr

    best = min(range(1, gpus), key=lambda r: (step_s(r), -r))
    return best, gpus - best

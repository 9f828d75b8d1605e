"""`python -m benchmarks.scale`: predicted step time, throughput, scaling efficiency and bottleneck of
the image and video jobs from 8 to 1,024 GPUs in each pipeline mode, and the check against what ran.

    python -m benchmarks.scale                 # the tables (strong scaling: the recipes' fixed batch)
    python -m benchmarks.scale --weak          # weak scaling: samples per step grow with the GPUs
    python -m benchmarks.scale --check         # predictions vs the CPU runs and the one-GPU service
    python -m benchmarks.scale --what-if       # the image job at 64 GPUs with the changes docs/scale.md weighs
    python -m benchmarks.scale --json FILE     # also write every row as JSON

Efficiency at G GPUs = (samples/s per GPU at G) / (samples/s per GPU at 8), same job, mode and
placement rules. GPUs are split between rollout replicas and actor ranks (`jobs.gpu_split`: the split
with the least compute per step), one reward worker (CPU pod, 8 threads) per 8 GPUs. Costs:
`benchmarks.scale.jobs`.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.scale import jobs
from benchmarks.scale.comm import WeightSync
from benchmarks.scale.model import MODES, Cluster, Job, Redis, Result, Simulation

GPUS = (8, 64, 512, 1024)


def simulate(job: Job, gpus: int, mode: str, redis: Redis, sync: WeightSync | None = None,
             **cluster: object) -> Result:
    """One job on `gpus` split GPUs in `mode` (`sync`: default the measured ring sync; `cluster`: more
    `Cluster` fields, e.g. ``admission="greedy"``, the rollout role's before fair admission). Four steps, the first not measured; fully-async runs six and leaves
    out three (its pipeline fills over two steps, and a Redis backlog carries over)."""
    rollout, actor = jobs.gpu_split(gpus, job, mode)
    cluster = Cluster(devices=gpus, rollout=rollout, actor=actor, reward_workers=max(1, gpus // 8), **cluster)
    steps, warmup = (6, 3) if mode == "fully-async" else (4, 1)
    result = Simulation(job, cluster, redis, sync or jobs.weight_sync(), mode, steps=steps, warmup=warmup).run()
    result.extra.update(rollout=rollout, actor=actor)
    return result


def table(name: str, job_of, kind: str, weak: bool) -> list[dict]:
    """Rows of one job over `GPUS` × `MODES`; prints them."""
    redis = jobs.redis_for(kind)
    rows = []
    print(f"\n{name} ({'weak' if weak else 'strong'} scaling)")
    print(f"{'mode':13} {'GPUs':>5} {'R+A':>9} {'samples':>7} {'step s':>8} {'samples/s':>9} {'/GPU/s':>7} "
          f"{'eff':>5} {'busy':>5} {'redis':>6} {'bottleneck':>11}")
    for mode in MODES:
        base = None
        for g in GPUS:
            job = job_of(g)
            r = simulate(job, g, mode, redis)
            per_gpu = r.samples_per_s / g
            base = per_gpu if base is None else base
            row = {"job": name, "mode": mode, "gpus": g, "samples_per_step": job.samples_per_step,
                   "rollout": r.extra["rollout"], "actor": r.extra["actor"], "step_s": r.step_s,
                   "samples_per_s": r.samples_per_s, "per_gpu": per_gpu, "efficiency": per_gpu / base, "busy": r.busy,
                   "redis_util": r.redis_util, "controller_util": r.controller_util, "phases": r.phases,
                   "bottleneck": r.bottleneck}
            rows.append(row)
            print(f"{mode:13} {g:>5} {str(row['rollout']) + '+' + str(row['actor']):>9} {job.samples_per_step:>7} "
                  f"{r.step_s:8.2f} {r.samples_per_s:9.1f} {per_gpu:7.3f} {per_gpu / base:5.2f} {r.busy:5.2f} "
                  f"{r.redis_util:6.2f} {r.bottleneck:>11}")
    return rows


def redis_capacity() -> list[dict]:
    """GPUs one Redis (one core) carries per job and mode: Redis's samples/s at 100% of its core over the
    samples/s one GPU asks of it (the 8-GPU run's throughput / 8), payloads in Redis or by reference."""
    rows = []
    print("\nGPUs one Redis carries (its core at 100%; demand = the 8-GPU run's samples/s per GPU)")
    print(f"{'job':7} {'payload':14} {'ms Redis/sample':>15} {'samples/s':>9} " + " ".join(f"{m:>13}" for m in MODES))
    for name, job, kind in (("image", jobs.image_job(), "img512"), ("video", jobs.video_job(), "video33")):
        redis = jobs.redis_for(kind)
        meta = replace(jobs.redis_for("tiny"), client_s_per_byte=redis.client_s_per_byte, by_reference=True)
        demand = {m: simulate(job, 8, m, redis).samples_per_s / 8 for m in MODES}
        for label, rc in (("in Redis", redis), ("by reference", meta)):
            per_sample = rc.publish_s(job) + rc.reward_s(job) + rc.actor_s(job)
            gpus = {m: 1 / per_sample / demand[m] for m in MODES}
            rows.append({"job": name, "payload": label, "redis_s_per_sample": per_sample,
                         "samples_per_s": 1 / per_sample, "demand_per_gpu": demand, "gpus": gpus})
            print(f"{name:7} {label:14} {per_sample * 1e3:15.2f} {1 / per_sample:9.0f} "
                  + " ".join(f"{gpus[m]:13.0f}" for m in MODES))
    return rows


def check() -> list[dict]:
    """Predictions of the CPU runs (calibrated on the 1 × 1 run) and of the one-GPU service vs measured."""
    name, runs = jobs.latest("cpu-scale-runs")
    base = next(r for r in runs["rows"] if (r["rollout"], r["actor"]) == (1, 1))
    job = jobs.cpu_job(base)
    redis = jobs.redis_for("tiny", host="this")
    sync = replace(jobs.weight_sync(), fixed_s=base["phases"]["sync"], fabric=jobs.GLOO_LOOPBACK)
    rows = []
    print(f"\nCPU job (digits, 64 samples/step; {name}; calibrated on the 1x1 run's CPU seconds per role)")
    print(f"{'R x A':>6} {'bg cores':>8} {'measured s':>10} {'predicted s':>11} {'error':>7}")
    for r in runs["rows"]:
        # measured before fair admission (the rollout role took consume(count=4) whenever it had room): greedy
        cluster = replace(jobs.cpu_cluster(r["rollout"], r["actor"], r["background_cores"], runs["cpus"]),
                          admission="greedy")
        pred = Simulation(job, cluster, redis, sync, "async-reward", steps=4).run()
        err = pred.step_s / r["step_seconds"] - 1
        rows.append({"case": f"cpu {r['rollout']}x{r['actor']}", "measured_s": r["step_seconds"],
                     "predicted_s": pred.step_s, "error": err, "background_cores": r["background_cores"],
                     "predicted_phases": pred.phases, "measured_phases": r["phases"]})
        print(f"{str(r['rollout']) + 'x' + str(r['actor']):>6} {r['background_cores']:8.2f} {r['step_seconds']:10.2f} "
              f"{pred.step_s:11.2f} {err:+7.1%}")
    service = replace(jobs.image_job(64, reward_threads=11), trajectory_bytes=1_323_000, media_bytes=12_400)
    one = Cluster(devices=1, rollout=1, actor=1, reward_workers=1, placement="colocated",
                  admission="greedy")  # measured before fair admission (one replica: the same either way)
    pred = Simulation(service, one, jobs.redis_for("img512"), jobs.weight_sync(one_gpu=True), "async-reward").run()
    print("\none-GPU service (SD3.5-M 512², 64 images, async-reward, rollout and actor sharing one H200)")
    print(f"{'measured':>32} {'s':>6} {'predicted s':>11} {'error':>7}")
    h01 = jobs.read("2026-12-01-nvidia-h200.json")
    for label, measured in (("service, cuDNN (2026-12-01)", h01["service_cudnn"]["omnirl"]["step_seconds"]),
                            ("service, FA2 (2026-12-01)", h01["service"]["omnirl"]["step_seconds"]),
                            ("gpu-baseline.md, gloo sync", 10.17)):
        err = pred.step_s / measured - 1
        rows.append({"case": label, "measured_s": measured, "predicted_s": pred.step_s, "error": err,
                     "predicted_phases": pred.phases})
        print(f"{label:>32} {measured:6.2f} {pred.step_s:11.2f} {err:+7.1%}")
    print("predicted phases (s): " + ", ".join(f"{k} {v:.2f}" for k, v in pred.phases.items()))
    return rows


SYNC_TARGET_S = 0.05
"""A weight sync of the LoRA adapters without its per-sync protocol cost (manifest built and checked once,
checksums on the device in one pass): 48 MB over NVLink is < 1 ms; not measured."""
STORAGE_BPS = 2e9
"""A shared PVC served by one NFS server on 25 GbE (3.1 GB/s line rate): an assumption for the what-if;
parallel file systems give tens of GB/s."""


def what_if(gpus: int = 64, before: str | None = None) -> list[dict]:
    """The image job at `gpus` GPUs in each mode, one change after another (cumulative), each against the
    same changes at 8 GPUs. `before`: a load-test file of the publish before this branch (payload as Lua
    arguments), for the first line."""
    job = jobs.image_job()
    redis = jobs.redis_for("img512")
    by_ref = replace(jobs.redis_for("tiny"), client_s_per_byte=redis.client_s_per_byte, by_reference=True)
    ring, batched = jobs.weight_sync(), jobs.weight_sync("ring-batched")
    cases = []
    greedy, fair = {"admission": "greedy"}, {"admission": "fair"}  # the rollout role's before / since issue #35
    if before:
        jobs.LOAD_TEST.append(before)
        cases.append(("publish with the payload as Lua arguments", jobs.redis_for("img512"), ring, greedy))
        jobs.LOAD_TEST.pop()
    cases += [
        ("payload staged by SET, renamed by the script", redis, ring, greedy),
        ("+ fair admission of groups to replicas (done)", redis, ring, fair),
        (f"+ payloads by reference on a {STORAGE_BPS / 1e9:g} GB/s PVC", replace(by_ref, storage_bps=STORAGE_BPS),
         ring, fair),
        ("+ unbounded storage instead", by_ref, ring, fair),
        ("+ weight-sync store requests batched", by_ref, batched, fair),
        (f"+ weight sync fixed cost {SYNC_TARGET_S:g} s (a target)", by_ref, replace(batched, fixed_s=SYNC_TARGET_S),
         fair),
    ]
    rows = []
    print(f"\nimage job (512 images per step) at {gpus} GPUs vs 8, the changes one after another")
    print(f"{'change':48} {'mode':13} {'step 8':>7} {'step ' + str(gpus):>7} {'eff':>5} {'busy':>5} {'redis':>6} "
          f"{'bottleneck':>11}")
    for mode in MODES:
        for label, rc, sync, kw in cases:
            base = simulate(job, 8, mode, rc, sync, **kw)
            r = simulate(job, gpus, mode, rc, sync, **kw)
            eff = (r.samples_per_s / gpus) / (base.samples_per_s / 8)
            rows.append({"change": label, "mode": mode, "gpus": gpus, "step_s": r.step_s, "step_s_8": base.step_s,
                         "efficiency": eff, "busy": r.busy, "redis_util": r.redis_util, "bottleneck": r.bottleneck,
                         "phases": r.phases})
            print(f"{label:48} {mode:13} {base.step_s:7.2f} {r.step_s:7.2f} {eff:5.2f} {r.busy:5.2f} "
                  f"{r.redis_util:6.2f} {r.bottleneck:>11}  " + " ".join(f"{k} {v:.2f}" for k, v in r.phases.items()))
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weak", action="store_true", help="samples per step grow with the GPUs (from the 8-GPU batch)")
    p.add_argument("--check", action="store_true", help="only the predictions of what ran here vs the measurements")
    p.add_argument("--what-if", action="store_true", help="only the image job at 64 GPUs with the changes")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--load-test", default=None, help="a <date>-...-transfer-load.json in benchmarks/results to use "
                   "instead of the newest <date>-cpu*-transfer-load.json")
    p.add_argument("--before", default=None, help="with --what-if: the load test of the publish before the staged "
                   "payload (first line of the table)")
    args = p.parse_args(argv)
    if args.load_test:
        jobs.LOAD_TEST.append(args.load_test)
    out: dict = {}
    if args.check:
        out["check"] = check()
    elif args.what_if:
        out["what_if"] = what_if(before=args.before)
    else:
        image_n, video_n = 512, 256
        scale = (lambda g: g // 8) if args.weak else (lambda g: 1)
        out["image"] = table("image job: SD3.5-M 512², FlowGRPO LoRA", lambda g: jobs.image_job(image_n * scale(g)),
                             "img512", args.weak)
        out["video"] = table("video job: Wan2.1-1.3B 33×240×416, FlowGRPO LoRA",
                             lambda g: jobs.video_job(video_n * scale(g)), "video33", args.weak)
        out["redis_capacity"] = redis_capacity()
        out["costs"] = {"image": asdict(jobs.image_job(image_n)), "video": asdict(jobs.video_job(video_n)),
                        "redis_img512": asdict(jobs.redis_for("img512")), "redis_video33": asdict(jobs.redis_for("video33"))}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()

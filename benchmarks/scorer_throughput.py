"""OCR scorer throughput (images/s): in-process, over the HTTP/JSON twin and over gRPC.

Run: ``python -m benchmarks.scorer_throughput [--images 256] [--batch 64] [--repeats 3] [--threads 1]``

Images are the demo task's (32×128 rendered digits, `omnirl.models.digits.render`), scored with
their prompts in batches of `--batch`. In-process calls `OCRScorer.score`; the remote paths start
`omnirl scorer serve --reward ocr` as its own process on the loopback interface and time our client
(`GRPCScorer` / `HTTPScorer`): PNG encoding, the request, decoding on the server, the same OCR
model, and the answer. One warm-up batch per path is not timed; the paths take turns for
`--repeats` passes (so a busy moment of the shared machine hits each) and the median is reported.
CPU ms/image adds this process's CPU time and the server's (/proc), which a loaded machine
distorts less than wall time. Every remote score is checked equal to the in-process one. On the
shared 2-core machine the numbers are approximate: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np

from omnirl.models.digits.render import render_text
from omnirl.reward.ocr import OCRScorer
from omnirl.reward.remote import GRPCScorer, HTTPScorer

RESULTS = Path(__file__).resolve().parent / "results"


def digit_images(n: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """`[n, 32, 128, 3]` uint8 rendered numbers (1–8 digits) and their prompts."""
    rng = np.random.default_rng(seed)
    numbers = [str(rng.integers(0, 10 ** int(rng.integers(1, 9)))) for _ in range(n)]
    images = np.stack([np.repeat(render_text(s, 8, rng)[..., None], 3, axis=-1) for s in numbers])
    return images, [f'A sign that says "{s}"' for s in numbers]


def server_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


Score = Callable[[np.ndarray, list[str], list[str]], np.ndarray]


def one_pass(score: Score, images: np.ndarray, prompts: list[str], batch: int,
             server_pid: int | None) -> tuple[float, float, np.ndarray]:
    """(wall seconds, CPU seconds of this process plus the server's, rewards) of one pass over every image."""
    ids = [f"0:{i}:0" for i in range(len(prompts))]
    server0 = server_cpu_s(server_pid) if server_pid else 0.0
    cpu0, start = time.process_time(), time.perf_counter()
    rewards = [score(images[i : i + batch], prompts[i : i + batch], ids[i : i + batch])
               for i in range(0, len(prompts), batch)]
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0 + (server_cpu_s(server_pid) - server0 if server_pid else 0.0)
    return wall, cpu, np.concatenate(rewards)


def start_server(protocol: str, threads: int) -> tuple[subprocess.Popen, int]:
    """An `omnirl scorer serve --reward ocr` process on 127.0.0.1 and its port."""
    proc = subprocess.Popen([sys.executable, "-m", "omnirl.cli", "scorer", "serve", "--reward", "ocr", "--protocol",
                             protocol, "--host", "127.0.0.1", "--port", "0", "--param", f"threads={threads}"],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        proc.kill()
        raise RuntimeError(f"omnirl scorer serve did not start: {line!r}")
    return proc, int(line.rsplit(":", 1)[1])


def measure(images: np.ndarray, prompts: list[str], batch: int, repeats: int,
            threads: int) -> dict[str, list[tuple[float, float, np.ndarray]]]:
    """Passes of each path (in-process, http, grpc), taking turns; servers are stopped afterwards."""
    servers = {protocol: start_server(protocol, threads) for protocol in ("http", "grpc")}
    try:
        (http_proc, http_port), (grpc_proc, grpc_port) = servers["http"], servers["grpc"]
        paths: dict[str, tuple[Score, int | None]] = {
            "in-process": (OCRScorer(threads=threads).score, None),
            "http": (HTTPScorer("ocr", f"http://127.0.0.1:{http_port}/v1/score", max_retries=0).score, http_proc.pid),
            "grpc": (GRPCScorer("ocr", f"127.0.0.1:{grpc_port}", max_retries=0).score, grpc_proc.pid),
        }
        for score, _ in paths.values():  # warm-up: connections, onnxruntime arenas
            score(images[:batch], prompts[:batch], [f"w{i}" for i in range(min(batch, len(prompts)))])
        runs: dict[str, list[tuple[float, float, np.ndarray]]] = {name: [] for name in paths}
        for _ in range(repeats):
            for name, (score, pid) in paths.items():
                runs[name].append(one_pass(score, images, prompts, batch, pid))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    reference = runs["in-process"][0][2]
    for name, passes in runs.items():
        if any(r.tolist() != reference.tolist() for _, _, r in passes):
            raise AssertionError(f"{name} rewards differ from in-process ones")
    return runs


def main(argv: list[str] | None = None) -> int:
    """Print the table and write `benchmarks/results/<date>-cpu-scorer-throughput.json`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="onnxruntime threads of the OCR model (each path)")
    args = p.parse_args(argv)
    images, prompts = digit_images(args.images)
    runs = measure(images, prompts, args.batch, args.repeats, args.threads)
    load = os.getloadavg()[0]  # the machine is shared: say how busy it was
    print(f"OCR scorer throughput: {args.images} images 32x128, batches of {args.batch}, onnxruntime threads "
          f"{args.threads}, median of {args.repeats} passes, load average {load:.1f} on {os.cpu_count()} cores")
    print(f"{'path':<12} {'images/s':>10} {'ms/batch':>10} {'CPU ms/image':>13} {'vs in-process':>14}")
    result = {"images": args.images, "batch": args.batch, "threads": args.threads, "load_average": round(load, 1),
              "cpus": os.cpu_count(), "paths": {}}
    base = statistics.median(w for w, _, _ in runs["in-process"])
    for name, passes in runs.items():
        wall = statistics.median(w for w, _, _ in passes)
        cpu_ms = 1000 * statistics.median(c for _, c, _ in passes) / args.images
        per_s, ms_batch = args.images / wall, 1000 * wall / -(-args.images // args.batch)
        print(f"{name:<12} {per_s:>10.1f} {ms_batch:>10.1f} {cpu_ms:>13.2f} {base / wall:>13.2f}x")
        result["paths"][name] = {"images_per_s": round(per_s, 1), "ms_per_batch": round(ms_batch, 1),
                                 "cpu_ms_per_image": round(cpu_ms, 2)}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{date.today().isoformat()}-cpu-scorer-throughput.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

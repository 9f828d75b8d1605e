"""The TransferQueue load test: its quick mode delivers every sample exactly once through real processes."""

from __future__ import annotations

import pytest
from benchmarks.transfer_load import check_delivery, fit_calibration, main
from benchmarks.transfer_load_payloads import KINDS, make_sample, stored_bytes


def test_quick_mode_scores_and_trains_every_published_sample_exactly_once() -> None:
    result = main(["--quick"])

    (row,) = result["rows"]
    c = row["check"]
    assert (row["kind"], row["producers"], row["consumers"], row["actors"]) == ("tiny", 2, 2, 1)
    assert c["published"] > 0 and c["published"] % 8 == 0  # whole groups of 8
    assert c["scored"] == c["trained"] == c["published"]
    assert (c["lost"], c["duplicated"], c["unknown"]) == (0, 0, 0)
    assert c["left"] == {"pending": {"requests": 0, "samples": 0, "scores": 0, "control": 0}, "tensor_keys": 0}
    assert c["abandoned"] > 0 and c["redelivered"] >= c["abandoned"]  # every abandoned batch was reclaimed
    assert row["sample_bytes"] == sum(stored_bytes(KINDS["tiny"]))
    assert row["window_samples"] > 0 and row["redis_cpu_s"] > 0 and row["redis_memory_peak_mb"] > 0
    assert row["commands"]["xautoclaim"]["calls"] > 0 and row["commands"]["evalsha"]["calls"] > 0
    check_delivery(row)


def test_check_delivery_names_lost_duplicated_and_left_over_samples() -> None:
    row = {"kind": "tiny", "producers": 1, "consumers": 1, "check": {
        "published": 8, "lost": 1, "duplicated": 2, "unknown": 0,
        "left": {"pending": {"samples": 1}, "tensor_keys": 3}}}
    with pytest.raises(RuntimeError, match="lost 1, duplicated 2"):
        check_delivery(row)


def test_payload_sizes_are_the_models_shapes() -> None:
    trajectory, media = make_sample(KINDS["video33"], window=3)
    assert trajectory["latents"].shape == (4, 16, 9, 30, 52) and media.shape == (33, 240, 416, 3)
    # 512²: x0 + 4 latents of 16·64·64 fp32, 3 log-probs, 4 σ, a 512²·3 uint8 image
    assert KINDS["img512"].raw_bytes(3) == 4 * (16 * 64 * 64 * 5 + 3 + 4) + 512 * 512 * 3
    traj, img = stored_bytes(KINDS["img512"])
    assert 0 < traj + img - KINDS["img512"].raw_bytes(3) < 1024  # safetensors headers only


def test_calibration_recovers_a_linear_cost() -> None:
    s_sample, s_byte = 40e-6, 0.25e-9
    rows = [{"window_samples": n, "redis_net_bytes": b, "redis_cpu_s": s_sample * n + s_byte * b}
            for n, b in ((100, 1e6), (500, 4e9), (2000, 1e8), (50, 2e9))]
    fit = fit_calibration(rows)
    assert fit["s_per_sample"] == pytest.approx(s_sample) and fit["s_per_byte"] == pytest.approx(s_byte)
    assert fit["r2"] == pytest.approx(1.0) and fit["runs"] == 4

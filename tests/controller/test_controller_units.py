"""Controller pieces without processes: prompt order and resume, group refills, the reward table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnirl.api.messages import GenerateRequest, SampleSeed, ScoreMeta
from omnirl.controller.data import PromptSource, read_prompts
from omnirl.controller.groups import StepBook, refill_request
from omnirl.controller.report import step_line
from omnirl.launch.progress import validation_table


def source(position=(0, 0)) -> PromptSource:
    return PromptSource([f'"{i}"' for i in range(5)], lambda t: [ord(c) for c in t], seed=3, position=position)


def test_prompt_order_is_seeded_and_resumes_at_the_saved_position():
    a = source()
    first = [p.index for p in a.draw(7)]  # crosses into epoch 1
    assert sorted(first[:5]) == [0, 1, 2, 3, 4] and a.position == (1, 2)
    rest = [p.index for p in a.draw(6)]
    b = source(position=(1, 2))
    assert [p.index for p in b.draw(6)] == rest
    assert [p.index for p in source().draw(7)] == first
    assert a.prompts[0].ids == [ord(c) for c in '"0"']  # tokenized once, ids kept


def test_read_prompts_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="trainPrompts"):
        read_prompts(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="no prompts"):
        read_prompts(tmp_path / "empty.txt")


def test_prompt_lines_are_numbered_as_an_editor_numbers_them(tmp_path):
    """A prompt file is split at "\n" only: a form feed or U+2028 inside a line split it (one prompt became
    two, and `omnirl run` named "line 3" for what `grep -n` shows on line 2); a UTF-8 byte-order mark is
    not part of the first prompt; a byte that is not UTF-8 is named by its line, not its byte offset
    ("position 975" in a 1024-line file)."""
    from omnirl.controller.data import check_prompts, numbered_prompts

    path = tmp_path / "p.txt"
    path.write_bytes('\ufeffA sign that says "12"\r\nA sign \u2028that says "34"\x0c\n\n  \nA sign that says "ab"\n'
                     .encode())
    assert numbered_prompts(path) == [(1, 'A sign that says "12"'), (2, 'A sign \u2028that says "34"'),
                                      (5, 'A sign that says "ab"')]

    def digits(text: str) -> list[int]:
        quoted = text.split('"')[1]
        if not quoted.isdigit():
            raise ValueError(f"{quoted!r} is not a number")
        return [int(c) for c in quoted]

    with pytest.raises(ValueError) as err:
        check_prompts(path, digits, "spec.data.trainPrompts")
    assert str(err.value) == f"spec.data.trainPrompts: {path} line 5: 'ab' is not a number; fix or remove that line"
    path.write_bytes(b'A sign that says "12"\nA sign that sa\xe9ys "34"\n')
    with pytest.raises(ValueError) as err:
        read_prompts(path, "spec.data.trainPrompts")
    assert str(err.value) == (f"spec.data.trainPrompts: {path} line 2 is not UTF-8 text (byte 0xe9: invalid "
                              "continuation byte); save the file as UTF-8, or fix or remove that line")


def request(step=4, prompt=7, g=3) -> GenerateRequest:
    key = f"{step}:{prompt}"
    return GenerateRequest(kind="train", step=step, group_id=key, prompt='"1"', prompt_ids=[2], num_steps=4,
                           samples=[SampleSeed(sample_id=f"{key}:{i}", seed=i) for i in range(g)])


def score(sample_id: str, group_id: str, failed=False) -> ScoreMeta:
    return ScoreMeta(sample_id=sample_id, kind="train", step=4, group_id=group_id, policy_version=0,
                     reward=None if failed else 0.5, failed=failed, reason="boom" if failed else "",
                     generated_at=0.0, scored_at=1.0)


def test_refill_gets_new_ids_and_seeds_and_old_attempt_is_ignored():
    book = StepBook(4)
    book.add("4:7", request())
    for i in range(3):
        book.record(score(f"4:7:{i}", "4:7", failed=(i == 1)), f"k{i}")
    group = book.groups["4:7"]
    assert group.complete and group.failed_reasons == ["4:7:1: boom"]
    group.attempt = 1
    group.request = refill_request(group.request, 1, [100, 101, 102])
    group.scores.clear()
    assert [s.sample_id for s in group.request.samples] == ["4:7:0r1", "4:7:1r1", "4:7:2r1"]
    assert [s.seed for s in group.request.samples] == [100, 101, 102] and group.request.group_id == "4:7r1"
    assert book.record(score("4:7:2", "4:7"), "late") is None  # a leftover of attempt 0
    assert not book.complete
    for i in range(3):
        assert book.record(score(f"4:7:{i}r1", "4:7r1"), f"k{i}") is group
    assert book.complete and group.failed_reasons == []
    second = refill_request(group.request, 2, [200, 201, 202])
    assert second.group_id == "4:7r2" and second.samples[0].sample_id == "4:7:0r2"


def test_validation_table_reports_the_change():
    records = [
        {"event": "validation", "step": 0, "policy_version": 0, "val_reward_mean": 0.45, "val_exact_match": 0.06,
         "grid": "g0.png"},
        {"event": "step", "step": 9, "reward_mean": 0.61},
        {"event": "validation", "step": 10, "policy_version": 10, "val_reward_mean": 0.70, "val_exact_match": 0.2,
         "grid": "g10.png"},
    ]
    text = validation_table(records)
    assert "0.450" in text and "0.700" in text and "0.610" in text
    assert "0.450 → 0.700 (+0.250)" in text
    assert validation_table([{"event": "step", "step": 0}]) == ""
    # a run stopped before its second validation: the table, and no "0.450 → 0.450 (+0.000)" that reads as
    # "training changed nothing"
    alone = validation_table(records[:1])
    assert "0.450" in alone and "→" not in alone
    # a round whose every sample was missing (tensors expired) has no mean: no row, no TypeError
    empty = {"event": "validation", "step": 5, "policy_version": 5, "val_reward_mean": None, "val_exact_match": None,
             "n": 0, "missing": 4, "grid": None}
    assert validation_table([records[0], empty, *records[1:]]) == text


def test_background_darkness_reads_only_the_border_rows():
    import numpy as np

    from omnirl.controller.validation import background_darkness

    clean = np.full((32, 64, 3), 255, np.uint8)
    clean[10:20] = 0  # ink in the middle does not count
    grey = np.full((32, 64, 3), 255, np.uint8)
    grey[:2] = 127
    assert background_darkness([clean]) == 0.0
    assert background_darkness([grey]) == pytest.approx(0.5 * (1 - 127 / 255), abs=1e-6)


def test_the_console_step_line_numbers_steps_as_the_checkpoints_do():
    record = {"reward_mean": 0.5, "reward_std": 0.25, "step_seconds": 2.0, "images_per_second": 3.0,
              "checkpoint": "/run/checkpoints/step-000001"}
    assert step_line(1, 2, 2, record) == ("step 1 [2/2] reward 0.500±0.250  2.0 s  3.0 img/s  v2  "
                                          "checkpoint step-000001")
    del record["checkpoint"]
    assert step_line(0, 2, 1, record).startswith("step 0 [1/2] ") and "checkpoint" not in step_line(0, 2, 1, record)


def test_a_step_its_predecessor_trained_but_never_timed_gets_no_made_up_speed(tmp_path, caplog):
    """`--resume` after a SIGTERM between a step's training and its line: the new controller writes
    the line from the predecessor's hand-off numbers, which have no step_seconds. It printed
    `step 6 [7/0] ... 0.0 s  64000000000.0 img/s` (a 0 s default, and before the plan was known)."""
    from omnirl.api.loader import load_rljob
    from omnirl.api.messages import TrainDone
    from omnirl.api.run_dir import read_metrics
    from omnirl.api.runtime import RoleEnv
    from omnirl.controller.report import Reporter

    job = load_rljob(str(Path(__file__).resolve().parents[2] / "examples" / "ocr-nft.yaml"))
    reporter = Reporter(tmp_path, RoleEnv(job_name="j", redis_url="redis://127.0.0.1:1/0", weight_sync_host="127.0.0.1",
                                             weight_sync_port=1, worker_id="controller-0", out_dir=str(tmp_path)), job)
    done = TrainDone(step=6, policy_version=7, metrics={"loss": 0.5})
    try:
        reporter.started(10, 7)
        with caplog.at_level("INFO", logger="omnirl.controller"):
            reporter.step(6, 7, {"reward_mean": 0.75, "reward_std": 0.25, "samples": 64}, done)
    finally:
        reporter.close()
    assert caplog.messages == ["step 6 [7/10] reward 0.750±0.250  time not measured (trained before this controller "
                               "started)  v7"]
    line = read_metrics(tmp_path)[-1]
    assert line["step"] == 6 and "step_seconds" not in line and "images_per_second" not in line


def test_the_trained_steps_of_a_run_are_its_step_lines_for_the_controller_and_the_launcher(tmp_path):
    """One reader of `metrics.jsonl`'s trained steps: the controller's `has_step` (before it writes a
    line again) and `omnirl run --resume`'s count (before it starts anything) agree with it."""
    from omnirl.api.loader import load_rljob
    from omnirl.api.run_dir import finish_covers, finished, read_metrics, trained_steps
    from omnirl.api.runtime import RoleEnv
    from omnirl.controller.report import Reporter

    lines = [{"event": "start", "total_steps": 4, "start_step": 0}, {"event": "step", "step": 0},
             {"event": "validation", "step": 1}, {"event": "step", "step": 2}, {"event": "finish"}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")
    assert read_metrics(tmp_path) == lines  # in order, the blank line skipped
    assert trained_steps(tmp_path) == {0, 2}  # one return type for every reader (it was an int for the launcher)
    assert finished(tmp_path)
    with (tmp_path / "metrics.jsonl").open("a") as f:  # a restarted controller that has not finished yet
        f.write(json.dumps({"event": "start", "total_steps": 4, "start_step": 3}) + "\n")
    assert not finished(tmp_path) and finished(tmp_path, since=0) is False
    assert [finish_covers(r, 4) for r in ({"total_steps": 4}, {"total_steps": 3}, {}, None)] == [True, False, False,
                                                                                                  False]
    job = load_rljob(str(Path(__file__).resolve().parents[2] / "examples" / "ocr-nft.yaml"))
    reporter = Reporter(tmp_path, RoleEnv(job_name="j", redis_url="redis://127.0.0.1:1/0", weight_sync_host="127.0.0.1",
                                             weight_sync_port=1, worker_id="controller-0", out_dir=str(tmp_path)), job)
    try:
        assert [reporter.has_step(s) for s in range(4)] == [True, False, True, False]
        assert [reporter.has_validation(s) for s in range(3)] == [False, True, False]
    finally:
        reporter.close()
    (tmp_path / "metrics.jsonl").write_text("")
    assert trained_steps(tmp_path) == set()


def test_held_out_prompts_and_refills_keep_their_resolution():
    """`model.resolutions`: held-out prompt i is sampled at resolutions[i mod n] (validation and
    `omnirl eval` build the same request), a refilled group keeps its size, and the engine request
    carries it as a (height, width) tuple."""
    from omnirl.api.heldout import heldout_request
    from omnirl.api.spec import RLJobSpec
    from omnirl.rollout.requests import sample_requests

    spec = RLJobSpec.model_validate({"model": {"family": "sd3", "path": "/m", "resolutions": [[32, 48], [48, 32]]},
                                     "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "j", "kind": "jpeg"}]})
    reqs = [heldout_request(spec, i, "p", [1, 2], step=0, sample_id=f"val0:{i}:0") for i in range(3)]
    assert [r.resolution for r in reqs] == [[32, 48], [48, 32], [32, 48]]
    assert [s.resolution for s in sample_requests(reqs[1])] == [(48, 32)]
    assert refill_request(reqs[1].model_copy(update={"kind": "train"}), 1, [5]).resolution == [48, 32]
    single = RLJobSpec.model_validate({"model": {"family": "sd3", "path": "/m", "resolution": [32, 48]},
                                       "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "j", "kind": "jpeg"}]})
    assert heldout_request(single, 1, "p", [1], step=0, sample_id="v").resolution is None  # the adapter's default

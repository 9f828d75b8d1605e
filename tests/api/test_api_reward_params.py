"""`spec.reward[].params` and `url` are checked per scorer kind by `omnirl validate`, naming the field."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from omnirl.api.loader import load_rljob, validate_files
from omnirl.reward.kinds.jpeg import JPEGParams
from omnirl.reward.kinds.ocr import OCRParams
from omnirl.reward.kinds.vlm import VLMParams

ROOT = Path(__file__).resolve().parents[2]
OCR = {"name": "ocr", "kind": "ocr"}
JUDGE = {"name": "judge", "kind": "vlm", "url": "http://judge:8000/v1"}


def _validate(tmp_path: Path, rewards: list[dict[str, Any]]) -> list[str]:
    doc = yaml.safe_load((ROOT / "examples" / "ocr-flowgrpo.yaml").read_text())
    doc["spec"]["reward"] = rewards
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = io.StringIO()
    validate_files([str(path)], out)
    return [line.split(": ", 1)[1].rsplit(" (line", 1)[0] for line in out.getvalue().splitlines()]


def test_valid_params_of_every_kind_pass_and_are_typed(tmp_path):
    rewards = [
        {**OCR, "params": {"alphabet": "0123", "threads": 2, "batchSize": 8}},
        {"name": "jpeg", "kind": "jpeg", "params": {"quality": 80}},
        {"name": "h", "kind": "http", "url": "https://scorer.example:8443/v1/score", "params": {"maxRetries": 0}},
        {"name": "g", "kind": "grpc", "url": "ocr-scorer:50051"},
        {**JUDGE, "params": {"model": "Qwen/Qwen3-VL-8B", "template": "rate", "scale": 5, "maxTokens": 4,
                             "instruction": "Score {prompt} from 1 to {scale}", "concurrency": 16}},
        {"name": "yn", "kind": "vlm", "url": "http://judge:8000/v1",
         "params": {"model": "m", "template": "yes-no", "topLogprobs": 10}},
    ]
    assert _validate(tmp_path, rewards) == ["ok"]
    job = load_rljob(tmp_path / "job.yaml")
    ocr, jpeg, _, _, judge, _ = (r.typed_params() for r in job.spec.reward)
    assert ocr == OCRParams(alphabet="0123", threads=2, batchSize=8) and jpeg == JPEGParams(quality=80)
    assert isinstance(judge, VLMParams) and judge.scale == 5 and judge.maxRetries == 3


@pytest.mark.parametrize("reward, line", [
    ({**JUDGE, "params": {"model": "m", "template": "rate", "maxTokens": 0}},
     "spec.reward[1].params.maxTokens: 0 is invalid: must be >= 1"),
    ({**JUDGE, "params": {"model": "m", "template": "rate", "temprature": 0}},
     "spec.reward[1].params.temprature: 0 is invalid: unknown key for kind vlm; allowed: model, template, instruction, "
     "scale, maxTokens, topLogprobs, concurrency, batchSize, maxRetries, apiKeyEnv, frames, audio"),
    ({**JUDGE, "params": {"template": "rate"}}, "spec.reward[1].params.model: null is invalid: required for kind vlm"),
    ({**JUDGE, "params": {"model": "m", "template": "score"}},
     'spec.reward[1].params.template: "score" is invalid: must be one of: read-text, rate, yes-no'),
    ({**JUDGE, "params": {"model": "m", "template": "yes-no", "scale": 5}},
     "spec.reward[1].params.scale: 5 is invalid: only applies to template rate, not yes-no"),
    ({**JUDGE, "params": {"model": "m", "template": "yes-no", "instruction": "Is it {promt}?"}},
     "spec.reward[1].params.instruction: \"Is it {promt}?\" is invalid: may only use the placeholders ['prompt'], "
     "found ['promt']"),
    ({**JUDGE, "params": {"model": "m", "template": "rate", "concurrency": 1000}},
     "spec.reward[1].params.concurrency: 1000 is invalid: must be <= 256"),
    ({**JUDGE, "params": {"model": "m", "template": "rate", "apiKeyEnv": "my-key"}},
     'spec.reward[1].params.apiKeyEnv: "my-key" is invalid: must match the regular expression ^[A-Za-z_][A-Za-z0-9_]*$'),
    ({**JUDGE, "url": "judge:8000", "params": {"model": "m", "template": "rate"}},
     'spec.reward[1].url: "judge:8000" is invalid: must be an http:// or https:// URL with a host and no query, '
     "e.g. http://judge:8000/v1"),
    ({**JUDGE, "url": "http://judge:8000/v1/chat/completions/", "params": {"model": "m", "template": "rate"}},
     'spec.reward[1].url: "http://judge:8000/v1/chat/completions/" is invalid: is the /chat/completions endpoint, not '
     "the API's base URL; drop /chat/completions (the client appends it), e.g. http://judge:8000/v1"),
    ({"name": "s", "kind": "http", "url": "http://scorer:99999/score"},
     'spec.reward[1].url: "http://scorer:99999/score" is invalid: is not a valid URL (Port out of range 0-65535); '
     "e.g. http://scorer:8000/v1/score"),
    ({"name": "s", "kind": "grpc", "url": "http://scorer:50051"},
     'spec.reward[1].url: "http://scorer:50051" is invalid: must be host:port (port 1..65535), e.g. ocr-scorer:50051'),
    ({"name": "s", "kind": "grpc"}, "spec.reward[1].url: null is invalid: required for kind grpc (the scorer's endpoint)"),
    ({"name": "s", "kind": "grpc", "url": "s:1", "params": {"maxRetries": 11}},
     "spec.reward[1].params.maxRetries: 11 is invalid: must be <= 10"),
    ({"name": "j", "kind": "jpeg", "url": "http://x/score"},
     'spec.reward[1].url: "http://x/score" is invalid: must not be set for kind jpeg (it scores in-process)'),
    ({"name": "j", "kind": "jpeg", "params": {"quality": 100}}, "spec.reward[1].params.quality: 100 is invalid: must be <= 95"),
    ({"name": "o", "kind": "ocr", "params": {"threads": "2"}}, 'spec.reward[1].params.threads: "2" is invalid: must be an integer'),
    ({"name": "o", "kind": "ocr", "params": {"thread": 2, "batch_size": 8, "alphabet": 1}},
     'spec.reward[1].params: ["batch_size", "thread"] is invalid: unknown keys for kind ocr; allowed: alphabet, '
     "threads, batchSize"),
    ({"name": "o", "kind": "ocr", "params": {"batch_size": 8}},
     "spec.reward[1].params.batch_size: 8 is invalid: unknown key for kind ocr; allowed: alphabet, threads, batchSize"),
])
def test_bad_params_and_urls_are_named(tmp_path, reward, line):
    assert _validate(tmp_path, [OCR, reward]) == [line]


def test_weights_need_not_sum_to_one_but_cannot_all_be_zero(tmp_path):
    """Σ weight · score, as written: 0.5 + 0.1 is a valid job, a 0 beside a non-zero weight a reward
    logged but not trained on; every weight 0 trains on nothing and is refused."""
    assert _validate(tmp_path, [{**OCR, "weight": 0.5}, {"name": "jpeg", "kind": "jpeg", "weight": 0.1}]) == ["ok"]
    assert _validate(tmp_path, [OCR, {"name": "jpeg", "kind": "jpeg", "weight": 0}]) == ["ok"]
    assert _validate(tmp_path, [{**OCR, "weight": 0}, {"name": "jpeg", "kind": "jpeg", "weight": 0.0}]) == [
        'spec.reward: ["ocr: weight 0", "jpeg: weight 0"] is invalid: every weight is 0, so every sample\'s reward '
        "is 0 and nothing is learnt; give at least one reward a non-zero weight"]

"""`kind: vlm` against a real OpenAI-compatible server process (tests/judge_server.py, see its doc)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from omnirl.api.spec import RewardSpec
from omnirl.reward import ScorerError
from omnirl.reward.registry import build_scorer
from omnirl.reward.vlm import VLMScorer, parse_rating, request_seed
from omnirl.scorers.base import score_each

SERVER = Path(__file__).resolve().parents[1] / "judge_server.py"
SERVED_MODELS = ["judge", "judge-no-logprobs", "malformed", "no-choices", "reject"]  # its GET /v1/models


def _judge_server(*args: str) -> Iterator[str]:
    """Base URL (`http://127.0.0.1:PORT/v1`) of a judge server process started with `args`."""
    proc = subprocess.Popen([sys.executable, str(SERVER), *args], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on "), line
        yield f"http://127.0.0.1:{int(line.split()[-1])}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def judge() -> Iterator[str]:
    """Base URL of a judge server process of this module."""
    yield from _judge_server()


def all_stats(base_url: str) -> dict:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/stats", timeout=30) as resp:
        return json.loads(resp.read())


def stats(base_url: str, model: str) -> list[dict]:
    return [r for r in all_stats(base_url)["requests"] if r["model"] == model]


def image(text: str, seed: int = 0) -> np.ndarray:
    """An `[8, 32, 3]` uint8 image whose first row carries `text` for the judge to "read"."""
    im = np.random.default_rng(seed).integers(1, 256, size=(8, 32, 3), dtype=np.uint8)
    codes = list(text.encode("ascii")) + [0]
    im[0, : len(codes), 0] = codes
    return im


def vlm(url: str, timeout: float = 30.0, **params) -> VLMScorer:
    spec = RewardSpec(name="judge", kind="vlm", url=url, timeoutSeconds=timeout,
                      params={"model": "judge", **params})
    scorer = build_scorer(spec)
    assert isinstance(scorer, VLMScorer)
    return scorer


def test_read_text_is_scored_with_the_ocr_rule(judge):
    scorer = vlm(judge, template="read-text")
    images = np.stack([image("2048"), image("2047"), image("x2048y")])
    prompts = ['A sign that says "2048"'] * 3
    ids = ["0:0:0", "0:0:1", "0:0:2"]
    np.testing.assert_allclose(scorer.score(images, prompts, ids), [1.0, 0.75, 1.0])
    sent = {r["seed"]: r for r in stats(judge, "judge")}
    for sid in ids:  # temperature 0 and the sample's own seed, on every request
        req = sent[request_seed(sid)]
        assert req["temperature"] == 0 and req["max_tokens"] == 64 and req["logprobs"] is None
        assert req["question"].startswith("What text is written")


def test_an_unset_api_key_names_the_field_the_variable_and_the_fix(judge, monkeypatch):
    """`params.apiKeyEnv` naming an unset variable: the job's scorers (the reward role, omnirl eval)
    are refused with `spec.reward[i].params.apiKeyEnv`, the variable and both fixes; once it is set,
    the key reaches the judge as the bearer token."""
    from omnirl.reward.scoring import RewardSet

    var = "OMNIRL_TEST_JUDGE_KEY"
    specs = [RewardSpec(name="jpeg", kind="jpeg"),
             RewardSpec(name="judge", kind="vlm", url=judge, params={"model": "keyed", "template": "read-text",
                                                                     "apiKeyEnv": var})]
    monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError) as err:
        RewardSet(specs)
    assert str(err.value).startswith(f"spec.reward[1].params.apiKeyEnv: the environment variable {var} is not set "
                                     f"(or empty); export {var}=<the judge's API key> before omnirl run or omnirl "
                                     f"eval; on Kubernetes give the reward container {var} from a Secret in "
                                     "spec.roles.reward.template (spec: {containers: [{name: reward, env: "
                                     f"[{{name: {var}, valueFrom: {{secretKeyRef: "), err.value
    monkeypatch.setenv(var, "sk-test-1")
    rewards = RewardSet(specs)
    (reward, per_name, reason), = rewards.score([image("2048")], ['A sign that says "2048"'], ["0:0:0"])
    assert per_name["judge"] == 1.0 and reason == ""
    assert [r["authorization"] for r in stats(judge, "keyed")] == ["Bearer sk-test-1"]


def test_rate_parses_strictly_and_fails_the_bad_sample_alone(judge):
    scorer = vlm(judge, template="rate", scale=10)
    images = np.stack([image("7"), image("seven"), image("11"), image(" 10 ")])
    outcome = scorer.score_each(images, ['"a dog"'] * 4, ["r0", "r1", "r2", "r3"])
    assert set(outcome.errors) == {1, 2}
    np.testing.assert_allclose(outcome.values[[0, 3]], [6 / 9, 1.0], rtol=1e-6)
    assert "unparseable reply" in outcome.errors[1].reason and "'seven'" in outcome.errors[1].reason
    assert outcome.errors[1].sample_id == "r1"
    assert "outside 1..10" in outcome.errors[2].reason and "'11'" in outcome.errors[2].reason
    with pytest.raises(ScorerError, match="seven"):
        scorer.score(images, ['"a dog"'] * 4, ["r0", "r1", "r2", "r3"])
    for bad in ["7.5", "7/10", "7 8", "", "Rating: 7"]:
        with pytest.raises(ValueError):
            parse_rating(bad, 10)


def test_yes_no_is_p_yes_from_logprobs(judge):
    scorer = vlm(judge, template="yes-no", topLogprobs=3)
    rewards = scorer.score(np.stack([image("0.8"), image("0.25")]), ['"a dog"', '"a cat"'], ["y0", "y1"])
    # p_yes / (p_yes + p_no); the judge's "maybe" alternative is ignored
    np.testing.assert_allclose(rewards, [0.8, 0.25], rtol=1e-6)
    sent = [r for r in stats(judge, "judge") if r["logprobs"]]
    assert {r["top_logprobs"] for r in sent} == {3} and {r["max_tokens"] for r in sent} == {1}
    assert {r["question"] for r in sent} == {f'Does this image match the description: "a {x}"\nAnswer yes or no.'
                                             for x in ("dog", "cat")}


def test_yes_no_without_logprobs_is_a_clear_error(judge):
    scorer = vlm(judge, template="yes-no")
    scorer.params = scorer.params.model_copy(update={"model": "judge-no-logprobs"})
    outcome = scorer.score_each(image("0.8")[None], ['"a dog"'], ["n0"])
    assert outcome.errors[0].sample_id == "n0" and "returned no logprobs" in outcome.errors[0].reason


def test_same_image_same_score(judge):
    scorer = vlm(judge, template="yes-no")
    images = np.stack([image("0.6", seed=3)] * 3)
    first = scorer.score(images, ['"x"'] * 3, ["d0", "d1", "d2"])
    again = vlm(judge, template="yes-no").score(images, ['"x"'] * 3, ["d0", "d1", "d2"])
    assert first.tolist() == again.tolist() and len(set(first.tolist())) == 1
    assert len({request_seed(s) for s in ["d0", "d1", "d2"]}) == 3 and request_seed("d0") == request_seed("d0")


def as_model(scorer: VLMScorer, model: str) -> VLMScorer:
    scorer.params = scorer.params.model_copy(update={"model": model})
    return scorer


def test_5xx_is_retried_then_succeeds(judge):
    scorer = as_model(vlm(judge, template="rate", maxRetries=3), "flaky:2")
    assert scorer.score(image("4")[None], ['"x"'], ["f0"]).tolist() == pytest.approx([3 / 9])
    attempts = [r for r in stats(judge, "flaky:2") if r["seed"] == request_seed("f0")]
    assert [r["attempt"] for r in attempts] == [1, 2, 3]  # two 503s, then the answer
    assert [r["retry_header"] for r in attempts] == ["0", "1", "2"]


def test_5xx_past_the_retries_fails_the_sample(judge):
    scorer = as_model(vlm(judge, template="rate", maxRetries=1), "flaky:5")
    outcome = scorer.score_each(image("4")[None], ['"x"'], ["f1"])
    assert "HTTP 503 (after 1 retries): " in outcome.errors[0].reason and "overloaded" in outcome.errors[0].reason
    assert len([r for r in stats(judge, "flaky:5") if r["seed"] == request_seed("f1")]) == 2  # 1 try + 1 retry


@pytest.mark.parametrize("limits, model", [({"concurrency": 2}, "slow:0.3"), ({"batchSize": 3}, "slow:0.31")])
def test_requests_in_flight_stay_within_the_limits(judge, limits, model):
    scorer = as_model(vlm(judge, template="rate", **limits), model)
    rewards = scorer.score(np.stack([image(str(k)) for k in range(1, 8)]), ['"x"'] * 7, [f"c{k}" for k in range(7)])
    np.testing.assert_allclose(rewards, [k / 9 for k in range(7)], rtol=1e-6)  # in order despite the threads
    assert len(stats(judge, model)) == 7
    assert 1 <= all_stats(judge)["max_in_flight"][model] <= min(limits.get("concurrency", 8), limits.get("batchSize", 64))


def test_4xx_is_not_retried(judge):
    scorer = as_model(vlm(judge, template="rate", maxRetries=3), "reject")
    outcome = scorer.score_each(image("4")[None], ['"x"'], ["b0"])
    # the reason says so (it read "HTTP 400 (maxRetries 3)", as if tried four times)
    assert "HTTP 400 (not retried: an error of the request): " in outcome.errors[0].reason
    assert "does not exist" in outcome.errors[0].reason
    assert len([r for r in stats(judge, "reject") if r["seed"] == request_seed("b0")]) == 1


def test_timeout_is_retried_then_fails(judge):
    """Each attempt times out; the judge lists its models, so it is up but slow: one more request,
    with a longer timeout, measures it, and the sample fails (not held)."""
    scorer = as_model(vlm(judge, timeout=0.5, template="rate", maxRetries=1), "slow:2")
    outcome = scorer.score_each(image("4")[None], ['"x"'], ["t0"])
    assert "slower than spec.reward[judge].timeoutSeconds 0.5: 2 attempt(s) timed out" in outcome.errors[0].reason
    assert not outcome.errors[0].unavailable
    assert [r["attempt"] for r in stats(judge, "slow:2") if r["seed"] == request_seed("t0")] == [1, 2, 3]


def test_unreachable_server_fails_every_sample():
    scorer = vlm("http://127.0.0.1:9/v1", template="rate", maxRetries=0)
    outcome = score_each(scorer, np.stack([image("4"), image("5")]), ['"x"', '"y"'], ["u0", "u1"])
    assert set(outcome.errors) == {0, 1}
    # the client's own text is "Connection error." whatever the cause: the cause is appended
    assert outcome.errors[0].reason.endswith("APIConnectionError: Connection error. (ConnectError: [Errno 111] "
                                             "Connection refused)"), outcome.errors[0].reason


@pytest.mark.parametrize("model, raw", [("malformed", '{"id": "chatcmpl-test", "choices": [{"mess'),
                                        ("no-choices", '"object": "chat.completion"')])
def test_malformed_reply_is_an_error_with_the_raw_text(judge, model, raw):
    scorer = as_model(vlm(judge, template="rate"), model)
    outcome = scorer.score_each(image("4")[None], ['"x"'], ["m0"])
    assert "malformed reply" in outcome.errors[0].reason and raw in outcome.errors[0].reason
    assert outcome.values[0] == 0.0 and not np.isnan(outcome.values).any()


def test_prompt_without_text_to_read_fails_before_any_request(judge):
    scorer = vlm(judge, template="read-text")
    outcome = scorer.score_each(image("1")[None], ['A sign that says ""'], ["p0"])
    assert "no text to read" in outcome.errors[0].reason


def test_a_sample_no_reward_scored_fails_even_when_none_is_required(judge):
    """Two non-required judges, one unreachable: a sample the other scores gets its weighted score;
    when both fail, the sample fails with both reasons (its sum would be an empty 0)."""
    from omnirl.reward.scoring import RewardSet

    live = {"name": "live", "kind": "vlm", "url": judge, "weight": 0.5, "required": False,
            "params": {"model": "judge", "template": "read-text"}}
    dead = {"name": "dead", "kind": "vlm", "url": "http://127.0.0.1:9/v1", "required": False,
            "params": {"model": "judge", "template": "read-text", "maxRetries": 0}}
    prompts = ['A sign that says "2048"']
    (reward, per_name, reason), = RewardSet([RewardSpec(**live), RewardSpec(**dead)]).score([image("2048")], prompts, ["n0"])
    assert (reward, per_name) == (0.5, {"live": 1.0}) and reason.startswith("dead: ")
    (reward, per_name, reason), = RewardSet([RewardSpec(**dead)]).score([image("2048")], prompts, ["n1"])
    assert reward is None and per_name == {} and "Connection refused" in reason, reason


@pytest.fixture(scope="module")
def keyed_judge() -> Iterator[str]:
    """Base URL of a judge server that takes only the API key `sk-right` (`--api-key`)."""
    yield from _judge_server("--api-key", "sk-right")


def judged_job(tmp_path: Path, url: str, model: str = "judge", **params) -> str:
    """The NFT example plus a VLM judge at `url` (its prompt files made absolute)."""
    root = Path(__file__).resolve().parents[2]
    doc = yaml.safe_load((root / "examples" / "ocr-nft.yaml").read_text())
    doc["spec"]["data"] = {k: str(root / "examples" / v) for k, v in doc["spec"]["data"].items()}
    doc["spec"]["reward"].append({"name": "judge", "kind": "vlm", "url": url, "weight": 0.5,
                                  "params": {"model": model, "template": "read-text", **params}})
    path = tmp_path / "judged.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


PREFLIGHT = {  # url (None: the judge's), model, params → the one line of `omnirl run`
    "model-not-served": (None, "Qwen/Qwen3-VL-8B-Instruct", {},
                         "omnirl run: spec.reward[1].params.model: 'Qwen/Qwen3-VL-8B-Instruct' is not served by URL, "
                         f"which serves {SERVED_MODELS}; set params.model to one of them (vllm serve names a model by its "
                         "path, or --served-model-name)"),
    "url-without-v1": ("ROOT", "judge", {}, "omnirl run: spec.reward[1].url: ROOT/models answered HTTP 404 "),
    "unreachable": ("http://127.0.0.1:9/v1", "judge", {},
                    "omnirl run: spec.reward[1].url: the judge at http://127.0.0.1:9/v1 does not answer "
                    "(APIConnectionError: Connection error. (ConnectError: [Errno 111] Connection refused)); "
                    "start it, or fix url"),
    "wrong-key": ("KEYED", "judge", {"apiKeyEnv": "OMNIRL_TEST_WRONG_KEY"},
                  "omnirl run: spec.reward[1].params.apiKeyEnv: the judge at KEYED refused the key (HTTP 401: "
                  "'{\"error\": \"Unauthorized\"}'); export the key it expects in OMNIRL_TEST_WRONG_KEY"),
    "no-key": ("KEYED", "judge", {}, "omnirl run: spec.reward[1].params.apiKeyEnv: the judge at KEYED refused the key "
               "(HTTP 401: '{\"error\": \"Unauthorized\"}'); set params.apiKeyEnv to the environment variable holding its key"),
}


@pytest.mark.parametrize("case", list(PREFLIGHT))
def test_run_refuses_a_judge_it_cannot_use_before_anything_starts(case, judge, keyed_judge, tmp_path, capsys,
                                                                  monkeypatch):
    """`omnirl run`'s pre-flight asks the judge for its models: unreachable, no model list at `url`,
    a refused key or a model it does not serve is one line naming the field and the fix, exit 2,
    before the run directory is made (else every sample fails the same way after the roles load)."""
    from omnirl.cli import main

    url, model, params, line = PREFLIGHT[case]
    url = {None: judge, "ROOT": judge.removesuffix("/v1"), "KEYED": keyed_judge}.get(url, url)
    line = line.replace("ROOT", judge.removesuffix("/v1")).replace("KEYED", keyed_judge).replace("URL", judge)
    monkeypatch.setenv("OMNIRL_TEST_WRONG_KEY", "sk-wrong")
    code = main(["run", judged_job(tmp_path, url, model, **params), "--no-ray", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(line), err
    assert not (tmp_path / "o").exists()


def test_eval_refuses_a_model_the_judge_does_not_serve(judge, tmp_path, capsys):
    from omnirl.cli import main

    heldout = str(Path(__file__).resolve().parents[2] / "examples" / "prompts" / "ocr-heldout.txt")
    code = main(["eval", judged_job(tmp_path, judge, "qwen"), "--prompts", heldout, "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("omnirl eval: spec.reward[1].params.model: 'qwen' is not served by "), err


def test_the_right_key_passes_the_preflight(keyed_judge, monkeypatch):
    from omnirl.reward.registry import check_judges

    monkeypatch.setenv("OMNIRL_TEST_RIGHT_KEY", "sk-right")
    check_judges([RewardSpec(name="judge", kind="vlm", url=keyed_judge,
                             params={"model": "judge", "template": "rate", "apiKeyEnv": "OMNIRL_TEST_RIGHT_KEY"})])


def test_only_a_judge_that_does_not_answer_holds_its_samples(judge):
    """A 5xx past the retries or an unreachable judge holds the sample (the reward role scores it
    again later); a 4xx or a malformed reply is the sample's own failure; a failed non-required
    reward beside a required one that scored holds nothing."""
    from omnirl.reward.scoring import RewardSet

    def hold(model: str, url: str = judge, required: bool = True, more: tuple = ()) -> list[bool]:
        spec = RewardSpec(name="judge", kind="vlm", url=url, required=required,
                          params={"model": model, "template": "rate", "maxRetries": 0})
        return RewardSet([spec, *more]).score_or_hold([image("4")], ['"x"'], [f"h-{model}"])[1]

    assert hold("flaky:5") == [True] and hold("judge", url="http://127.0.0.1:9/v1") == [True]
    assert hold("reject") == [False] and hold("malformed") == [False]
    jpeg = RewardSpec(name="jpeg", kind="jpeg")
    assert hold("flaky:5", more=(jpeg,)) == [True]  # the required judge failed: the sample waits for it
    assert hold("flaky:5", required=False, more=(jpeg,)) == [False]  # scored by jpeg; the judge's term left out


def test_run_refuses_a_model_its_own_judge_does_not_serve(tmp_path, capsys):
    """A judge of `reward[].server` is asked for its models once it answers: `params.model` naming
    another model is one line (exit 2), and the judge is stopped."""
    from omnirl.cli import main

    path = Path(judged_job(tmp_path, "http://unused:1/v1", "/models"))
    doc = yaml.safe_load(path.read_text())
    del doc["spec"]["reward"][1]["url"]
    doc["spec"]["reward"][1]["server"] = {"command": [sys.executable, str(SERVER), "--port", "{port}"],
                                          "urlPath": "/v1", "healthPath": "/v1/models"}
    path.write_text(yaml.safe_dump(doc))
    code = main(["run", str(path), "--no-ray", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("omnirl run: spec.reward[1].params.model: '/models' is not served by http://127.0.0.1:"), err
    assert f"which serves {SERVED_MODELS}" in err
    port = int(err.split("http://127.0.0.1:")[1].split("/")[0])
    with socket.socket() as s:  # the judge was stopped
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_eval_of_a_sample_the_judge_cannot_score_is_one_line_not_a_traceback(judge, tmp_path, capsys):
    from omnirl.cli import main

    (tmp_path / "p.txt").write_text('"12"\n')
    code = main(["eval", judged_job(tmp_path, judge, "malformed"), "--prompts", str(tmp_path / "p.txt"),
                 "--sampling-steps", "2", "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1, err
    assert err.startswith("omnirl eval: eval sample 0 ('\"12\"') could not be scored: judge: malformed reply "
                          "(JSONDecodeError): "), err
    assert err.rstrip().endswith("; nothing written") and not (tmp_path / "e").exists()


def test_a_judge_slower_than_its_timeout_fails_at_once_naming_the_field_and_the_time_a_request_takes(judge):
    """Every attempt timed out but the judge lists its models: it is up, only slower than
    `timeoutSeconds`, which waiting does not cure. Its samples are not held; the reason names
    `spec.reward[i].timeoutSeconds` and one request's time, measured with a longer timeout; the
    batch's other samples are not sent (they would time out the same way)."""
    from omnirl.reward.scoring import RewardSet

    model = "slow:1.01"  # sleeps 1.01 s; a name of its own for the request count
    specs = [RewardSpec(name="jpeg", kind="jpeg", required=False),
             RewardSpec(name="judge", kind="vlm", url=judge, timeoutSeconds=0.3,
                        params={"model": model, "template": "rate", "maxRetries": 0, "concurrency": 1})]
    rewards = RewardSet(specs)
    results, hold = rewards.score_or_hold([image("4"), image("5"), image("6")], ['"x"'] * 3, ["w0", "w1", "w2"])
    assert hold == [False] * 3 and [r[0] for r in results] == [None] * 3
    reason = results[0][2]
    head = f"judge: {judge} is up (it listed its models in "
    tail = " but slower than spec.reward[1].timeoutSeconds 0.3: 1 attempt(s) timed out and one request took "
    assert reason.startswith(head) and tail in reason, reason
    took = float(reason.split(tail)[1].split(" s ")[0])
    assert took >= 1.0  # the judge's own sleep
    assert "; set spec.reward[1].timeoutSeconds above that, e.g. " in reason
    assert "or lower spec.reward[1].params.concurrency (1) if requests queue at the judge" in reason
    assert all(r[2] == results[0][2] for r in results[1:])
    assert [r["seed"] for r in stats(judge, model)] == [request_seed("w0")] * 2  # the attempt and the measurement
    again, hold = rewards.score_or_hold([image("7")], ['"x"'], ["w3"])  # measured once per scorer: the attempt only
    assert hold == [False] and again[0][2].split(" s) but")[1] == reason.split(" s) but")[1]
    assert [r["seed"] for r in stats(judge, model)] == [request_seed("w0")] * 2 + [request_seed("w3")]


def test_a_judge_that_times_out_and_lists_no_models_is_held():
    """A judge whose port takes connections but answers nothing (stuck, or still starting) is away:
    its samples are held, as for a refused connection; once that is known, the batch's other
    requests are not sent (each would wait out its timeout, keeping the worker from its heartbeat)."""
    import threading

    from omnirl.reward.scoring import RewardSet

    connections: list[socket.socket] = []
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)

        def accept() -> None:  # a connection per request: the client closes one that timed out
            while True:
                try:
                    connections.append(silent.accept()[0])
                except OSError:
                    return

        threading.Thread(target=accept, daemon=True).start()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        spec = RewardSpec(name="judge", kind="vlm", url=url, timeoutSeconds=0.3,
                          params={"model": "judge", "template": "rate", "maxRetries": 0, "concurrency": 1})
        results, hold = RewardSet([spec]).score_or_hold([image("4")] * 3, ['"x"'] * 3, ["a0", "a1", "a2"])
        silent.shutdown(socket.SHUT_RDWR)
    for conn in connections:
        conn.close()
    assert hold == [True] * 3, results
    assert results[0][2].endswith("APITimeoutError: Request timed out. (timeoutSeconds 0.3 per attempt); it does not "
                                  "list its models either (APITimeoutError)"), results[0][2]
    assert {r[2] for r in results} == {results[0][2]}
    assert len(connections) == 2  # the first request and the GET /models; a1 and a2 not sent

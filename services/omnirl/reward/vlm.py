"""`kind: vlm`: a vision-language judge behind an OpenAI-compatible chat-completions endpoint
(vLLM's `vllm serve`, or any server of the OpenAI API), called through the official `openai` client.

One request per image: a user message with the image as a base64 PNG data URL and the template's
question; temperature 0 and a seed derived from the sample id, so an image gets the same score
every time. A video / audio job (`params.frames`, `params.audio`) sends each sample's evenly spaced
frames as images after a line saying they are one video's frames, and its sound as an `input_audio`
part (16-bit PCM WAV, base64: the OpenAI chat format for audio input); the default questions then
ask about "this video" / "this sound" (`score_media_each`). Templates (`VLMParams.template`):

- `read-text`: the reply is the text the judge reads; reward = Flow-GRPO's OCR rule against the
  prompt's quoted text (`omnirl.scorers.text.ocr_reward`).
- `rate`: the reply must be one integer k in 1..scale (nothing else); reward = (k − 1)/(scale − 1).
- `yes-no`: one token with its top log-probabilities; reward = P(yes) / (P(yes) + P(no)), summing
  the probabilities of the alternatives that read `yes` / `no` (case and spaces ignored). A server
  that returns no log-probabilities is an error: the score cannot be computed without them.

Retries are the openai client's: `maxRetries` more attempts after a connection error, a timeout
(`timeoutSeconds` per attempt), 408, 409, 429 or 5xx, waiting 0.5 s · 2^k (at most 8 s, jittered, or
the server's Retry-After). An unparseable reply fails its sample with the raw text — never 0, never NaN.

A request whose every attempt timed out is told apart (`VLMScorer._slow_or_away`, once per batch,
whose requests not yet sent are then not sent): a judge that still lists its models (`GET /models`)
is up but slower than `timeoutSeconds`, which waiting does not cure — its samples fail at once,
naming the field and the time one request takes (measured); one that does not is away (restarting,
stuck) and its samples are held (`ScorerError.unavailable`).
"""

from __future__ import annotations

import base64
import io
import math
import os
import re
import threading
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import openai

from omnirl.api.seeds import derive
from omnirl.reward.frames import frame_indices
from omnirl.reward.kinds.vlm import VLMParams
from omnirl.reward.protocol.codec import encode_png
from omnirl.reward.slow import longest_call_s, measure_timeout, probe_timeout, slow_reason
from omnirl.scorers.base import Outcome, PerSampleScorer, ScorerError, check_batch, raise_first
from omnirl.scorers.text import ocr_reward, read_target

INSTRUCTIONS = {
    "read-text": "What text is written in this image? Reply with the text only, exactly as written.",
    "rate": "Rate how well this image matches the description: {prompt}\n"
            "Reply with one integer from 1 to {scale}, where {scale} is best, and nothing else.",
    "yes-no": "Does this image match the description: {prompt}\nAnswer yes or no.",
}
"""Default question of each template (`VLMParams.instruction` replaces it)."""
MAX_TOKENS = {"read-text": 64, "rate": 8, "yes-no": 1}
RETRY_AFTER_MAX_S = 120.0
"""The longest server-directed wait (Retry-After) the openai client honours before a retry (its
`MAX_RETRY_AFTER_DELAY`); its own backoff is at most 8 s."""
_INTEGER = re.compile(r"\s*(\d{1,4})\s*")


def image_part(image: np.ndarray) -> dict:
    """An `image_url` content part holding `image` `[H, W, 3]` uint8 as a base64 PNG data URL."""
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(encode_png(image)).decode()}}


def wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    """A mono 16-bit PCM WAV file of `audio` float32 `[L]` in [−1, 1] (round(x·32767), clipped)."""
    pcm = np.clip(np.round(np.asarray(audio, np.float64) * 32767.0), -32768, 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(int(sample_rate))
        out.writeframes(pcm.tobytes())
    return buffer.getvalue()


def media_parts(media: dict, frames: int, audio: bool) -> list[dict]:
    """A video / audio sample's content parts: with `frames`, a text line saying what follows and `frames` evenly spaced
    frames as images; with `audio`, its sound as an OpenAI `input_audio` part (base64 WAV)."""
    parts: list[dict] = []
    if frames:
        video = np.asarray(media["video"])
        picked = frame_indices(video.shape[0], count=frames)
        parts.append({"type": "text", "text": f"The {len(picked)} images are frames of one video, in order "
                                              f"({video.shape[0]} frames at {float(np.asarray(media['fps'])):g} fps)."})
        parts += [image_part(video[k]) for k in picked]
    if audio:
        data = base64.b64encode(wav_bytes(media["audio"], int(np.asarray(media["audio_sample_rate"])))).decode()
        parts.append({"type": "input_audio", "input_audio": {"data": data, "format": "wav"}})
    return parts


def media_noun(frames: int, audio: bool) -> str:
    """What the default questions call a sample of video and/or sound."""
    return "video and its sound" if frames and audio else "video" if frames else "sound"


def request_seed(sample_id: str) -> int:
    """The request's `seed`: the low 31 bits of `derive(0, "judge", key=sample_id)` (api/seeds.py;
    stable across processes, the same for an image in training and in `omnirl eval`)."""
    return derive(0, "judge", key=sample_id) & 0x7FFFFFFF


def parse_rating(text: str, scale: int) -> float:
    """(k − 1)/(scale − 1) of a reply that is exactly one integer k in 1..scale (spaces allowed).

    Raises:
        ValueError: anything else (words, decimals, several numbers, out of range).
    """
    match = _INTEGER.fullmatch(text)
    if not match:
        raise ValueError(f"expected one integer 1..{scale}")
    k = int(match.group(1))
    if not 1 <= k <= scale:
        raise ValueError(f"rating {k} is outside 1..{scale}")
    return (k - 1) / (scale - 1)


def p_yes(top_logprobs: list[Any]) -> float:
    """P(yes)/(P(yes) + P(no)) over the alternatives of the first reply token.

    Args:
        top_logprobs: the token's alternatives, each with `.token` and `.logprob` (natural log).
    Raises:
        ValueError: neither a yes nor a no token is among the alternatives.
    """
    yes = no = 0.0
    for alt in top_logprobs:
        word = alt.token.strip().lower()
        if word == "yes":
            yes += math.exp(alt.logprob)
        elif word == "no":
            no += math.exp(alt.logprob)
    if yes + no == 0.0:
        raise ValueError(f"neither yes nor no among the top tokens {[a.token for a in top_logprobs]}")
    return yes / (yes + no)


def api_key(env_var: str | None, field: str) -> str:
    """The judge's API key: the value of the environment variable `env_var` (`params.apiKeyEnv`),
    or `EMPTY` when None (vLLM accepts any key unless started with --api-key).

    Raises:
        ValueError: `env_var` is unset or empty; the message names `field`, the variable and the fix
            for both ways of running (`omnirl run`/`eval` inherit the shell's environment; a pod gets
            it from a Secret through `spec.roles.reward.template`).
    """
    if env_var is None:
        return "EMPTY"
    key = os.environ.get(env_var, "")
    if not key:
        raise ValueError(
            f"{field}: the environment variable {env_var} is not set (or empty); export {env_var}=<the judge's API "
            f"key> before omnirl run or omnirl eval; on Kubernetes give the reward container {env_var} from a Secret "
            f"in spec.roles.reward.template (spec: {{containers: [{{name: reward, env: [{{name: {env_var}, valueFrom: "
            "{secretKeyRef: {name: SECRET, key: KEY}}}]}]}); or drop apiKeyEnv if the judge needs no key")
    return key


def describe_error(err: openai.APIError, timeout_s: float) -> str:
    """`Type: message` of a failed request with what caused it: the openai client says only
    "Connection error." for a refused connection, an unknown host and a reset alike, so the
    underlying httpx error (`[Errno 111] Connection refused`) is appended; a timeout names the limit."""
    text = f"{type(err).__name__}: {err}"
    if isinstance(err, openai.APITimeoutError):
        return f"{text} (timeoutSeconds {timeout_s:g} per attempt)"
    cause = err.__cause__
    return f"{text} ({type(cause).__name__}: {cause})" if cause is not None and str(cause) else text


def check_judge(field: str, base_url: str, params: VLMParams, timeout_s: float, *, strict: bool = True) -> None:
    """Ask the judge which models it serves (`GET {base_url}/models`, one attempt): it answers, takes
    the key, and serves `params.model`. Left to the run, each of these faults fails every sample with
    the same HTTP error and the job ends at its first validation, after every role has loaded.

    Args:
        field: the reward's path, `spec.reward[i]`, for the messages.
        strict: False for a reward worker starting beside a judge that may still be loading or
            restarting: only a refused key or a model not served (answers that come back the same
            every time) raise; a judge that does not answer is left to the scoring (it holds samples).
    Raises:
        ValueError: naming `field.url` (unreachable, or no model list there: not the API's base URL),
            `field.params.apiKeyEnv` (HTTP 401/403) or `field.params.model` (not among those served),
            with the fix.
    """
    key = api_key(params.apiKeyEnv, f"{field}.params.apiKeyEnv")
    client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=0)
    try:
        served = [m.id for m in client.models.list()]
    except (openai.AuthenticationError, openai.PermissionDeniedError) as err:
        fix = (f"export the key it expects in {params.apiKeyEnv}" if params.apiKeyEnv else
               "set params.apiKeyEnv to the environment variable holding its key")
        raise ValueError(f"{field}.params.apiKeyEnv: the judge at {base_url} refused the key (HTTP {err.status_code}: "
                         f"{err.response.text[:200]!r}); {fix}") from None
    except openai.APIStatusError as err:
        if not strict:
            return
        raise ValueError(f"{field}.url: {base_url}/models answered HTTP {err.status_code} "
                         f"({err.response.text[:200]!r}); url must be the OpenAI API's base URL, the one "
                         "/models and /chat/completions hang off (vLLM: http://HOST:PORT/v1)") from None
    except openai.APIError as err:
        if not strict:
            return
        raise ValueError(f"{field}.url: the judge at {base_url} does not answer ({describe_error(err, timeout_s)}); "
                         "start it, or fix url") from None
    finally:
        client.close()
    if params.model not in served:
        raise ValueError(f"{field}.params.model: {params.model!r} is not served by {base_url}, which serves "
                         f"{served}; set params.model to one of them (vllm serve names a model by its path, or "
                         "--served-model-name)")


class VLMScorer(PerSampleScorer):
    """A VLM judge over the OpenAI chat-completions API.

    Args:
        name: reward name (metric label, error prefix).
        base_url: the API's base URL, e.g. `http://judge:8000/v1`.
        params: the checked `spec.reward[].params`.
        timeout_s: timeout of one attempt, seconds.
        field: the reward's path in the job (`spec.reward[1]`) for messages naming its settings.
    Raises:
        ValueError: `params.apiKeyEnv` names an unset environment variable (`api_key`).
    """

    def __init__(self, name: str, base_url: str, params: VLMParams, *, timeout_s: float = 30.0,
                 field: str | None = None) -> None:
        key = api_key(params.apiKeyEnv, f"reward {name!r}: params.apiKeyEnv")
        self.name, self.base_url, self.params, self.timeout_s = name, base_url, params, timeout_s
        self.field = field or f"spec.reward[{name}]"
        self._verdict_lock = threading.Lock()
        self._verdict: tuple[str, bool] | None = None  # per batch: None undecided, else `_slow_or_away`
        self._measured: tuple[float | None] | None = None  # a slow judge's measured request time (None: > the cap)
        self.instruction = params.instruction or INSTRUCTIONS[params.template]
        self.modalities = frozenset({"video"} if params.frames else set()) | frozenset({"audio"} if params.audio
                                                                                      else set())
        self.max_tokens = params.maxTokens or MAX_TOKENS[params.template]
        self.client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout_s,
                                    max_retries=params.maxRetries)
        self.pool = ThreadPoolExecutor(max_workers=params.concurrency, thread_name_prefix=f"vlm-{name}")

    def score_each(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> Outcome:
        """One score or error per sample; at most `concurrency` requests in flight, `batchSize` images per wave."""
        check_batch(images, prompts, sample_ids)
        return self._score(lambda i: [image_part(images[i])], prompts, sample_ids)

    def score_media_each(self, media: list[dict], prompts: list[str], sample_ids: list[str]) -> Outcome:
        """One score or error per sample of video / audio: its `params.frames` evenly spaced frames as images (after a
        line saying they are a video's frames) and with `params.audio` its sound as an `input_audio` part (WAV);
        the template's question asks about "this video" / "this sound" instead of "this image"."""
        outcome = Outcome(np.zeros(len(sample_ids), dtype=np.float32))
        ok = []
        for i, (m, sid) in enumerate(zip(media, sample_ids, strict=True)):
            missing = sorted(k for k in self.modalities if k not in m)
            if missing:
                outcome.errors[i] = ScorerError(sid, f"{self.name}: its media lacks {missing} (has {sorted(m)})")
            else:
                ok.append(i)
        if ok:
            outcome.fill(ok, self._score(lambda k: media_parts(media[ok[k]], self.params.frames, self.params.audio),
                                         [prompts[i] for i in ok], [sample_ids[i] for i in ok]))
        return outcome

    def score_media(self, media: list[dict], prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """`[B]` float32 from `score_media_each`; the first failed sample raises its ScorerError."""
        return raise_first(self.score_media_each(media, prompts, sample_ids))

    def _score(self, parts_of, prompts: list[str], sample_ids: list[str]) -> Outcome:
        """Each sample's request (`parts_of(i)`: its content parts before the question), `concurrency` at a time."""
        outcome = Outcome(np.zeros(len(sample_ids), dtype=np.float32))
        self._verdict = None  # a judge slow in the last batch may be away in this one, or fine
        step = self.params.batchSize
        for start in range(0, len(sample_ids), step):
            idx = range(start, min(start + step, len(sample_ids)))
            results = self.pool.map(lambda i: self._one(parts_of(i), prompts[i], sample_ids[i]), idx)
            for i, result in zip(idx, results, strict=True):
                if isinstance(result, ScorerError):
                    outcome.errors[i] = result
                else:
                    outcome.values[i] = result
        return outcome

    def longest_call_s(self, n: int) -> float:
        """The longest one `score_each` call on `n` images can take, seconds: its rounds of
        `concurrency` requests one after the other (`batchSize` per wave), each request's attempts
        timing out with the longest waits between them (a server's Retry-After, which the openai
        client honours up to `RETRY_AFTER_MAX_S`), then the model list and the measuring request."""
        step, concurrency = self.params.batchSize, self.params.concurrency
        rounds = sum(math.ceil(min(step, n - start) / concurrency) for start in range(0, n, step))
        request_s = (self.params.maxRetries + 1) * self.timeout_s + self.params.maxRetries * RETRY_AFTER_MAX_S
        return (rounds - 1) * request_s + longest_call_s(self.timeout_s, self.params.maxRetries + 1,
                                                         self.params.maxRetries * RETRY_AFTER_MAX_S)

    def _one(self, parts: list[dict], prompt: str, sample_id: str) -> float | ScorerError:
        """The reward of one sample (its content parts: an image, or a video's frames and sound), or the ScorerError
        saying why there is none."""
        template = self.params.template
        try:
            target = read_target(prompt, sample_id, self.name) if template == "read-text" else ""
        except ScorerError as err:
            return err
        if self._verdict is not None:  # not sent: it would time out as the others did
            return ScorerError(sample_id, self._verdict[0], unavailable=self._verdict[1])
        question = self.instruction.format(prompt=prompt, scale=self.params.scale)
        if self.params.instruction is None and any(p["type"] != "image_url" for p in parts):
            question = question.replace("this image", f"this {media_noun(self.params.frames, self.params.audio)}")
        extra = {"logprobs": True, "top_logprobs": self.params.topLogprobs} if template == "yes-no" else {}
        request = dict(model=self.params.model, temperature=0, seed=request_seed(sample_id), max_tokens=self.max_tokens,
                       messages=[{"role": "user", "content": [*parts, {"type": "text", "text": question}]}], **extra)
        try:
            raw = self.client.chat.completions.with_raw_response.create(**request)
        except openai.APITimeoutError as err:
            reason, away = self._slow_or_away(request, f"{self.name}: {self.base_url} failed after "
                                                       f"{self.params.maxRetries} retries: "
                                                       f"{describe_error(err, self.timeout_s)}")
            return ScorerError(sample_id, reason, unavailable=away)
        except openai.APIStatusError as err:  # 408/409/429/5xx only after the retries; others at once
            transient = err.status_code in (408, 409, 429) or err.status_code >= 500
            # say which: "(maxRetries 3)" on a 400 read as if the request had been tried 4 times
            tries = f"after {self.params.maxRetries} retries" if transient else "not retried: an error of the request"
            return ScorerError(sample_id, f"{self.name}: {self.base_url} answered HTTP {err.status_code} "
                                          f"({tries}): {err.response.text[:300]!r}", unavailable=transient)
        except openai.APIError as err:  # connection errors and timeouts (APITimeoutError), after the retries
            return ScorerError(sample_id, f"{self.name}: {self.base_url} failed after {self.params.maxRetries} "
                                          f"retries: {describe_error(err, self.timeout_s)}", unavailable=True)
        text = raw.http_response.text
        try:
            choice = raw.parse().choices[0]
            content = choice.message.content
        except (ValueError, TypeError, AttributeError, IndexError) as err:  # not JSON, or not a completion
            return ScorerError(sample_id, f"{self.name}: malformed reply ({type(err).__name__}): {text[:500]!r}")
        if not isinstance(content, str):
            return ScorerError(sample_id, f"{self.name}: the reply has no text content: {text[:500]!r}")
        try:
            if template == "read-text":
                return ocr_reward(target, content)
            if template == "rate":
                return parse_rating(content, self.params.scale)
            tokens = choice.logprobs.content if choice.logprobs is not None else None
            if not tokens:
                return ScorerError(sample_id, f"{self.name}: {self.base_url} returned no logprobs, which template yes-no "
                                              "needs (P(yes)); use a server that supports `logprobs` (vLLM does) or "
                                              f"template rate: {text[:300]!r}")
            return p_yes(tokens[0].top_logprobs or [])
        except ValueError as err:
            return ScorerError(sample_id, f"{self.name}: unparseable reply ({err}): {content[:500]!r}")

    def _slow_or_away(self, request: dict, timed_out: str) -> tuple[str, bool]:
        """After a request's every attempt timed out (`timed_out` says how): (the reason its samples
        fail, whether the judge is away). Up but slower than `timeoutSeconds`: it lists its models and
        one request, given up to 10 × the timeout, answers late or not at all (timed, the first time
        only). Away (held): no model list (restarting, stuck, gone), or the measuring request is
        refused or answered 408/409/429/5xx. Decided once per batch: the other timed-out requests wait
        for it, and the batch's requests not yet sent are not sent."""
        with self._verdict_lock:
            if self._verdict is None:
                slow, seen = self._measure_slow(request)
                self._verdict = (slow, False) if slow is not None else (f"{timed_out}; {seen}", True)
            return self._verdict

    def _measure_slow(self, request: dict) -> tuple[str | None, str]:
        start = time.monotonic()
        try:
            self.client.with_options(timeout=probe_timeout(self.timeout_s), max_retries=0).models.list()
        except openai.APIError as err:
            return None, f"it does not list its models either ({type(err).__name__})"
        listed_s = time.monotonic() - start
        if self._measured is None:  # once per scorer: a slow judge would cost every batch one more slow request
            start = time.monotonic()
            try:
                self.client.with_options(timeout=measure_timeout(self.timeout_s),
                                         max_retries=0).chat.completions.create(**request)
                self._measured = (time.monotonic() - start,)
            except openai.APITimeoutError:
                self._measured = (None,)
            except openai.APIStatusError as err:
                if err.status_code in (408, 409, 429) or err.status_code >= 500:
                    return None, f"it lists its models, but a request now got HTTP {err.status_code}"
                self._measured = (time.monotonic() - start,)  # it answered (an error of the sample's own): its time
            except openai.APIError as err:
                return None, f"it lists its models, but a request now failed ({describe_error(err, self.timeout_s)})"
        took_s = self._measured[0]
        return slow_reason(self.name, self.base_url, self.field, self.timeout_s, self.params.maxRetries + 1, listed_s,
                           took_s, cheap="listed its models",
                           fix=f", or lower {self.field}.params.concurrency ({self.params.concurrency}) if requests "
                               "queue at the judge"), ""

    def close(self) -> None:
        """Close the HTTP client and the request threads."""
        self.pool.shutdown(wait=False)
        self.client.close()

"""A reward model behind HTTP: POST a batch as JSON, get one reward per image back.

Request body: `{"prompts": [str], "sample_ids": [str], "images": [base64 PNG]}`.
Response body: `{"rewards": [float]}` of the same length. Anything else — a connection error, a
non-2xx status, a malformed body, a NaN — is a `ScorerError` with the reason, never a 0 reward.
"""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request

import numpy as np
from PIL import Image

from omnirl.reward.base import ScorerError, check_batch, check_rewards


def _png_b64(image: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


class HTTPScorer:
    """Scores by POSTing to `url`.

    Args:
        name: reward name (metric label).
        url: endpoint, e.g. `http://reward-model:8000/score`.
        timeout_s: per-request timeout, seconds.
    """

    def __init__(self, name: str, url: str, *, timeout_s: float = 30.0) -> None:
        self.name, self.url, self.timeout_s = name, url, timeout_s

    def score(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """`[B]` float32 rewards. Raises ScorerError (sample id "" for batch-level failures)."""
        check_batch(images, prompts, sample_ids)
        body = json.dumps({"prompts": prompts, "sample_ids": sample_ids,
                           "images": [_png_b64(im) for im in images]}).encode()
        req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                reply = json.loads(resp.read())
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            raise ScorerError("", f"{self.name}: {self.url} unreachable: {err}") from err
        except json.JSONDecodeError as err:
            raise ScorerError("", f"{self.name}: {self.url} returned non-JSON: {err}") from err
        rewards = reply.get("rewards") if isinstance(reply, dict) else None
        if not isinstance(rewards, list) or len(rewards) != len(sample_ids):
            raise ScorerError("", f"{self.name}: expected {{'rewards': [{len(sample_ids)} floats]}}, got {str(reply)[:200]}")
        try:
            values = np.asarray(rewards, dtype=np.float32)
        except (TypeError, ValueError) as err:
            raise ScorerError("", f"{self.name}: rewards are not numbers: {str(rewards)[:200]}") from err
        return check_rewards(values, sample_ids)

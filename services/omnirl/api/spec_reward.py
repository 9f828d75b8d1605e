"""What each reward kind accepts in `spec.reward[].params` and `url`, checked at validate time.

`spec.reward[].params` stays a free-form string/number/boolean map in the CRD (each kind has its
own keys); `RewardSpec` validates it against the kind's params class (defined in the kind's module,
`omnirl.api.extensions.params_model`), so `omnirl validate` and the admission check reject an unknown
key, an out-of-range value or a bad URL, naming the field (`spec.reward[1].params.maxTokens: 0 is
invalid: must be >= 1`). The reward package builds its scorers from these same models
(`RewardSpec.typed_params()`), so the two never disagree.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from omnirl.api._base import SpecModel
from omnirl.api.errors import FieldProblem
from omnirl.api.extensions import REWARD_KINDS, params_model
from omnirl.api.problems import dotted, requirement_text, walk

_GRPC_TARGET = re.compile(r"^(dns:///)?(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})$")


def parse_params(kind: str, params: dict[str, Any]) -> SpecModel:
    """The kind's params model built from `params` (strictly: `"8"` is not 8).

    Raises:
        FieldProblem: every unknown key at once (`params: ["a", "b"]`, or `params.a` for one), else
            the first bad value, with its path relative to the reward (`params.maxTokens`).
    """
    model = params_model(kind)
    unknown = sorted(k for k in params if k not in model.model_fields)
    if len(unknown) > 1:  # one line for all of them: a user fixes a block of typos in one go
        allowed = ", ".join(model.model_fields) or "(none)"
        raise FieldProblem("params", unknown, f"unknown keys for kind {kind}; allowed: {allowed}")
    try:
        return model.model_validate(params, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        problem = err.get("ctx", {}).get("error")
        if isinstance(problem, FieldProblem):  # a cross-key check of the params model
            raise FieldProblem(f"params.{problem.path}", problem.value, problem.requirement) from None
        path, ann, _ = walk(model, tuple(err["loc"]))
        where = "params." + dotted(path) if path else "params"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(model.model_fields) or "(none)"
            raise FieldProblem(where, err["input"], f"unknown key for kind {kind}; allowed: {allowed}") from None
        if err["type"] == "missing":
            raise FieldProblem(where, None, f"required for kind {kind}") from None
        raise FieldProblem(where, err["input"], requirement_text(err, ann)) from None


def check_url(kind: str, url: str | None) -> None:
    """Check a reward's `url` for its kind.

    By the kind's endpoint (`omnirl.api.extensions.Endpoint`): `http` an http(s) URL of the score
    endpoint; `openai` an http(s) base URL of the OpenAI API (`http://judge:8000/v1`); `grpc`
    `host:port` (or `dns:///host:port`); kinds that are not remote: none.

    Raises:
        FieldProblem: naming `url` and the expected form.
    """
    endpoint = REWARD_KINDS[kind].endpoint
    if endpoint is None:
        if url is not None:
            raise FieldProblem("url", url, f"must not be set for kind {kind} (it scores in-process)")
        return
    if not url:
        raise FieldProblem("url", url, f"required for kind {kind} (the scorer's endpoint)")
    if endpoint == "grpc":
        match = _GRPC_TARGET.match(url)
        if not match or not 1 <= int(match.group(4)) <= 65535:
            raise FieldProblem("url", url, "must be host:port (port 1..65535), e.g. ocr-scorer:50051")
        return
    example = "http://judge:8000/v1" if endpoint == "openai" else "http://scorer:8000/v1/score"
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError when out of range
    except ValueError as err:
        raise FieldProblem("url", url, f"is not a valid URL ({err}); e.g. {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment or port == 0:
        raise FieldProblem("url", url, f"must be an http:// or https:// URL with a host and no query, e.g. {example}")
    path = next((e for e in ("/chat/completions", "/completions") if parts.path.rstrip("/").endswith(e)), None)
    if endpoint == "openai" and path:  # the openai client appends the endpoint to the base URL itself
        raise FieldProblem("url", url, f"is the {path} endpoint, not the API's base URL; drop {path} "
                           f"(the client appends it), e.g. {example}")

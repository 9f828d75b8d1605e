"""`kind: python`: a reward that is a user's Python function, called in the reward workers (docs/rewards-python.md).

    reward: [{name: mine, kind: python, params: {function: "my_pkg.my_mod:score"}}]

The function (`call: batch`, the default) takes `images`, a numpy array `[B, H, W, 3]` uint8 (RGB), and `prompts`,
a list of B prompt lines, and returns B floats (a sequence or array of shape `[B]`); with `call: sample` it takes one
image `[H, W, 3]` uint8 and its prompt line and returns one float. Its module must be importable by the reward
workers (installed, or on PYTHONPATH). `omnirl scorer serve --function MODULE:FUNCTION` serves the same function
over the scorer protocol, for `kind: grpc` / `kind: http`.

A whole reward kind in one module: this file is all `kind: python` adds (docs/extending.md).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, field_validator

from omnirl.api._base import SpecModel
from omnirl.api.errors import FieldProblem
from omnirl.scorers.kinds import NotOnThisMachine, RewardKind, register_kind

_TARGET = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


class PythonParams(SpecModel):
    """`kind: python`: a user's Python function as the reward."""

    function: str = Field(..., min_length=3, max_length=512, description="MODULE:FUNCTION of the reward function, "
                          "e.g. my_pkg.rewards:score (importable by the reward workers: installed or on PYTHONPATH); "
                          "a batch function takes images [B, H, W, 3] uint8 and B prompts and returns B floats.")
    call: Literal["batch", "sample"] = Field(
        "batch", description="batch: function(images [B, H, W, 3] uint8, prompts list[str]) -> B floats; sample: "
        "function(image [H, W, 3] uint8, prompt str) -> float, called once per sample.")

    @field_validator("function")
    @classmethod
    def _target(cls, value: str) -> str:
        if not _TARGET.match(value):
            raise FieldProblem("function", value, "must be MODULE:FUNCTION, a dotted module path, a colon and the "
                               "function's name, e.g. my_pkg.rewards:score")
        return value


def load_function(target: str, field: str) -> Callable[..., Any]:
    """The callable `target` ("module:attr", attr may be dotted) names, importing its module.

    Raises:
        NotOnThisMachine (a ValueError): the module's top package is not installed here (naming `field`).
        ValueError: naming `field`: the module raised while importing, has no such attribute, or it is not callable.
    """
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or module_name
        text = (f"{field}: module {module_name!r} cannot be imported here ({missing!r} not found); install it, or "
                "add its directory to PYTHONPATH for omnirl run (on Kubernetes: in the reward image)")
        if module_name == missing or module_name.startswith(missing + "."):
            raise NotOnThisMachine(text) from None
        raise ValueError(text) from None  # the user's module is here but imports something that is not
    except Exception as err:  # the user's module failed while importing: its own error, named
        raise ValueError(f"{field}: importing {module_name} raised {type(err).__name__}: {err}") from err
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise ValueError(f"{field}: {module_name} has no attribute {attribute!r}; name the reward function "
                             f"as MODULE:FUNCTION (module {module_name} defines {_public(module)})")
        value = getattr(value, part)
    if not callable(value):
        raise ValueError(f"{field}: {target} is a {type(value).__name__}, not a function; name the reward function")
    return value


def _public(module: Any) -> str:
    names = [n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n))][:8]
    return ", ".join(names) or "no functions"


class PythonScorer:
    """Scores with a user's function (`Scorer`).

    Args:
        function: the callable (`load_function`).
        target: its "module:function", for messages.
        call: "batch" or "sample" (`PythonParams.call`).
    """

    def __init__(self, function: Callable[..., Any], target: str, call: str = "batch") -> None:
        self.function, self.target, self.call = function, target, call
        self.name = target

    def score(self, images, prompts: list[str], sample_ids: list[str]):
        """`[B]` float32 rewards of `images` `[B, H, W, 3]` uint8.

        Raises:
            ScorerError: the function raised (naming the first sample: the batch is then scored one sample at a
                time, so a bad sample fails alone), returned something that is not B finite numbers, or a
                malformed batch.
        """
        import numpy as np

        from omnirl.scorers.base import ScorerError, check_batch, check_rewards

        check_batch(images, prompts, sample_ids)
        try:
            if self.call == "sample":
                got = [self.function(image, prompt) for image, prompt in zip(images, prompts, strict=True)]
            else:
                got = self.function(images, list(prompts))
        except Exception as err:  # the user's code: its error is the sample's reason, never a reward of 0
            raise ScorerError(sample_ids[0], f"{self.target} raised {type(err).__name__}: {err}") from err
        try:
            rewards = np.asarray(got, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ScorerError("", f"{self.target} returned {type(got).__name__}, not numbers ({err}); return "
                              f"{len(sample_ids)} floats") from err
        if rewards.shape != (len(sample_ids),):
            what = "a float per call" if self.call == "sample" else f"{len(sample_ids)} floats, shape [B]"
            raise ScorerError("", f"{self.target} returned shape {list(rewards.shape)} for {len(sample_ids)} "
                              f"samples; return {what}")
        return check_rewards(rewards, sample_ids)


def build(spec, params: PythonParams, *, threads: int, field: str) -> PythonScorer:
    """A `PythonScorer` of `params.function`. Raises ValueError naming `field.params.function` (`load_function`)."""
    return PythonScorer(load_function(params.function, f"{field}.params.function"), params.function, params.call)


def check_environment(params: PythonParams, field: str) -> None:
    """The function imports here and is callable (`omnirl run`'s pre-flight, `omnirl validate`, the reward role)."""
    load_function(params.function, f"{field}.params.function")


KIND = register_kind(RewardKind(name="python", params=PythonParams, build=build, check_environment=check_environment))

"""The extension axes as the spec sees them: model families and reward kinds, by name, with their capabilities.

A model family is one adapter module that registers itself (`omnirl.models.families.register_family`); a reward
kind is one module that registers itself with its params class (`omnirl.scorers.kinds.register_kind`). The spec
is torch-free and the lowest import layer, so it cannot import those modules to learn their names: it reads
`extensions_generated.py`, the table `python -m omnirl.extensions --write` (`make crd`) writes from the
registrations, which `tests/api/test_extensions.py` regenerates and compares (it fails when the table is stale).
How to add a family or a reward kind: docs/extending.md.

The one reach upward is `params_model`: a reward kind's params class lives in its kind module (which imports only
pydantic and `omnirl.api` at its top: the operator image has nothing else), imported by the module path the table
holds when a manifest names that kind.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Literal, TypeVar

from omnirl.api.extensions_generated import FAMILIES as _FAMILY_TABLE
from omnirl.api.extensions_generated import REWARD_KINDS as _KIND_TABLE

if TYPE_CHECKING:
    from omnirl.api._base import SpecModel

T = TypeVar("T")

Modality = Literal["image", "video", "audio"]
"""What a family's samples are and what a reward kind scores (rollout output: `[B, H, W, 3]` uint8 images today)."""
Runs = Literal["in-process", "remote", "group"]
"""Where a reward kind scores: `in-process` in the reward workers, `remote` through an endpoint (`url` or a
`server` the job runs), `group` in the controller on a whole prompt group."""
Endpoint = Literal["http", "grpc", "openai"]
"""How a remote kind is reached: `http` an http(s) URL of the scorer protocol's score endpoint, `grpc` host:port
of the scorer protocol, `openai` the base URL of an OpenAI-compatible API."""
ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "torch", "math")
"""`spec.model.attention` values every family takes; a family adds others it was checked with (`cudnn`)."""


@dataclass(frozen=True)
class FamilyInfo:
    """A model family's name and capabilities, as registered by its adapter module.

    Attributes:
        name: `spec.model.family`.
        module: the adapter module that registers it (imported only when a job uses the family).
        modalities: what its samples are (`Modality`).
        packed: its adapter has `velocity_packed` (samples of several shapes in one forward), so
            `roles.rollout.batching: packed` is allowed.
        attention: the `spec.model.attention` values checked for it (`ATTENTION_BACKENDS` plus e.g. `cudnn`).
        builtin: `model.path: builtin` names weights shipped with omnirl.
        sized: it takes `model.resolution` / `model.resolutions`.
        guidance: it has classifier-free guidance (`algorithm.sampling.guidanceScale` other than 1).
        notes: why a capability is missing, said in the refusal (keys: `sized`, `guidance`, an attention backend).
        media: for a family whose video/audio sizes are the model's own, `{"video": {frames, height, width, fps},
            "audio": {seconds, sampleRate}}` (`spec.model.video` / `audio` must equal them); None: the manifest says.
        parallel: how its transformer splits over a replica's devices (docs/parallel.md): `"ulysses"` (a
            context-parallel plan: `roles.*.parallel.ulysses`), `"tensor"` (a tensor-parallel plan:
            `roles.rollout.parallel.tensor`).
    """

    name: str
    module: str
    modalities: tuple[str, ...] = ("image",)
    packed: bool = False
    attention: tuple[str, ...] = ATTENTION_BACKENDS
    builtin: bool = False
    sized: bool = True
    guidance: bool = True
    notes: dict[str, str] = field(default_factory=dict)
    media: dict[str, dict[str, float]] | None = None
    parallel: tuple[str, ...] = ()

    def as_row(self) -> dict:
        """The table row (`extensions_generated.FAMILIES[name]`): every field but the name, as plain data."""
        return {"module": self.module, "modalities": list(self.modalities), "packed": self.packed,
                "attention": list(self.attention), "builtin": self.builtin, "sized": self.sized,
                "guidance": self.guidance, "notes": dict(sorted(self.notes.items())), "media": self.media,
                "parallel": list(self.parallel)}


@dataclass(frozen=True)
class RewardKindInfo:
    """A reward kind's name and where it runs, as registered by its kind module.

    Attributes:
        name: `spec.reward[].kind`.
        module: the kind module that registers it (and defines its params class).
        params: the params class's name in `module` (`params_model`).
        params_keys: the keys `spec.reward[].params` may hold (for the CRD's description).
        runs: `Runs`.
        endpoint: `Endpoint` for a remote kind, else None.
        modalities: what it scores (`Modality`).
    """

    name: str
    module: str
    params: str
    params_keys: tuple[str, ...] = ()
    runs: str = "in-process"
    endpoint: str | None = None
    modalities: tuple[str, ...] = ("image",)

    def as_row(self) -> dict:
        """The table row (`extensions_generated.REWARD_KINDS[name]`): every field but the name, as plain data."""
        return {"module": self.module, "params": self.params, "params_keys": list(self.params_keys),
                "runs": self.runs, "endpoint": self.endpoint, "modalities": list(self.modalities)}


def _family(name: str, row: dict) -> FamilyInfo:
    return FamilyInfo(name=name, module=row["module"], modalities=tuple(row["modalities"]), packed=row["packed"],
                      attention=tuple(row["attention"]), builtin=row["builtin"], sized=row["sized"],
                      guidance=row["guidance"], notes=dict(row["notes"]), media=row.get("media"),
                      parallel=tuple(row.get("parallel", ())))


def _kind(name: str, row: dict) -> RewardKindInfo:
    return RewardKindInfo(name=name, module=row["module"], params=row["params"], params_keys=tuple(row["params_keys"]),
                          runs=row["runs"], endpoint=row["endpoint"], modalities=tuple(row["modalities"]))


FAMILIES: dict[str, FamilyInfo] = {name: _family(name, row) for name, row in _FAMILY_TABLE.items()}
"""Every model family, by name (the table's order: sorted, the built-in first)."""
REWARD_KINDS: dict[str, RewardKindInfo] = {name: _kind(name, row) for name, row in _KIND_TABLE.items()}
"""Every reward kind, by name (the table's order)."""
FAMILY_NAMES: tuple[str, ...] = tuple(FAMILIES)
REWARD_KIND_NAMES: tuple[str, ...] = tuple(REWARD_KINDS)


def families_with(capability: str, value: object = True) -> tuple[str, ...]:
    """Names of the families whose `FamilyInfo.<capability>` is `value` (or holds it, for a tuple capability:
    `families_with("attention", "cudnn")`), in table order."""
    def has(info: FamilyInfo) -> bool:
        got = getattr(info, capability)
        return value in got if isinstance(got, tuple) else got == value
    return tuple(name for name, info in FAMILIES.items() if has(info))


def kinds_with(capability: str, value: object) -> tuple[str, ...]:
    """Names of the reward kinds whose `RewardKindInfo.<capability>` is `value` (`kinds_with("runs", "group")`)."""
    return tuple(name for name, info in REWARD_KINDS.items() if getattr(info, capability) == value)


@cache
def params_model(kind: str) -> type[SpecModel]:
    """The params class of reward kind `kind` (`spec.reward[].params` is checked against it).

    Imports the kind's module (pydantic and `omnirl.api` only at its top; `tests/api/test_extensions.py` checks it).
    Raises:
        KeyError: an unknown kind (the spec's `kind` Literal refuses it first).
        ImportError / AttributeError: the table names a module or class that is not there (a stale table).
    """
    info = REWARD_KINDS[kind]
    return getattr(importlib.import_module(info.module), info.params)


def import_registered(name: str, table: Mapping[str, FamilyInfo | RewardKindInfo], registered: Mapping[str, T], *,
                      unknown: str, what: str) -> T:
    """What `name`'s module registered (`registered[name]`), importing that module (and only it) from `table`
    (`FAMILIES` or `REWARD_KINDS`): `omnirl.models.families.get_family` and `omnirl.scorers.kinds.get_kind`.

    Args:
        unknown: the name as a field in the unknown-name error (`model.family`); what: as a noun (`model family`).
    Raises:
        ValueError: a name not in `table` (the message lists the supported ones), or a module that does not
            register it (a stale table: `python -m omnirl.extensions --write`).
    """
    if name not in table:
        raise ValueError(f"unknown {unknown} {name!r}; supported: {', '.join(table)}")
    importlib.import_module(table[name].module)
    if name not in registered:
        raise ValueError(f"{what} {name!r}: {table[name].module} does not register it; the table "
                         "omnirl/api/extensions_generated.py is stale (python -m omnirl.extensions --write)")
    return registered[name]

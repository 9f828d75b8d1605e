"""The model-family registry: one adapter module per family registers itself with `register_family`.

A family is a class (its adapter class, or a small class beside a function-built adapter) decorated with
`@register_family(name, **capabilities)`: the capabilities are what the spec checks a manifest against
(`omnirl.api.extensions.FamilyInfo`), the class's members are what the roles, pre-flight and export call
(`Family`). `get_family(name)` imports only that family's module, named by the spec's generated table
(`omnirl.api.extensions_generated`, written by `python -m omnirl.extensions --write`). How to add one:
docs/extending.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from omnirl.api.extensions import ATTENTION_BACKENDS, FAMILIES, FamilyInfo, import_registered

if TYPE_CHECKING:
    import torch
    from torch import nn

    from omnirl.api.spec import RLJob, RLJobSpec
    from omnirl.models.protocol import ModelAdapter


class Family(Protocol):
    """What a registered family class provides (class or static methods; `DiffusersAdapterBase` has all but `load`).

    Attributes:
        family: the family's name (set by `register_family`).
        info: its `FamilyInfo` (set by `register_family`).
        default_lora_targets: layer-name suffixes LoRA adapts when `spec.model.lora.targetModules` is empty.
        merges_lora: its export merges LoRA into the weights (else it writes the adapters alone).
    """

    family: str
    info: FamilyInfo
    default_lora_targets: Sequence[str]
    merges_lora: bool

    def load(self, path: str, device: torch.device | str, dtype: torch.dtype, **options) -> ModelAdapter:
        """The adapter from the local directory `path` (nothing is downloaded); `options` from `adapter_options`."""

    def load_tokenizer(self, path: str) -> Callable[[str], list[int]]:
        """Text → token ids from the tokenizers alone (the controller's), equal to the adapter's `tokenize`."""

    def check_weights(self, path: str) -> object:
        """Raise FileNotFoundError naming the first weights file `load` would read that is missing."""

    def lora_skeleton(self, path: str) -> nn.Module:
        """The trainable module built from its config alone, called under `torch.device("meta")` (LoRA targets)."""

    def adapter_options(self, spec: RLJobSpec) -> dict:
        """The `load` options an RLJob sets (rollout, actor and eval load alike)."""

    def describe_default_grid(self, spec: RLJobSpec) -> str:
        """The `omnirl validate` line of the family's own σ grid (no `algorithm.sampling.shift` override)."""

    def export_weights(self, job: RLJob, policy: Path, lora: bool, out: Path, state: dict) -> list[str]:
        """Write the checkpoint's `policy` (safetensors) into `out` in the form users load; the files written."""


_REGISTERED: dict[str, type] = {}


def register_family(name: str, *, modalities: Sequence[str] = ("image",), packed: bool = False,
                    attention: Sequence[str] = (), builtin: bool = False, sized: bool = True, guidance: bool = True,
                    notes: dict[str, str] | None = None, media: dict[str, dict[str, float]] | None = None,
                    parallel: Sequence[str] = ()) -> Callable[[type], type]:
    """Class decorator: register the class as model family `name` with its capabilities (`FamilyInfo`).

    Args:
        name: `spec.model.family` (lowercase, `-` between words).
        modalities, packed, builtin, sized, guidance, notes, media, parallel: as `FamilyInfo`.
        attention: attention backends checked for it beyond `ATTENTION_BACKENDS` (e.g. `("cudnn",)`).
    Raises:
        ValueError: `name` already registered by another class.
    """
    def wrap(cls: type) -> type:
        if name in _REGISTERED and _REGISTERED[name] is not cls:
            raise ValueError(f"model family {name!r} is registered twice: {_REGISTERED[name].__module__} and "
                             f"{cls.__module__}")
        cls.family = name
        cls.info = FamilyInfo(name=name, module=cls.__module__, modalities=tuple(modalities), packed=packed,
                              attention=ATTENTION_BACKENDS + tuple(a for a in attention if a not in ATTENTION_BACKENDS),
                              builtin=builtin, sized=sized, guidance=guidance, notes=dict(notes or {}), media=media,
                              parallel=tuple(parallel))
        _REGISTERED[name] = cls
        return cls
    return wrap


def get_family(name: str) -> Family:
    """The registered class of family `name`, importing its module (and only it).

    Raises:
        ValueError: an unknown family (the message lists the supported ones), or a module that does not
            register it (a stale table: `python -m omnirl.extensions --write`).
    """
    return import_registered(name, FAMILIES, _REGISTERED, unknown="model.family", what="model family")


def registered_families() -> dict[str, type]:
    """Every family registered by the modules imported so far (`omnirl.extensions` imports them all)."""
    return dict(_REGISTERED)

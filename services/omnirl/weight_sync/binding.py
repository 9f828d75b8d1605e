"""Binding received tensors into a rollout worker's module, by exact name, and proving it happened.

The failure this guards against (references/algorithms.md, "Silent failures users hit"): an engine
renamed its fused projection, the LoRA update bound zero modules, and rollout kept sampling the base
policy. Here every received name must land on exactly one parameter/buffer of the module, every
module name the sync is responsible for must be received, every tensor's checksum is verified on
arrival (transport), and each slot is compared with what arrived after the copy (binding).
Anything else raises `BindingError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from omnirl.api.spec import is_lora_tensor
from omnirl.weight_sync.errors import BindingError
from omnirl.weight_sync.manifest import SCOPE_FULL, scope_of, tensor_checksum

NameMap = Callable[[str], str]
_SHOW = 12  # names listed in an error message before "... and N more"


@dataclass(frozen=True)
class BindReport:
    """What one receiver bound for one policy_version (also the JSON ack it writes).

    Attributes:
        version: policy_version of the weights.
        modules_updated: distinct modules (owner of each bound parameter/buffer) that received data.
        tensors_updated: parameters/buffers overwritten.
        checksum_ok: every tensor matched its manifest checksum on arrival, and every slot equals
            what arrived after the copy (byte for byte, after casting to the slot's dtype).
        missing: module names the sync was responsible for but did not deliver (sync scope
            ``full``: every state_dict entry; ``adapters``: every entry containing ``lora_``).
        unexpected: received names with no matching slot (``"name -> mapped"`` when renamed by the
            name map; ``"name (shape ...)"`` on a shape mismatch; ``"name (duplicate target)"``).
        mismatched: names whose checksum did not match.
        shards: of the tensors updated, those this rank holds a shard of (a tensor-parallel replica's split
            weights: it kept and verified its part, `held_part`); 0 for a replica that holds whole weights.
    """

    version: int
    modules_updated: int
    tensors_updated: int
    checksum_ok: bool
    missing: list[str]
    unexpected: list[str]
    mismatched: list[str] = field(default_factory=list)
    shards: int = 0

    @property
    def ok(self) -> bool:
        """True when the bind is complete and exact (the only state a worker may sample from)."""
        return self.tensors_updated > 0 and self.checksum_ok and not self.missing and not self.unexpected

    @property
    def mismatch(self) -> bool:
        """The sent names or shapes do not fit the module (nothing bound, missing or unexpected names):
        the actor's and the rollout's models differ, which every retry and restart meets again. A
        checksum mismatch alone (data damaged on the way) is not one."""
        return self.tensors_updated == 0 or bool(self.missing) or bool(self.unexpected)

    def problem(self) -> str:
        """One line naming the offending modules and tensors ('' when `ok`)."""
        if self.ok:
            return ""
        parts = []
        if self.tensors_updated == 0:
            parts.append("bound 0 tensors (0 modules)")
        for label, names in (("unexpected", self.unexpected), ("missing", self.missing),
                             ("checksum mismatch", self.mismatched)):
            if names:
                parts.append(f"{label}: {_names(names)}")
        bad = owner_modules(n.split(" ")[0] for n in [*self.unexpected, *self.missing, *self.mismatched])
        if bad:
            parts.append(f"modules: {_names(bad)}")
        return "; ".join(parts)

    def to_json(self) -> str:
        """JSON text of every field."""
        return json.dumps(asdict(self))

    @classmethod
    def from_dict(cls, doc: dict) -> BindReport:
        """Inverse of `to_json` (after json.loads); unknown keys are ignored."""
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


def owner_modules(names: Iterable[str]) -> list[str]:
    """Sorted distinct module paths owning the given tensor names (``a.b.weight`` → ``a.b``)."""
    return sorted({n.rsplit(".", 1)[0] if "." in n else "<root>" for n in names})


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOW])
    return shown + (f" ... and {len(names) - _SHOW} more" if len(names) > _SHOW else "")


@dataclass
class BindingPlan:
    """Where each received name goes; built from the manifest before any byte arrives.

    Attributes:
        targets: received name → destination parameter/buffer of the module.
        target_names: received name → module name it binds to (after the name map).
        missing / unexpected: as in `BindReport`.
    """

    targets: dict[str, torch.Tensor]
    target_names: dict[str, str]
    missing: list[str]
    unexpected: list[str]

    @property
    def ok(self) -> bool:
        """No unexpected or missing name and at least one target."""
        return bool(self.targets) and not self.missing and not self.unexpected


def plan_binding(module: nn.Module, shapes: dict[str, list[int]], scope: str,
                 name_map: NameMap | None = None) -> BindingPlan:
    """Match received names (→ their shapes) to the module's parameters and buffers by exact name.

    Args:
        module: the receiving model.
        shapes: received name → shape.
        scope: ``"full"`` (every state_dict entry must be received) or ``"adapters"`` (every entry
            whose name contains ``lora_``).
        name_map: optional rename (sender name → this module's name), for engines whose module
            names differ (e.g. a fused qkv). It must be one-to-one.
    """
    slots = dict(module.named_parameters(remove_duplicate=False))
    slots.update(module.named_buffers(remove_duplicate=False))
    targets: dict[str, torch.Tensor] = {}
    target_names: dict[str, str] = {}
    unexpected: list[str] = []
    for name, shape in shapes.items():
        mapped = name_map(name) if name_map is not None else name
        label = name if mapped == name else f"{name} -> {mapped}"
        if mapped not in slots:
            unexpected.append(label)
        elif mapped in target_names.values():
            unexpected.append(f"{label} (duplicate target)")
        elif list(slots[mapped].shape) != list(shape):
            unexpected.append(f"{label} (shape {list(shape)} vs module {list(slots[mapped].shape)})")
        else:
            targets[name] = slots[mapped]
            target_names[name] = mapped
    expected = {n for n in module.state_dict() if scope == SCOPE_FULL or is_lora_tensor(n)}
    missing = sorted(expected - set(target_names.values()))
    return BindingPlan(targets, target_names, missing, sorted(unexpected))


def copy_verified(plan: BindingPlan, name: str, received: torch.Tensor, checksum: str | None) -> bool:
    """Copy one received tensor into its slot, checking its checksum before and its content after.

    A slot split over a tensor-parallel replica's ranks (a `DTensor`) takes the part it holds (`held_part`).

    Returns:
        False (and nothing copied) when the arrived bytes do not match `checksum`; False when the
        slot after the copy does not hold the received tensor's bytes (the part it holds, cast to the
        slot's dtype and device); True otherwise. `checksum` None skips the arrival check.
    """
    if checksum is not None and tensor_checksum(received) != checksum:
        return False
    dst, part = held_part(plan.targets[name], received)
    with torch.no_grad():
        dst.copy_(part)
    return _bit_equal(dst, part.to(device=dst.device, dtype=dst.dtype))


def held_part(slot: torch.Tensor, full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the tensor this rank holds of `slot`, the part of the received `full` tensor it holds).

    A plain slot holds all of it. A `DTensor` slot (a tensor-parallel rollout replica's split weight) holds its
    local shard: the slice of `full` at the shard's offsets (`compute_local_shape_and_global_offset`, torch's
    own rule for which rows a rank holds), copied into the shard's local tensor. Each rank of a sharded replica
    thereby keeps what it holds and verifies that part (docs/parallel.md)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(slot, DTensor):
        return slot, full
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(slot.shape, slot.device_mesh, slot.placements)
    part = full
    for dim, (size, start) in enumerate(zip(shape, offset, strict=True)):
        if size != full.shape[dim]:
            part = part.narrow(dim, start, size)
    return slot.to_local(), part


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same bytes (unlike `torch.equal`, NaN equals the same NaN); a and b share dtype and device."""
    return torch.equal(a.detach().contiguous().reshape(-1).view(torch.uint8),
                       b.detach().contiguous().reshape(-1).view(torch.uint8))


def finish_report(version: int, plan: BindingPlan, bound: list[str], mismatched: list[str]) -> BindReport:
    """The `BindReport` of a bind: counts from the names actually copied."""
    from torch.distributed.tensor import DTensor

    mapped = [plan.target_names[n] for n in bound]
    return BindReport(version=version, modules_updated=len(owner_modules(mapped)), tensors_updated=len(bound),
                      checksum_ok=not mismatched, missing=plan.missing, unexpected=plan.unexpected,
                      mismatched=sorted(mismatched), shards=sum(isinstance(plan.targets[n], DTensor) for n in bound))


def apply_to_module(module: nn.Module, named_tensors: dict[str, torch.Tensor], *,
                    name_map: NameMap | None = None, checksums: dict[str, str] | None = None,
                    version: int = -1, scope: str | None = None) -> BindReport:
    """Copy `named_tensors` into `module`'s parameters/buffers by exact name, and verify the bind.

    Nothing is copied when a name is unexpected or missing (the module keeps its old weights).

    Args:
        module: destination (any device; tensors are copied across devices and cast to its dtypes).
        named_tensors: name → tensor, e.g. from `named_trainable_tensors` or a received bucket.
        name_map: optional rename sender name → module name (one-to-one).
        checksums: name → expected `tensor_checksum`; None computes them from `named_tensors`
            (then only the post-copy check can fail).
        version: policy_version written into the report.
        scope: ``"full"``/``"adapters"``; None infers it (`scope_of`: all names LoRA → adapters).

    Returns:
        The `BindReport` (always ``ok`` when returned).

    Raises:
        BindingError: zero tensors bound, any missing/unexpected name, or a checksum mismatch; its
            ``report`` holds the details and its message names the modules.
    """
    shapes = {n: list(t.shape) for n, t in named_tensors.items()}
    plan = plan_binding(module, shapes, scope or scope_of(named_tensors), name_map)
    bound: list[str] = []
    mismatched: list[str] = []
    if plan.ok:
        for name, t in named_tensors.items():
            want = checksums[name] if checksums is not None else tensor_checksum(t)
            (bound if copy_verified(plan, name, t, want) else mismatched).append(name)
    report = finish_report(version, plan, bound, mismatched)
    if not report.ok:
        raise BindingError(f"weight binding failed for policy_version {version}: {report.problem()}",
                           report=report)
    return report

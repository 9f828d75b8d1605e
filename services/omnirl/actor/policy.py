"""The three policies an update needs — trained θ, reference, and old — over one adapter.

- θ: the adapter's module (all weights, or LoRA adapters injected with peft).
- reference (KL anchor): LoRA off, or a frozen copy of the base module for full fine-tuning.
- old (DiffusionNFT's v_old, the rollout policy; AWM's EMA anchor, not rolled out): a second
  LoRA adapter named "old", or a copy of the module; refreshed by copy or EMA
  (`omnirl.algorithms.old_policy_decay`).

Rollout workers build the same structure with `omnirl.models.lora.prepare_rollout_module`, so
the tensor names the actor broadcasts are the names the workers bind (DESIGN.md §7).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from omnirl.actor.fsdp import shard_model
from omnirl.actor.ranks import SINGLE, Ranks
from omnirl.algorithms import ema_update_
from omnirl.api.spec import LoRASpec
from omnirl.models.compile import compile_adapter_module
from omnirl.models.lora import DEFAULT, inject_lora, lora_tensors, tuner_layers
from omnirl.models.protocol import ModelAdapter

OLD = "old"


class PolicySet:
    """θ, reference and old policies over one adapter.

    Args:
        adapter: the model; its module becomes θ (trainable).
        lora: LoRA settings (off → all weights train).
        need_ref: keep a reference policy (KL coefficient > 0).
        need_old: keep an old policy (DiffusionNFT's v_old, AWM's EMA anchor).
        rollout_old: rollout samples from the old policy (DiffusionNFT); default `need_old`.
            AWM keeps an old policy but rolls out θ.
    """

    def __init__(self, adapter: ModelAdapter, lora: LoRASpec, *, need_ref: bool, need_old: bool,
                 rollout_old: bool | None = None) -> None:
        self.adapter = adapter
        self.lora = lora.enabled
        module = adapter.module
        if self.lora:
            targets = lora.targetModules or adapter.lora_target_modules
            module.requires_grad_(False)
            inject_lora(module, lora, targets)
            if need_old:
                inject_lora(module, lora, targets, adapter_name=OLD)
                self._copy_lora(DEFAULT, OLD)
                for m in tuner_layers(module):  # injecting "old" made it the active adapter: θ is
                    m.set_adapter(DEFAULT)
            for name, p in module.named_parameters():
                p.requires_grad_("lora_" in name and f".{DEFAULT}." in name)
            self._ref_adapter = self._old_adapter = None
        else:
            module.requires_grad_(True)
            self._ref_adapter = self._frozen_copy() if need_ref else None
            self._old_adapter = self._frozen_copy() if need_old else None
        self.has_ref, self.has_old = need_ref, need_old
        self.rollout_old = need_old if rollout_old is None else rollout_old
        if self.rollout_old and not need_old:
            raise ValueError("rollout_old=True needs need_old=True (there is no old policy to roll out)")
        self.ranks = SINGLE
        module.train()

    # ------------------------------------------------------------------ views
    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters the optimiser updates."""
        return [p for p in self.adapter.module.parameters() if p.requires_grad]

    @contextmanager
    def reference(self) -> Iterator[ModelAdapter]:
        """An adapter computing the reference velocity (no grad inside)."""
        if not self.has_ref:
            raise RuntimeError("reference policy requested but need_ref=False")
        with torch.no_grad():
            if self.lora:
                layers = tuner_layers(self.adapter.module)
                for m in layers:
                    m.enable_adapters(False)
                try:
                    yield self.adapter
                finally:
                    for m in layers:
                        m.enable_adapters(True)
            else:
                yield self._ref_adapter

    @contextmanager
    def old(self) -> Iterator[ModelAdapter]:
        """An adapter computing the old policy's velocity v_old (no grad inside)."""
        if not self.has_old:
            raise RuntimeError("old policy requested but need_old=False")
        with torch.no_grad():
            if self.lora:
                layers = tuner_layers(self.adapter.module)
                for m in layers:
                    m.set_adapter(OLD)
                try:
                    yield self.adapter
                finally:
                    for m in layers:
                        m.set_adapter(DEFAULT)
                    # set_adapter marks the active adapter trainable; restore θ-only training
                    for name, p in self.adapter.module.named_parameters():
                        p.requires_grad_("lora_" in name and f".{DEFAULT}." in name)
            else:
                yield self._old_adapter

    def shard(self, ranks: Ranks, block_types: list[str] | None) -> None:
        """FSDP2-shard θ's module and the frozen copies over the actor ranks (`omnirl.actor.fsdp`).

        Call before building the optimizer. Afterwards the tensor views below gather full tensors
        (collectives: every rank calls them in the same order).
        """
        for a in [self.adapter] + [a for a in (self._ref_adapter, self._old_adapter) if a is not None]:
            shard_model(a.module, ranks.world, block_types=block_types)
        self.ranks = ranks

    def compile(self) -> int:
        """Regionally compile θ's module and the frozen copies (`omnirl.models.compile`); returns
        the number of blocks compiled. Call once, after construction (LoRA is injected by then)."""
        adapters = [self.adapter] + [a for a in (self._ref_adapter, self._old_adapter) if a is not None]
        return sum(compile_adapter_module(a) for a in adapters)

    # ------------------------------------------------------------------ state
    def refresh_old(self, decay: float) -> None:
        """θ_old ← decay·θ_old + (1 − decay)·θ (decay 0 = copy)."""
        if self.lora:
            old = lora_tensors(self.adapter.module, OLD)
            new = lora_tensors(self.adapter.module, DEFAULT)
            ema_update_([old[k] for k in sorted(old)], [new[k] for k in sorted(new)], decay)
        else:
            ema_update_(list(self._old_adapter.module.parameters()),
                        list(self.adapter.module.parameters()), decay)

    @property
    def rollout_adapter(self) -> ModelAdapter:
        """The adapter rollout samples from: the old policy's copy (full-weight DiffusionNFT), else θ's.

        With LoRA the old policy is an adapter inside θ's module; use `old()` to evaluate it.
        """
        return self._old_adapter if self.rollout_old and self._old_adapter is not None else self.adapter

    def rollout_tensors(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """What rollout workers must hold: the old policy when rollout samples from it, else θ.

        Names are the rollout module's names (LoRA adapter named `default`); values detached.
        """
        if self.lora:
            named = lora_tensors(self.adapter.module, OLD if self.rollout_old else DEFAULT)
        else:
            named = (self._old_adapter.module if self.rollout_old else self.adapter.module).state_dict()
        return {k: v.detach() for k, v in self.ranks.full(named, keep).items()}

    def trained_tensors(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """θ's trainable tensors (LoRA adapters or the whole state dict), detached."""
        named = lora_tensors(self.adapter.module, DEFAULT) if self.lora else self.adapter.module.state_dict()
        return {k: v.detach() for k, v in self.ranks.full(named, keep).items()}

    def load_trained_tensors(self, tensors: dict[str, torch.Tensor], old: dict[str, torch.Tensor] | None) -> None:
        """Restore θ (and the old policy) from a checkpoint. Raises KeyError on a name mismatch."""
        _load_exact(self.named_tensors(DEFAULT), tensors)
        if self.has_old and old is not None:
            _load_exact(self.named_tensors(OLD), old)

    def named_tensors(self, which: str) -> dict[str, torch.Tensor]:
        """θ's (`default`) or the old policy's (`old`) tensors by rollout-module name (live, not copies)."""
        if self.lora:
            return lora_tensors(self.adapter.module, which)
        module = self._old_adapter.module if which == OLD else self.adapter.module
        return dict(module.state_dict())

    def _copy_lora(self, src: str, dst: str) -> None:
        a, b = lora_tensors(self.adapter.module, src), lora_tensors(self.adapter.module, dst)
        with torch.no_grad():
            for k in a:
                b[k].copy_(a[k])

    def _frozen_copy(self) -> ModelAdapter:
        other = copy.copy(self.adapter)
        other.module = copy.deepcopy(self.adapter.module).requires_grad_(False).eval()
        return other


def _load_exact(target: dict[str, torch.Tensor], source: dict[str, torch.Tensor]) -> None:
    missing = sorted(set(target) - set(source))
    unexpected = sorted(set(source) - set(target))
    if missing or unexpected:
        raise KeyError(f"checkpoint tensors do not match the model: missing={missing[:5]} unexpected={unexpected[:5]}")
    from torch.distributed.tensor import DTensor, distribute_tensor

    with torch.no_grad():
        for k, t in target.items():
            src = source[k]
            if isinstance(t, DTensor):  # a sharded parameter takes this rank's shard of the full tensor
                src = distribute_tensor(src.to(t.device, t.dtype), t.device_mesh, t.placements)
            t.copy_(src)

"""The three policies an update needs — trained θ, reference, and old — over one adapter.

- θ: the adapter's module (all weights, or LoRA adapters injected with peft).
- reference (KL anchor): LoRA off, or a frozen copy of the base module for full fine-tuning.
- old (DiffusionNFT's v_old, the rollout policy; AWM's EMA anchor, not rolled out): a second
  LoRA adapter named "old", or a copy of the module; refreshed by copy or EMA
  (`omnirl.algorithms.old_policy_decay`).

Rollout workers build the same structure with `omnirl.models.lora.prepare_rollout_module`, so
the tensor names the actor broadcasts are the names the workers bind (docs/architecture.md §3 "Weight sync").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import nn

from omnirl.actor.fsdp import hsdp_mesh, shard_model
from omnirl.actor.ranks import SINGLE, Ranks
from omnirl.algorithms import ema_update_
from omnirl.api.spec import LoRASpec, is_lora_tensor
from omnirl.models.compile import compile_adapter_module
from omnirl.models.lora import DEFAULT, inject_lora, lora_tensors, tuner_layers
from omnirl.models.protocol import ModelAdapter

OLD = "old"


class _LoRAWeights:
    """θ, reference and old inside one module: θ the LoRA adapter `default`, the reference the
    base weights (adapters disabled), the old policy a second adapter `old`. Only θ's adapter trains."""

    def __init__(self, adapter: ModelAdapter, lora: LoRASpec, need_old: bool) -> None:
        self.adapter = adapter
        module = adapter.module
        targets = lora.targetModules or adapter.lora_target_modules
        module.requires_grad_(False)
        inject_lora(module, lora, targets)
        if need_old:
            inject_lora(module, lora, targets, adapter_name=OLD)
            _copy(lora_tensors(module, DEFAULT), lora_tensors(module, OLD))
            for m in tuner_layers(module):  # injecting "old" made it the active adapter: θ is
                m.set_adapter(DEFAULT)
        self._train_theta_only()
        self.copies: list[ModelAdapter] = []  # nothing outside θ's module
        self.old_copy = None

    def _train_theta_only(self) -> None:
        for name, p in self.adapter.module.named_parameters():
            p.requires_grad_(is_lora_tensor(name) and f".{DEFAULT}." in name)

    @contextmanager
    def _switched(self, enter: Callable[[nn.Module], object], leave: Callable[[nn.Module], object]
                  ) -> Iterator[ModelAdapter]:
        layers = tuner_layers(self.adapter.module)
        for m in layers:
            enter(m)
        try:
            yield self.adapter
        finally:
            for m in layers:
                leave(m)

    def reference(self) -> AbstractContextManager[ModelAdapter]:
        return self._switched(lambda m: m.enable_adapters(False), lambda m: m.enable_adapters(True))

    @contextmanager
    def old(self) -> Iterator[ModelAdapter]:
        try:
            with self._switched(lambda m: m.set_adapter(OLD), lambda m: m.set_adapter(DEFAULT)) as adapter:
                yield adapter
        finally:
            self._train_theta_only()  # set_adapter marks the active adapter trainable

    def named(self, which: str) -> dict[str, torch.Tensor]:
        return lora_tensors(self.adapter.module, which)

    def ema_pairs(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        old, new = self.named(OLD), self.named(DEFAULT)
        return [old[k] for k in sorted(old)], [new[k] for k in sorted(new)]


class _FullWeights:
    """θ the whole module (every weight trains); reference and old frozen deep copies of it."""

    def __init__(self, adapter: ModelAdapter, need_ref: bool, need_old: bool) -> None:
        self.adapter = adapter
        adapter.module.requires_grad_(True)
        self._ref = self._frozen_copy() if need_ref else None
        self._old = self._frozen_copy() if need_old else None
        self.copies = [a for a in (self._ref, self._old) if a is not None]
        self.old_copy = self._old

    def _frozen_copy(self) -> ModelAdapter:
        other = copy.copy(self.adapter)
        other.module = copy.deepcopy(self.adapter.module).requires_grad_(False).eval()
        return other

    @contextmanager
    def reference(self) -> Iterator[ModelAdapter]:
        yield self._ref

    @contextmanager
    def old(self) -> Iterator[ModelAdapter]:
        yield self._old

    def named(self, which: str) -> dict[str, torch.Tensor]:
        return dict((self._old if which == OLD else self.adapter).module.state_dict())

    def ema_pairs(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        return list(self._old.module.parameters()), list(self.adapter.module.parameters())


class PolicySet:
    """θ, reference and old policies over one adapter.

    Where they live (LoRA adapters in θ's module, or frozen copies of it) is one weights-layout
    object chosen here; the methods below never ask which.

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
        self.has_ref, self.has_old = need_ref, need_old
        self.rollout_old = need_old if rollout_old is None else rollout_old
        if self.rollout_old and not need_old:
            raise ValueError("rollout_old=True needs need_old=True (there is no old policy to roll out)")
        self._weights = _LoRAWeights(adapter, lora, need_old) if self.lora else _FullWeights(adapter, need_ref, need_old)
        self.ranks = SINGLE
        adapter.module.train()

    # ------------------------------------------------------------------ views
    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters the optimiser updates."""
        return [p for p in self.adapter.module.parameters() if p.requires_grad]

    @contextmanager
    def reference(self) -> Iterator[ModelAdapter]:
        """An adapter computing the reference velocity (no grad inside)."""
        if not self.has_ref:
            raise RuntimeError("reference policy requested but need_ref=False")
        with torch.no_grad(), self._weights.reference() as adapter:
            yield adapter

    @contextmanager
    def old(self) -> Iterator[ModelAdapter]:
        """An adapter computing the old policy's velocity v_old (no grad inside)."""
        if not self.has_old:
            raise RuntimeError("old policy requested but need_old=False")
        with torch.no_grad(), self._weights.old() as adapter:
            yield adapter

    def shard(self, ranks: Ranks, block_types: list[str] | None, *, replicate: int = 1) -> None:
        """FSDP2-shard θ's module and the frozen copies over the actor ranks (`omnirl.actor.fsdp`; HSDP over
        `replicate` groups), after splitting their tokens over `ranks.ulysses` ranks (diffusers' context-parallel
        hooks, `omnirl.models.parallel.ulysses`; docs/parallel.md).

        Call before building the optimizer. Afterwards the tensor views below gather full tensors
        (collectives: every rank calls them in the same order).
        """
        modules = [a.module for a in [self.adapter, *self._weights.copies]]
        if ranks.ulysses > 1:
            from omnirl.models.parallel.ulysses import enable_ulysses, ulysses_mesh

            mesh = ulysses_mesh(ranks.ulysses, torch.device(ranks.device).type, data_parallel=ranks.dp_world)
            for module in modules:
                enable_ulysses(module, mesh)
        fsdp_mesh = ranks.world if replicate == 1 else hsdp_mesh(ranks, replicate)
        for module in modules:
            shard_model(module, fsdp_mesh, block_types=block_types)
        self.ranks = ranks

    def compile(self) -> int:
        """Regionally compile θ's module and the frozen copies (`omnirl.models.compile`); returns
        the number of blocks compiled. Call once, after construction (LoRA is injected by then)."""
        return sum(compile_adapter_module(a) for a in [self.adapter, *self._weights.copies])

    # ------------------------------------------------------------------ state
    def refresh_old(self, decay: float) -> None:
        """θ_old ← decay·θ_old + (1 − decay)·θ (decay 0 = copy)."""
        ema_update_(*self._weights.ema_pairs(), decay)

    @property
    def rollout_adapter(self) -> ModelAdapter:
        """The adapter rollout samples from: the old policy's copy (full-weight DiffusionNFT), else θ's.

        With LoRA the old policy is an adapter inside θ's module; use `old()` to evaluate it.
        """
        copy_ = self._weights.old_copy
        return copy_ if self.rollout_old and copy_ is not None else self.adapter

    def rollout_tensors(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """What rollout workers must hold: the old policy when rollout samples from it, else θ.

        Names are the rollout module's names (LoRA adapter named `default`); values detached.
        """
        named = self.named_tensors(OLD if self.rollout_old else DEFAULT)
        return {k: v.detach() for k, v in self.ranks.full(named, keep).items()}

    def trained_tensors(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """θ's trainable tensors (LoRA adapters or the whole state dict), detached."""
        return {k: v.detach() for k, v in self.ranks.full(self.named_tensors(DEFAULT), keep).items()}

    def load_trained_tensors(self, tensors: dict[str, torch.Tensor], old: dict[str, torch.Tensor] | None) -> None:
        """Restore θ (and the old policy) from a checkpoint. Raises KeyError on a name mismatch."""
        _load_exact(self.named_tensors(DEFAULT), tensors)
        if self.has_old and old is not None:
            _load_exact(self.named_tensors(OLD), old)

    def named_tensors(self, which: str) -> dict[str, torch.Tensor]:
        """θ's (`default`) or the old policy's (`old`) tensors by rollout-module name (live, not copies)."""
        return self._weights.named(which)


def _copy(src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for k in src:
            dst[k].copy_(src[k])


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

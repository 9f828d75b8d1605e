"""The actor's half of the algorithm protocol: what one RL algorithm decides, so core classes never branch on its name.

An algorithm answers two questions here, one method each:

- `needs(algo)` — which policies the actor keeps (`PolicyNeeds`: reference for a KL, old policy
  and its refresh schedule, which of θ / old the rollout workers sample from).
- `update(...)` — the actor's training step on one complete batch; returns its metrics.

The other half, how its steps are rolled out (`RolloutPlan`), is the controller's and needs no model:
`algorithms/plan.py` (`planner_for(name)`), below the roles.

What every algorithm gets alike (not part of the protocol): the controller's group-relative
advantages (`spec.algorithm.advantage`), one per sample, groups kept whole; validation and
`omnirl eval` sample with the ODE.

The registry is `omnirl.api.spec_algorithm.ALGORITHMS` (name → settings field and
`"module:attribute"` of the algorithm object and of its planner); `algorithm_for(name)` resolves it. Adding an
algorithm touches its settings class, its implementation module and one registry line.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from omnirl.actor.batch import GridOf, TrainSample
from omnirl.actor.policy import PolicySet
from omnirl.actor.ranks import SINGLE, Ranks
from omnirl.api.spec_algorithm import ALGORITHMS, AlgorithmSpec, OldPolicySpec


@dataclass(frozen=True)
class PolicyNeeds:
    """The policies an algorithm's update uses (`PolicySet` builds them).

    Attributes:
        reference: keep the reference (base) policy (a KL to it, or a loss that compares with it).
        old_policy: refresh schedule of the old policy (DiffusionNFT's v_old, AWM's EMA anchor);
            None keeps no old policy.
        rollout_old: rollout workers sample from the old policy instead of θ (DiffusionNFT).
    """

    reference: bool
    old_policy: OldPolicySpec | None = None
    rollout_old: bool = False


class Algorithm(ABC):
    """One RL algorithm (see the module docstring). Subclasses set `name` to their registry key."""

    name: str

    @abstractmethod
    def needs(self, algo: AlgorithmSpec) -> PolicyNeeds:
        """The policies the update needs for these settings."""

    @abstractmethod
    def update(self, policies: PolicySet, optimizer: torch.optim.Optimizer, samples: list[TrainSample],
               algo: AlgorithmSpec, *, seed: int, step: int, grid_of: GridOf, device: torch.device,
               ranks: Ranks = SINGLE) -> dict:
        """Train on one complete batch; return metrics, including `optimizer_steps` (int).

        Args:
            grid_of: latent shape `(C, H, W)` → the rollout σ grid `[N+1]` fp32 of samples of that shape
                (`adapter.sigma_grid(numSteps, shape, shift)`: it depends on the size for families with
                resolution-dependent shifting, and a job may sample several sizes, `model.resolutions`).
            seed: the job seed; every draw derives from it with `step` (`api/seeds.py::derive`).
            step: the training step (0-based).
            ranks: this actor rank; every rank passes the whole batch and returns the same metrics.
        Raises:
            ValueError: a batch the algorithm cannot train on, or a non-finite loss.
        """


def algorithm_for(name: str) -> Algorithm:
    """The registered algorithm object of `name` (`ALGORITHMS[name].implementation`).

    Raises:
        KeyError: `name` is not registered.
        TypeError: the registered object is not an `Algorithm` named `name`.
    """
    if name not in ALGORITHMS:
        raise KeyError(f"algorithm {name!r} is not registered (spec_algorithm.ALGORITHMS: {sorted(ALGORITHMS)})")
    module, _, attr = ALGORITHMS[name].implementation.partition(":")
    obj = getattr(importlib.import_module(module), attr)
    if not isinstance(obj, Algorithm) or obj.name != name:
        raise TypeError(f"ALGORITHMS[{name!r}] = {ALGORITHMS[name].implementation} is not an Algorithm named {name!r}")
    return obj

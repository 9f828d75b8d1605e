"""The rollout half of the algorithm protocol: what the controller sends and rollout records.

An algorithm answers two sets of questions. How its training steps are rolled out — a `RolloutPlan`
per step, decided by the controller, which needs no model — is answered here, below the roles, so the
controller never imports the actor. Which policies the actor keeps and the update itself are the
actor's half (`actor/algorithm.py::Algorithm`). The registry (`api/spec_algorithm.py::ALGORITHMS`)
names both: `plan` (default: the ODE rollout) and `implementation`.

Steps in a plan's window are stochastic and recorded (latents `[W+1, C, H, W]`, log-probs `[W]`);
an empty window is a deterministic (ODE) rollout that records only the final x0. Validation and
`omnirl eval` sample with the ODE whatever the plan.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from omnirl.algorithms.window import select_window
from omnirl.api.spec_algorithm import ALGORITHMS, AlgorithmSpec


@dataclass(frozen=True)
class RolloutPlan:
    """How the rollout engine samples one training step's groups (sent in every `GenerateRequest`).

    Attributes:
        window: 0-based indices of the stochastic, recorded denoising steps (contiguous); () = ODE.
        noise_level: SDE noise level a inside the window (dimensionless; unused without a window).
        sde_type: "sde" (Flow-GRPO SDE) or "cps".
    """

    window: tuple[int, ...] = ()
    noise_level: float = 0.0
    sde_type: str = "sde"


class Planner:
    """One algorithm's rollout plan; this base is the ODE rollout (the update trains on the clean x0 alone)."""

    def rollout(self, algo: AlgorithmSpec, window_seed: int) -> RolloutPlan:
        """The step's rollout plan.

        Args:
            algo: the job's `spec.algorithm`.
            window_seed: the step's seed for random plan choices (FlowGRPO's window start); the
                same for every group of the step.
        """
        return RolloutPlan()


class SDEWindowPlanner(Planner):
    """FlowGRPO's plan: a seeded window of `flowGrpo.window.size` SDE steps (`select_window`), shared by
    every group of the step, with `flowGrpo.noiseLevel` and `sdeType`."""

    def rollout(self, algo: AlgorithmSpec, window_seed: int) -> RolloutPlan:
        """The window `select_window(window_seed, numSteps, size, range)` and FlowGRPO's noise settings."""
        g = algo.flowGrpo
        window = select_window(window_seed, algo.sampling.numSteps, g.window.size, tuple(g.window.range))
        return RolloutPlan(tuple(window), g.noiseLevel, g.sdeType)


ODE = Planner()
FLOW_GRPO = SDEWindowPlanner()


def planner_for(name: str) -> Planner:
    """The registered rollout planner of algorithm `name` (`ALGORITHMS[name].plan`).

    Raises:
        KeyError: `name` is not registered.
        TypeError: the registered object is not a `Planner`.
    """
    if name not in ALGORITHMS:
        raise KeyError(f"algorithm {name!r} is not registered (spec_algorithm.ALGORITHMS: {sorted(ALGORITHMS)})")
    module, _, attr = ALGORITHMS[name].plan.partition(":")
    obj = getattr(importlib.import_module(module), attr)
    if not isinstance(obj, Planner):
        raise TypeError(f"ALGORITHMS[{name!r}].plan = {ALGORITHMS[name].plan} is not a Planner")
    return obj

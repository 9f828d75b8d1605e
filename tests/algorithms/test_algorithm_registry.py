"""The algorithm registry and protocol: one owner of the names, and a new algorithm needs no core edit."""

from __future__ import annotations

import copy

import pydantic
import pytest
import torch
import yaml
from tests.helpers import PROMPTS, requests, tiny_adapter

from omnirl.actor.algorithm import Algorithm, PolicyNeeds, algorithm_for
from omnirl.actor.batch import GridOf, TrainSample
from omnirl.actor.policy import PolicySet
from omnirl.actor.ranks import SINGLE, Ranks
from omnirl.actor.trainer import Trainer
from omnirl.algorithms import select_window
from omnirl.algorithms.plan import Planner, RolloutPlan, planner_for
from omnirl.api.crd import build_crd
from omnirl.api.spec import RLJobSpec
from omnirl.api.spec_algorithm import ALGORITHMS, AlgorithmEntry, AlgorithmSettings, AlgorithmSpec, OldPolicySpec
from omnirl.rollout.engine import RolloutEngine


def _spec(**algorithm) -> RLJobSpec:
    return RLJobSpec.model_validate({"data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}],
                                     "algorithm": algorithm})


def test_every_registered_name_resolves_to_its_algorithm_and_settings():
    assert list(ALGORITHMS) == ["flow-grpo", "diffusion-nft", "awm", "dgpo"]
    for name, entry in ALGORITHMS.items():
        algo = algorithm_for(name)
        assert isinstance(algo, Algorithm) and algo.name == name and isinstance(planner_for(name), Planner)
        spec = _spec(name=name).algorithm
        assert spec.settings() is getattr(spec, entry.settings)
    # every settings block of the spec belongs to exactly one registered algorithm
    blocks = [f for f, info in AlgorithmSpec.model_fields.items()
              if isinstance(info.annotation, type) and issubclass(info.annotation, AlgorithmSettings)]
    assert sorted(blocks) == sorted(e.settings for e in ALGORITHMS.values())


def test_the_spec_and_the_crd_take_their_names_from_the_registry(monkeypatch):
    crd = build_crd()
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    name = schema["properties"]["spec"]["properties"]["algorithm"]["properties"]["name"]
    assert name["enum"] == list(ALGORITHMS)
    with pytest.raises(pydantic.ValidationError) as err:
        _spec(name="toy")
    assert err.value.errors()[0]["loc"] == ("algorithm", "name")
    assert "unknown algorithm 'toy': use one of flow-grpo, diffusion-nft, awm, dgpo" in str(err.value)
    monkeypatch.setitem(ALGORITHMS, "toy", AlgorithmEntry(None, f"{__name__}:TOY"))
    assert _spec(name="toy").algorithm.settings() is None


def test_a_registry_entry_that_is_not_its_algorithm_is_refused(monkeypatch):
    monkeypatch.setitem(ALGORITHMS, "awm-twin", ALGORITHMS["awm"])
    with pytest.raises(TypeError, match="not an Algorithm named 'awm-twin'"):
        algorithm_for("awm-twin")
    with pytest.raises(KeyError, match="'nope' is not registered"):
        algorithm_for("nope")
    monkeypatch.setitem(ALGORITHMS, "awm-planless", AlgorithmEntry("awm", "omnirl.actor.awm_update:AWM",
                                                                   "omnirl.actor.awm_update:AWM"))
    with pytest.raises(TypeError, match="is not a Planner"):
        planner_for("awm-planless")
    with pytest.raises(KeyError, match="'nope' is not registered"):
        planner_for("nope")


def test_rollout_plans_and_policy_needs_of_the_builtin_algorithms():
    grpo = _spec(name="flow-grpo", sampling={"numSteps": 10}, flowGrpo={"window": {"size": 2, "range": [0, 5]}})
    plan = planner_for("flow-grpo").rollout(grpo.algorithm, window_seed=42)
    assert plan == RolloutPlan(tuple(select_window(42, 10, 2, (0, 5))), 0.7, "sde") and len(plan.window) == 2
    assert algorithm_for("flow-grpo").needs(grpo.algorithm) == PolicyNeeds(reference=True)
    nft = _spec(name="diffusion-nft").algorithm
    assert planner_for("diffusion-nft").rollout(nft, 42) == RolloutPlan((), 0.0, "sde")
    assert algorithm_for("diffusion-nft").needs(nft) == PolicyNeeds(True, nft.nft.oldPolicy, rollout_old=True)
    awm = _spec(name="awm").algorithm
    assert algorithm_for("awm").needs(awm) == PolicyNeeds(True, awm.awm.anchor, rollout_old=False)
    no_anchor = _spec(name="awm", awm={"emaKlCoef": 0}).algorithm
    assert algorithm_for("awm").needs(no_anchor).old_policy is None
    dgpo = _spec(name="dgpo").algorithm
    assert planner_for("dgpo").rollout(dgpo, 42) == RolloutPlan()
    assert algorithm_for("dgpo").needs(dgpo) == PolicyNeeds(reference=True)
    ema = _spec(name="dgpo", dgpo={"reference": "ema", "klCoef": 0}).algorithm
    assert algorithm_for("dgpo").needs(ema) == PolicyNeeds(reference=False, old_policy=ema.dgpo.anchor)


def test_per_algorithm_checks_run_only_for_the_selected_algorithm():
    bad_window = {"sampling": {"numSteps": 4}, "flowGrpo": {"window": {"size": 2, "range": [0, 4]}}}
    with pytest.raises(pydantic.ValidationError, match=r"flowGrpo.window.range: \[0, 4\] is invalid"):
        _spec(name="flow-grpo", **bad_window)
    assert _spec(name="diffusion-nft", sampling={"numSteps": 4}).algorithm.flowGrpo.window.range == (0, 5)
    with pytest.raises(pydantic.ValidationError, match="awm.timestepFraction"):
        _spec(name="awm", sampling={"numSteps": 2})
    with pytest.raises(pydantic.ValidationError, match="dgpo.timestepFraction"):
        _spec(name="dgpo", sampling={"numSteps": 2})


# ---------------------------------------------------------------- a toy algorithm, registered only here
SIGMA = 0.5


class Toy(Algorithm):
    """Advantage-weighted velocity regression at one σ: loss = mean_i A_i·mean((v_θ(x_σ) − (ε − x0))²)."""

    name = "toy"

    def needs(self, algo: AlgorithmSpec) -> PolicyNeeds:
        return PolicyNeeds(reference=False, old_policy=OldPolicySpec(schedule="copy"))

    def update(self, policies: PolicySet, optimizer: torch.optim.Optimizer, samples: list[TrainSample],
               algo: AlgorithmSpec, *, seed: int, step: int, grid_of: GridOf, device: torch.device,
               ranks: Ranks = SINGLE) -> dict:
        optimizer.zero_grad(set_to_none=True)
        loss = toy_loss(policies.adapter, samples, seed)
        loss.backward()
        optimizer.step()
        return {"loss": float(loss.detach()), "optimizer_steps": 1}


def toy_loss(adapter, samples: list[TrainSample], seed: int) -> torch.Tensor:
    x0 = torch.stack([s.x0 for s in samples])
    eps = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed))
    x_t = (1 - SIGMA) * x0 + SIGMA * eps
    v = adapter.velocity(x_t, torch.full((len(samples),), SIGMA), adapter.encode([s.prompt_ids for s in samples]))
    adv = torch.tensor([s.advantage for s in samples])
    return (adv * ((v - (eps - x0)) ** 2).flatten(1).mean(1)).mean()


TOY = Toy()


def test_a_toy_algorithm_registered_in_a_test_trains_through_the_trainer(monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setitem(ALGORITHMS, "toy", AlgorithmEntry(None, f"{__name__}:TOY"))
    adapter = tiny_adapter(seed=2)
    engine = RolloutEngine(adapter, max_batch_size=16)
    plan = planner_for("toy").rollout(_spec(name="toy").algorithm, window_seed=0)  # the default: ODE
    for r in requests(adapter, 4, num_steps=4, window=plan.window, prompts=PROMPTS[:1]):
        engine.submit(r)
    results = sorted(engine.run_until_idle(), key=lambda r: r.request.sample_id)
    samples = [TrainSample(r.request.sample_id, r.request.sample_id.rsplit(":", 1)[0], list(r.request.prompt_ids),
                           1.0 - 2.0 * (i % 2), r.x0, r.latents, r.log_probs, r.sigmas, 0.0, "sde")
               for i, r in enumerate(results)]
    trainer = Trainer(copy.deepcopy(adapter), _spec(name="toy", optimizer={"learningRate": 1e-2}))
    assert trainer.policies.has_old and not trainer.policies.has_ref
    seed = trainer.spec.seed * 1_000_003 + 0  # the trainer's step-0 seed
    with torch.no_grad():
        expected = float(toy_loss(trainer.policies.adapter, samples, seed))
    before = {k: v.clone() for k, v in trainer.policies.trained_tensors().items()}
    metrics = trainer.train_step(samples, step=0)
    assert metrics["loss"] == pytest.approx(expected, rel=1e-6)
    assert trainer.optimizer_steps == 1 and metrics["old_policy_decay"] == 0.0
    after = trainer.policies.trained_tensors()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    old = trainer.policies.named_tensors("old")  # refreshed by copy after the step
    assert all(torch.equal(old[k], after[k]) for k in after)


def test_the_example_manifests_name_registered_algorithms():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if isinstance(doc, dict) and doc.get("kind") == "RLJob":
            assert doc["spec"].get("algorithm", {}).get("name", "flow-grpo") in ALGORITHMS, path.name

"""The actor's updates on the real digits model: on-policy ratio, shapes, LoRA, checkpoints."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from tests.helpers import requests, tiny_adapter

from omnirl.actor.batch import TrainSample, micro_batches
from omnirl.actor.nft_update import group_noise
from omnirl.actor.trainer import Trainer
from omnirl.algorithms import group_advantages
from omnirl.api.spec import RLJobSpec
from omnirl.rollout.engine import RolloutEngine


def spec(**algorithm) -> RLJobSpec:
    lora = algorithm.pop("lora", False)
    return RLJobSpec.model_validate({
        "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}],
        "algorithm": algorithm, "model": {"lora": {"enabled": True, "rank": 4, "alpha": 8} if lora else {}},
    })


@pytest.fixture(scope="module")
def rollouts():
    torch.set_num_threads(1)
    adapter = tiny_adapter(seed=1)
    engine = RolloutEngine(adapter, max_batch_size=16)
    for r in requests(adapter, 4, num_steps=6, window=(1, 2)):
        engine.submit(r)
    results = sorted(engine.run_until_idle(), key=lambda r: r.request.sample_id)
    rewards = torch.linspace(0, 1, len(results))
    gids = torch.tensor([int(r.request.sample_id.split(":")[1]) for r in results])
    adv = group_advantages(rewards, gids).advantages
    samples = [
        TrainSample(r.request.sample_id, f"0:{gids[i].item()}", list(r.request.prompt_ids), float(adv[i]), r.x0,
                    r.latents, r.log_probs, r.sigmas, 0.7, "sde")
        for i, r in enumerate(results)
    ]
    return adapter, samples


def test_on_policy_dry_run_gives_ratio_one(rollouts):
    adapter, samples = rollouts
    trainer = Trainer(copy.deepcopy(adapter), spec(name="flow-grpo", optimizer={"microBatchSize": 5}))
    metrics = trainer.train_step(samples, step=0)
    assert metrics["ratio_max_abs_dev"] <= 1e-6  # recompute mode, same shapes: exactly on-policy
    assert metrics["is_max_abs_log_ratio"] <= 1e-5  # rollout engine and actor agree
    assert metrics["clip_fraction"] == 0.0 and metrics["optimizer_steps"] == 1


def test_flow_grpo_update_changes_weights_and_second_minibatch_clips(rollouts):
    adapter, samples = rollouts
    trainer = Trainer(copy.deepcopy(adapter), spec(
        name="flow-grpo", optimizer={"updatesPerStep": 2, "learningRate": 1e-2},
        flowGrpo={"clipRange": 1e-5, "rolloutCorrection": {"mode": "bypass"}}))
    before = {k: v.clone() for k, v in trainer.policies.trained_tensors().items()}
    metrics = trainer.train_step(samples, step=0)
    after = trainer.policies.trained_tensors()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert metrics["optimizer_steps"] == 2 and metrics["clip_fraction"] > 0
    assert metrics["kl"] >= 0


def test_nft_shares_sigma_and_noise_within_a_group():
    s1, e1 = group_noise("3:7", 0, 2, (1, 4, 4), seed=5, sigma_range=(0.02, 0.98))
    s2, e2 = group_noise("3:7", 0, 2, (1, 4, 4), seed=5, sigma_range=(0.02, 0.98))
    s3, e3 = group_noise("3:8", 0, 2, (1, 4, 4), seed=5, sigma_range=(0.02, 0.98))
    assert s1 == s2 and torch.equal(e1, e2)
    assert not torch.equal(e1, e3)
    assert 0.02 <= s1 <= 0.5  # draw 0 of 2 lies in the first stratum
    s_hi, _ = group_noise("3:7", 1, 2, (1, 4, 4), seed=5, sigma_range=(0.02, 0.98))
    assert 0.5 <= s_hi <= 0.98


def test_micro_batches_keep_shapes_and_groups(rollouts):
    _, samples = rollouts
    batches = micro_batches(samples, 5, keep_groups=True)
    assert sum(len(b) for b in batches) == len(samples)
    for b in batches:
        assert len({tuple(s.x0.shape) for s in b}) == 1
    group_spread = {}
    for i, b in enumerate(batches):
        for s in b:
            group_spread.setdefault(s.group_id, set()).add(i)
    assert all(len(v) == 1 for v in group_spread.values())  # groups of 4 fit in 5: never split


def test_micro_batches_never_exceed_the_size_even_for_a_larger_group(rollouts):
    _, samples = rollouts  # groups of 4
    batches = micro_batches(samples, 3, keep_groups=True)
    assert max(len(b) for b in batches) == 3  # microBatchSize is the memory budget: never exceeded
    assert sorted(s.sample_id for b in batches for s in b) == sorted(s.sample_id for s in samples)
    assert [len(b) for b in batches] == [3, 1] * (len(samples) // 4)  # each group: one chunk of 3, then 1


@pytest.mark.parametrize("name", ["diffusion-nft", "awm"])
def test_splitting_groups_over_micro_batches_changes_no_update(rollouts, name):
    """σ and ε are keyed by group id, so a group cut over micro-batches (microBatchSize 2 < G 4)
    trains exactly as whole groups (microBatchSize 8), up to float rounding."""
    adapter, samples = rollouts
    trained = []
    for micro in (2, 8):
        trainer = Trainer(copy.deepcopy(adapter), spec(name=name, optimizer={"learningRate": 1e-3,
                                                                             "microBatchSize": micro}))
        metrics = trainer.train_step(samples, step=0)
        trained.append((metrics["loss"], trainer.policies.trained_tensors()))
    (loss_split, split), (loss_whole, whole) = trained
    assert loss_split == pytest.approx(loss_whole, rel=1e-5, abs=1e-7)
    assert all(torch.allclose(split[k], whole[k], rtol=1e-4, atol=1e-6) for k in whole)
    assert any(not torch.equal(whole[k], adapter.module.state_dict()[k]) for k in whole)  # it did train


@pytest.mark.parametrize("lora", [False, True])
def test_nft_step_refreshes_old_policy_and_checkpoint_round_trips(rollouts, tmp_path, lora):
    adapter, samples = rollouts
    job = spec(name="diffusion-nft", lora=lora, optimizer={"learningRate": 1e-3},
               nft={"oldPolicy": {"schedule": "copy", "refreshEvery": 1}})
    trainer = Trainer(copy.deepcopy(adapter), job)
    before = {k: v.clone() for k, v in trainer.policies.trained_tensors().items()}
    metrics = trainer.train_step(samples, step=0)
    assert metrics["old_policy_decay"] == 0.0 and metrics["loss"] > 0 and metrics["grad_norm"] > 0
    # copy refresh: the rollout policy (old) equals θ after the step, and θ did move
    old, theta = trainer.rollout_tensors(), trainer.policies.trained_tensors()
    assert old.keys() == theta.keys()
    assert all(torch.equal(old[k], theta[k]) for k in theta)
    assert sum(not torch.equal(before[k], theta[k]) for k in theta) >= len(theta) // 2
    if lora:
        assert all("lora_" in k and ".default." in k for k in old)
    path = trainer.save(tmp_path, step=0, state={"policy_version": 1, "data_position": [0, 3]})
    assert (tmp_path / "latest" / "policy.safetensors").exists() and path.name == "step-000000"
    fresh = Trainer(copy.deepcopy(adapter), job)
    state = fresh.load(tmp_path)
    assert state["policy_version"] == 1 and fresh.optimizer_steps == 1
    for k, v in fresh.policies.trained_tensors().items():
        assert torch.equal(v, theta[k])
    trainer.train_step(samples, step=1)
    fresh.train_step(samples, step=1)
    # the second update depends on AdamW's moments and step count: equal only if they were restored
    resumed, continued = fresh.policies.trained_tensors(), trainer.policies.trained_tensors()
    assert all(torch.equal(resumed[k], continued[k]) for k in continued)
    restarted = Trainer(copy.deepcopy(adapter), job)
    restarted.policies.load_trained_tensors(theta, theta)  # the same weights, a fresh optimizer
    restarted.train_step(samples, step=1)
    assert any(not torch.equal(restarted.policies.trained_tensors()[k], continued[k]) for k in continued)


def test_lora_trains_only_adapters(rollouts):
    adapter, samples = rollouts
    trainer = Trainer(copy.deepcopy(adapter), spec(name="flow-grpo", lora=True, optimizer={"learningRate": 1e-2}))
    names = [n for n, p in trainer.policies.adapter.module.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n and ".default." in n for n in names)
    trainer.train_step(samples, step=0)  # LoRA's B starts at zero: one step makes the adapters matter
    base = {k: v for k, v in adapter.module.state_dict().items()}
    for name, value in trainer.policies.adapter.module.state_dict().items():
        if "lora_" not in name:  # peft's wrapped name of a base weight ends like the plain one
            plain = name.replace("base_layer.", "")
            assert torch.equal(value, base[plain]), name
    x = samples[0].latents[:1]
    sigma = samples[0].sigmas[:1]
    cond = adapter.encode([samples[0].prompt_ids])
    with torch.no_grad():
        v_theta = trainer.policies.adapter.velocity(x, sigma, cond)
        v_base = adapter.velocity(x, sigma, cond)
    assert (v_theta - v_base).abs().max() > 1e-4  # the trained adapters change the output
    with trainer.policies.reference() as ref:  # adapters off = the base model
        v_ref = ref.velocity(x, sigma, cond)
    torch.testing.assert_close(v_ref, v_base)
    with torch.no_grad():  # and back on afterwards
        torch.testing.assert_close(trainer.policies.adapter.velocity(x, sigma, cond), v_theta)


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_update(rollouts, lora):
    adapter, samples = rollouts
    results = []
    for checkpointing in (False, True):
        job = spec(name="flow-grpo", lora=lora, flowGrpo={"rolloutCorrection": {"mode": "bypass"}})
        job.model.gradientCheckpointing = checkpointing
        torch.manual_seed(0)  # the same LoRA initialisation in both
        trainer = Trainer(copy.deepcopy(adapter), job)
        metrics = trainer.train_step(samples, step=0)
        results.append((metrics, trainer.policies.trained_tensors()))
    (m0, w0), (m1, w1) = results
    base = adapter.module.state_dict()
    # the blocks (what checkpointing recomputes) trained: LoRA's B left zero, or a base weight moved
    moved = [k for k in w0 if "blocks." in k and (w0[k].abs().sum() > 0 if "lora_B" in k else
                                                 "lora_" not in k and not torch.equal(w0[k], base[k]))]
    assert m0["grad_norm"] > 0 and len(moved) >= 4
    assert m1["loss"] == pytest.approx(m0["loss"], abs=1e-7)
    assert m1["grad_norm"] == pytest.approx(m0["grad_norm"], rel=1e-5)
    for k in w0:
        torch.testing.assert_close(w1[k], w0[k], atol=1e-7, rtol=0)


@pytest.mark.parametrize("name", ["flow-grpo", "diffusion-nft"])
def test_micro_batching_does_not_change_the_update_and_metrics_add_up(rollouts, name):
    """Gradient accumulation over unequal micro-batches (weighted by their share of the minibatch)
    gives the update of one pass; the same seed gives the same update; the metrics are consistent."""
    adapter, samples = rollouts
    extra = {"flowGrpo": {"rolloutCorrection": {"mode": "bypass"}, "klCoef": 0.1}} if name == "flow-grpo" else \
        {"nft": {"klCoef": 0.1}}
    runs = []
    for micro in (3 if name == "flow-grpo" else 4, 16, 16):
        trainer = Trainer(copy.deepcopy(adapter), spec(name=name, optimizer={"microBatchSize": micro, "updatesPerStep": 2,
                                                                            "learningRate": 1e-3}, **extra))
        runs.append((trainer.train_step(samples, step=3), trainer.policies.trained_tensors()))
    (m_small, w_small), (m_big, w_big), (m_again, w_again) = runs
    assert m_big == m_again and all(torch.equal(w_big[k], w_again[k]) for k in w_big)  # seeded: reproducible
    for key in ("loss", "kl", "grad_norm"):
        assert m_small[key] == pytest.approx(m_big[key], rel=1e-4, abs=1e-7), key
    for k in w_big:
        torch.testing.assert_close(w_small[k], w_big[k], atol=1e-6, rtol=1e-5)
    m = m_big
    parts = m["policy_loss"] if name == "flow-grpo" else m["positive_loss"] + m["negative_loss"]
    assert m["loss"] == pytest.approx(parts + 0.1 * m["kl"], rel=1e-5, abs=1e-8) and m["kl"] > 0 and m["grad_norm"] > 0
    assert m["optimizer_steps"] == 2
    if name == "diffusion-nft":
        rms = torch.stack([s.x0.pow(2).mean().sqrt() for s in samples]).mean()
        assert m["x0_norm"] == pytest.approx(float(rms), rel=1e-6)


def test_flow_grpo_without_kl_needs_no_reference(rollouts):
    adapter, samples = rollouts
    trainer = Trainer(copy.deepcopy(adapter), spec(name="flow-grpo", flowGrpo={"klCoef": 0.0}))
    assert not trainer.policies.has_ref
    metrics = trainer.train_step(samples, step=0)
    assert metrics["kl"] == 0.0 and metrics["loss"] == pytest.approx(metrics["policy_loss"], abs=1e-9)


def test_flow_grpo_refuses_ode_rollouts(rollouts):
    adapter, samples = rollouts
    ode = [dataclasses.replace(s, log_probs=torch.zeros(0)) for s in samples]
    with pytest.raises(ValueError, match="FlowGRPO needs SDE-window rollouts; got samples without a window"):
        Trainer(copy.deepcopy(adapter), spec(name="flow-grpo")).train_step(ode, step=0)


def test_nft_loss_metric_is_the_closed_form_at_the_first_step(rollouts):
    """Before any update v_old = v_θ = v_ref, so v⁺ = v⁻ = v_θ and every sample's loss is
    err/w = mean((x̂0 − x0)²) / mean|x̂0 − x0| with x̂0 = x_σ − σ·v_θ on the group's shared (σ, ε)."""
    adapter, samples = rollouts
    job = spec(name="diffusion-nft", optimizer={"microBatchSize": 4}, nft={"klCoef": 0.1})
    trainer = Trainer(copy.deepcopy(adapter), job)
    metrics = trainer.train_step(samples, step=5)
    nft, seed = job.algorithm.nft, job.seed  # the job seed: group_noise derives the rest
    values = []
    with torch.no_grad():
        for s in samples:
            for draw in range(nft.timestepsPerSample):
                sigma, eps = group_noise(s.group_id, draw, nft.timestepsPerSample, tuple(s.x0.shape), seed,
                                         tuple(nft.sigmaRange))
                x_t = (1 - sigma) * s.x0[None] + sigma * eps[None]
                v = adapter.velocity(x_t, torch.tensor([sigma]), adapter.encode([s.prompt_ids]))
                diff = x_t - sigma * v - s.x0[None]
                values.append(float(diff.pow(2).mean() / diff.abs().mean().clamp_min(1e-5)))
    assert metrics["loss"] == pytest.approx(sum(values) / len(values), rel=1e-5)
    assert metrics["kl"] == 0.0  # θ is still the reference when the loss is computed


@pytest.mark.parametrize(("saved", "loaded"), [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("lora", [False, True])
def test_a_checkpoint_loads_cast_into_another_dtype(rollouts, tmp_path, saved, loaded, lora):
    """What `api/resume.py::resume_notes` says of a `model.dtype` change on resume: the weights and AdamW's moments
    load cast to the new dtype (float32 → bfloat16 rounds them), and training goes on in it."""
    adapter, samples = rollouts
    job = spec(name="flow-grpo", lora=lora, optimizer={"learningRate": 1e-3})

    def trainer(dtype: torch.dtype) -> Trainer:  # the actor loads the model in model.dtype, then builds its Trainer
        copied = copy.deepcopy(adapter)
        copied.module.to(dtype)
        return Trainer(copied, job)

    first = trainer(saved)
    first.train_step(samples, step=0)
    first.save(tmp_path, step=0, state={"policy_version": 1, "data_position": [0, 3]})
    theta = first.policies.trained_tensors()

    assert {v.dtype for v in theta.values()} == {saved}
    resumed = trainer(loaded)
    resumed.load(tmp_path)
    now = resumed.policies.trained_tensors()
    assert {v.dtype for v in now.values()} == {loaded}
    assert all(torch.equal(now[k], theta[k].to(loaded)) for k in theta)
    moments = [v for st in resumed.optimizer.state.values() for k, v in st.items() if k.startswith("exp_avg")]
    assert moments and {v.dtype for v in moments} == {loaded}
    resumed.train_step(samples, step=1)
    assert all(torch.isfinite(v).all() for v in resumed.policies.trained_tensors().values())

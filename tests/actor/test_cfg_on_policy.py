"""Exact on-policy ratios with classifier-free guidance and step-wise batching (CPU, fp32).

A tiny random SD3 (the real diffusers classes, built as in tests/models/test_diffusers.py) rolls out with
CFG 4.5 in the step-wise engine, where a sample's batch companions change from step to step; the
actor then trains FlowGRPO on those samples in other micro-batches. The first update's ratio
(bypass: actor vs the rollout's own log-probs) and the IS diagnostics (recompute) must be 1 / 0
within 1e-6: nothing in the guided velocity may depend on what else shares the batch.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")

from tests.models.test_diffusers import RES, _sd3_pipeline  # noqa: E402

from omnirl.actor.batch import TrainSample  # noqa: E402
from omnirl.actor.trainer import Trainer  # noqa: E402
from omnirl.algorithms import group_advantages  # noqa: E402
from omnirl.api.spec import RLJobSpec  # noqa: E402
from omnirl.models.registry import load_adapter  # noqa: E402
from omnirl.rollout.engine import RolloutEngine  # noqa: E402
from omnirl.rollout.types import SampleRequest  # noqa: E402

PROMPTS = ['a sign that says "7"', "a red cube", 'a sign that says "hi 42"']
CFG = 4.5


@pytest.fixture(scope="module")
def sd3(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("sd3_cfg")
    _sd3_pipeline().save_pretrained(path)
    adapter = load_adapter("sd3", str(path), "cpu", "float32", resolution=RES, guidance_scale=CFG,
                           max_sequence_length=16)
    return path, adapter


def _rollout(adapter) -> list[TrainSample]:
    """3 prompts × 3 samples; max batch 4 and staggered admission: companions change every step."""
    engine = RolloutEngine(adapter, max_batch_size=4, batching="stepwise")
    reqs = [SampleRequest(sample_id=f"0:{p}:{i}", prompt=text, prompt_ids=tuple(adapter.tokenize(text)),
                          seed=100 * p + i, num_steps=5, window=(1, 2, 3), noise_level=0.7)
            for p, text in enumerate(PROMPTS) for i in range(3)]
    results = []
    for r in reqs[:3]:
        engine.submit(r)
    for r in reqs[3:]:  # one more request joins after every forward
        results += engine.step()
        engine.submit(r)
    results += engine.run_until_idle()
    assert engine.stats.forwards > 5 and engine.stats.mean_batch < 4  # batches were mixed, not one static batch
    results.sort(key=lambda r: r.request.sample_id)
    gids = torch.tensor([int(r.request.sample_id.split(":")[1]) for r in results])
    adv = group_advantages(torch.linspace(0.0, 1.0, len(results)) ** 2, gids).advantages
    return [TrainSample(r.request.sample_id, f"0:{int(gids[k])}", list(r.request.prompt_ids), float(adv[k]), r.x0,
                        r.latents, r.log_probs, r.sigmas, 0.7, "sde") for k, r in enumerate(results)]


@pytest.mark.parametrize("mode", ["bypass", "recompute"])
def test_first_update_ratio_is_one_with_cfg_and_stepwise_batching(sd3, mode):
    path, adapter = sd3
    samples = _rollout(adapter)
    spec = RLJobSpec.model_validate({
        "model": {"family": "sd3", "path": str(path), "resolution": list(RES)},
        "data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}],
        "algorithm": {"name": "flow-grpo", "groupSize": 3, "promptsPerStep": 3,
                      "sampling": {"numSteps": 5, "guidanceScale": CFG},
                      "optimizer": {"microBatchSize": 2, "updatesPerStep": 1},
                      "flowGrpo": {"window": {"size": 3, "range": [1, 4]}, "clipRange": 1e-5,
                                   "rolloutCorrection": {"mode": mode}}}})
    trainer = Trainer(adapter, spec)
    before = {k: v.clone() for k, v in trainer.policies.trained_tensors().items()}
    try:
        metrics = trainer.train_step(samples, step=0)
    finally:
        trainer.policies.load_trained_tensors(before, None)  # the module fixture is shared
    assert metrics["is_max_abs_log_ratio"] < 1e-6, metrics
    assert metrics["ratio_max_abs_dev"] < 1e-6, metrics
    assert metrics["clip_fraction"] == 0.0
    assert metrics["logprob_mismatch_max"] < 1e-6
    assert sorted(k for k in metrics if k.startswith("logprob_mismatch_step")) == [
        "logprob_mismatch_step1", "logprob_mismatch_step2", "logprob_mismatch_step3"]

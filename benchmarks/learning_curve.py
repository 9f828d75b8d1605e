"""Learning curve of an RLJob's algorithm in ONE process (no Redis, no role processes).

The same engine, scorer, advantages and trainer the roles use, called in a plain loop, so
hyperparameters can be swept quickly and the distributed run's overhead measured against it:

    python -m benchmarks.learning_curve examples/ocr-nft.yaml --minutes 10 --set algorithm.optimizer.learningRate=2e-4

Prints one JSON line per validation: {"it", "minutes", "val_reward", "exact", "darkness", "train_reward"}
(darkness: `omnirl.controller.validation.background_darkness` of the held-out images, as in-run validation),
and with several rewards (the audio+video task's four terms) each one's held-out mean, "val_<name>".
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import yaml

from omnirl.actor.batch import TrainSample
from omnirl.actor.trainer import Trainer
from omnirl.algorithms import group_advantages
from omnirl.algorithms.plan import planner_for
from omnirl.api.loader import _Loader as YAML12Loader
from omnirl.api.loader import job_from_dict, load_rljob, resolve_paths
from omnirl.api.seeds import derive
from omnirl.controller.data import PromptSource, read_prompts
from omnirl.controller.grid import save_image_grid, tile_caption
from omnirl.controller.validation import background_darkness
from omnirl.evaluation.evaluate import evaluate
from omnirl.models.registry import adapter_options, load_adapter
from omnirl.reward.scoring import RewardSet
from omnirl.rollout.engine import RolloutEngine
from omnirl.rollout.types import SampleRequest
from omnirl.transfer.media import to_numpy


def _override(doc: dict, assignment: str) -> None:
    path, _, raw = assignment.partition("=")
    *parents, leaf = path.split(".")
    node = doc["spec"]
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = yaml.load(raw, Loader=YAML12Loader)  # 1e-4 is a number, as in manifests


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("job")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--eval-every", type=int, default=10, help="iterations between held-out evaluations")
    p.add_argument("--eval-prompts", type=int, default=128)
    p.add_argument("--max-its", type=int, default=None, help="stop after this many iterations (training steps)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", help="where the model runs (cuda: a fast sweep; numbers differ from CPU's)")
    p.add_argument("--grid", default=None, help="directory for a grid of the first 32 held-out images per evaluation")
    p.add_argument("--set", action="append", default=[], help="spec override, e.g. algorithm.groupSize=16")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    base = load_rljob(args.job)
    doc = json.loads(base.model_dump_json())
    for a in args.set:
        _override(doc, a)
    job = resolve_paths(job_from_dict(doc), ".")
    spec = job.spec
    algo = spec.algorithm
    adapter = load_adapter(spec.model.family, spec.model.path, **adapter_options(spec))
    adapter.module.to(args.device)
    trainer = Trainer(adapter, spec, device=args.device)
    reward_set = RewardSet(spec.reward)  # the weighted rewards, as the reward role scores
    data = PromptSource(read_prompts(spec.data.trainPrompts), adapter.tokenize, seed=spec.seed)
    held = read_prompts(spec.data.validationPrompts)[: args.eval_prompts]
    engine = RolloutEngine(adapter, max_batch_size=spec.roles.rollout.maxBatchSize, device=args.device)
    t0 = time.time()

    def validate(it: int, train_reward: float | None) -> None:
        adapter.module.eval()
        with torch.no_grad():
            r = evaluate(adapter, spec, held, rewards=reward_set, device=args.device)
        adapter.module.train()
        if args.grid:
            captions = [tile_caption(p, x) for p, x in zip(r.prompts[:32], r.rewards[:32], strict=True)]
            save_image_grid(r.images[:32], f"{args.grid}/it-{it:05d}.png", captions=captions)
        terms = {f"val_{k}": round(sum(c[k] for c in r.components if k in c) / len(r.components), 4)
                 for k in dict.fromkeys(k for c in r.components for k in c)} if len(spec.reward) > 1 else {}
        print(json.dumps({"it": it, "minutes": round((time.time() - t0) / 60, 2), "val_reward": round(r.mean_reward, 4),
                          "exact": None if r.exact_match is None else round(r.exact_match, 4),
                          "darkness": round(background_darkness(r.images), 4), **terms,
                          "train_reward": train_reward}), flush=True)

    validate(0, None)
    it = 0
    while time.time() - t0 < args.minutes * 60 and (args.max_its is None or it < args.max_its):
        prompts = data.draw(algo.promptsPerStep)
        plan = planner_for(algo.name).rollout(algo, window_seed=derive(spec.seed, "window", step=it))
        window, noise, sde_type = plan.window, plan.noise_level, plan.sde_type
        for p_ in prompts:
            for i in range(algo.groupSize):
                engine.submit(SampleRequest(f"{it}:{p_.index}:{i}", p_.text, tuple(p_.ids), seed=derive(spec.seed, "sample", step=it, group=p_.index, sample=i),
                                            num_steps=algo.sampling.numSteps, window=window, noise_level=noise,
                                            sde_type=sde_type, shift=algo.sampling.shift, meta={"group": f"{it}:{p_.index}"}))
        adapter.module.eval()
        results = engine.run_until_idle()
        adapter.module.train()
        media = [to_numpy(r.media) for r in results] if results[0].media is not None else None
        scored = reward_set.score([r.image.numpy() for r in results], [r.request.prompt for r in results],
                                  [r.request.sample_id for r in results], media)
        rewards = torch.tensor([s[0] for s in scored], dtype=torch.float32)
        groups = {g: k for k, g in enumerate(dict.fromkeys(r.request.meta["group"] for r in results))}
        adv = group_advantages(rewards, torch.tensor([groups[r.request.meta["group"]] for r in results]),
                               std_mode=algo.advantage.stdMode).advantages
        samples = [TrainSample(r.request.sample_id, r.request.meta["group"], list(r.request.prompt_ids), float(a),
                               r.x0, r.latents, r.log_probs, r.sigmas, noise, sde_type)
                   for r, a in zip(results, adv.tolist(), strict=True)]
        trainer.train_step(samples, it)
        engine.adapter = trainer.policies.rollout_adapter  # what the actor would broadcast
        it += 1
        if it % args.eval_every == 0:
            validate(it, round(float(rewards.mean()), 4))
    validate(it, None)


if __name__ == "__main__":
    main()

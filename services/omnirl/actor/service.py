"""The actor role: batches in, updated weights out to every rollout worker.

Start-up: load the model (and the latest checkpoint when resuming), host the weight-sync store,
wait for the job's rollout workers to register, broadcast the starting weights (so a zero-module
bind fails the job before any rollout), then publish `actor_ready`.

Per `TrainRequest`: load the samples' tensors → one algorithm step → broadcast the new policy to
every rollout worker (they verify and acknowledge) → checkpoint if asked → `TrainDone` with the
metrics → delete the batch's tensors. A request seen twice (redelivery) is trained once.

Several actor ranks (RANK / WORLD_SIZE, FSDP2): every rank reads every `TrainRequest` through
its own consumer group, loads the whole batch and trains its share of the micro-batches
(`omnirl.actor.ranks`); the gathers for weight sync and checkpoints are collectives. Rank 0, the
leader, alone hosts the weight-sync store, broadcasts, writes checkpoints and the ledger, and
publishes `TrainDone`.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from omnirl.actor.batch import TrainSample
from omnirl.actor.checkpoint import LATEST
from omnirl.actor.ranks import Ranks
from omnirl.actor.trainer import Trainer
from omnirl.api.messages import RoleFailure, TrainDone, TrainItem, TrainRequest
from omnirl.api.runtime import RoleEnv
from omnirl.api.spec import RLJob
from omnirl.models.registry import adapter_options, load_adapter
from omnirl.transfer import TransferQueue
from omnirl.weight_sync import WeightSender

log = logging.getLogger("omnirl.actor")
GROUP = "actor"


class ActorService:
    """One actor rank (the leader, rank 0, or a follower)."""

    def __init__(self, job: RLJob, env: RoleEnv, *, resume: bool = False) -> None:
        spec = job.spec
        self.spec, self.env = spec, env
        self.queue = TransferQueue.from_url(
            env.redis_url, env.job_name, max_stream_length=spec.transferQueue.maxStreamLength,
            tensor_ttl_s=spec.transferQueue.tensorTtlSeconds, claim_idle_s=spec.transferQueue.claimIdleSeconds,
        )
        self.device = torch.device(env.device)
        self.ranks = Ranks.init(env.rank, env.world_size, env.master_addr, env.master_port, str(self.device))
        adapter = load_adapter(spec.model.family, spec.model.path, device=self.device, dtype=spec.model.dtype,
                               **adapter_options(spec))
        self.trainer = Trainer(adapter, spec, self.device, ranks=self.ranks)
        self.ckpt_root = Path(env.out_dir) / spec.checkpoint.dir
        self.version = 0
        # the leader's view decides (a follower without the checkpoint volume then fails loudly, not hangs)
        if resume and self.ranks.max(float(self.ranks.leader and (self.ckpt_root / LATEST).exists())) > 0:
            state = self.trainer.load(self.ckpt_root / LATEST)
            self.version = int(state["policy_version"])
            log.info("resumed from %s at policy_version %d", self.ckpt_root / LATEST, self.version)
        leader = self.ranks.leader
        self.sender = WeightSender(env.weight_sync_host, env.weight_sync_port, device=str(self.device),
                                   backend=env.weight_sync_backend or None) \
            if leader else None
        if self.sender is not None:
            log.info("actor rank 0 on %s: weight sync over %s", self.device, self.sender.backend)
        self._rollout: dict[str, torch.Tensor] = {}  # the leader's gathered rollout tensors
        self._ledger = None
        if leader:
            path = Path(env.out_dir) / "ledger" / f"actor-{env.worker_id}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            self._ledger = path.open("a", buffering=1)

    def run(self) -> None:
        """Serve until the `stop` flag is set. Errors are published as `RoleFailure`, then raised."""
        try:
            self._start()
            control = self.queue.streams.control
            group = GROUP if self.ranks.leader else f"{GROUP}-rank{self.ranks.rank}"  # followers see every request
            self.queue.ensure_group(control, group)
            while not self.queue.get_json("stop"):
                if self.sender is not None:
                    self.sender.serve_new_members(self._rollout, self.version)
                for msg in self.queue.consume(control, group, self.env.worker_id, count=1, block_ms=200):
                    if msg.meta.get("type") == "train":
                        self._train(TrainRequest.model_validate(msg.meta))
                    self.queue.ack(control, group, [msg.id])
        except Exception as err:
            self._fail(f"{type(err).__name__}: {err}")
            raise

    def _start(self) -> None:
        self._gather_rollout()
        if self.sender is None:
            return
        want = self.spec.roles.rollout.replicas
        deadline = time.monotonic() + 600
        while len(self.sender.members()) < want:
            if self.queue.get_json("stop"):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.sender.members())} of {want} rollout workers registered in 600 s")
            time.sleep(0.1)
        report = self.sender.broadcast(self._rollout, self.version)
        log.info("initial weights v%d to %s in %.3f s", self.version, report.receivers, report.seconds)
        self.queue.set_json("actor_ready", {"policy_version": self.version})

    def _train(self, req: TrainRequest) -> None:
        done = self.ranks.leader and self.queue.is_done("train", f"step-{req.step}")
        if self.ranks.agree(req.step, len(req.items), done):  # the leader decides; all ranks on one request
            log.warning("step %d already trained (redelivered request) — skipped", req.step)
            return
        t0 = time.perf_counter()
        samples = [self._load(item) for item in req.items]
        t_load = time.perf_counter()
        metrics = self.trainer.train_step(samples, req.step)
        t_train = time.perf_counter()
        self.version = req.policy_version + 1
        self._gather_rollout()
        ckpt = None
        if req.checkpoint:
            state = {"step": req.step, "policy_version": self.version, **req.controller_state}
            path = self.trainer.save(self.ckpt_root, req.step, state, policy=self._rollout)  # gathered above
            ckpt = None if path is None else str(path)
        if self.sender is None:  # a follower: the leader reports, syncs and cleans up
            return
        t_sync = time.perf_counter()
        report = self.sender.broadcast(self._rollout, self.version)
        metrics.update(load_seconds=t_load - t0, train_seconds=t_train - t_load,
                       sync_seconds=time.perf_counter() - t_sync, sync_bytes=float(report.bytes))
        for item in req.items:
            self._ledger.write(json.dumps({"sample_id": item.sample_id, "step": req.step}) + "\n")
        done = TrainDone(step=req.step, policy_version=self.version, checkpoint=ckpt,
                         metrics={k: float(v) for k, v in metrics.items()})
        self.queue.publish(self.queue.streams.control, done.model_dump())
        self.queue.claim_once("train", f"step-{req.step}")  # marks the step done (after its result exists)
        self.queue.delete_tensors([item.tensor_key for item in req.items])

    def _gather_rollout(self) -> None:
        """The rollout policy's full tensors (a collective with several ranks); the leader keeps them."""
        self._rollout = self.trainer.rollout_tensors(keep=self.ranks.leader)

    def _load(self, item: TrainItem) -> TrainSample:
        t = self.queue.load_tensors(item.tensor_key)
        return TrainSample(
            sample_id=item.sample_id, group_id=item.group_id, prompt_ids=item.prompt_ids, advantage=item.advantage,
            x0=t["x0"], latents=t["latents"], log_probs=t["log_probs"], sigmas=t["sigmas"],
            noise_level=item.noise_level, sde_type=item.sde_type, policy_version=item.policy_version,
        )

    def _fail(self, reason: str) -> None:
        try:
            msg = RoleFailure(role="actor", worker=self.env.worker_id, reason=reason)
            self.queue.publish(self.queue.streams.control, msg.model_dump())
        except Exception as err:  # the original error is re-raised by run(); this one is logged
            log.error("could not publish the actor failure (%s): %s", reason, err)

    def close(self) -> None:
        """Close the weight-sync store, the ledger, the Redis client and the ranks' process group."""
        if self.sender is not None:
            self.sender.close()
        if self._ledger is not None:
            self._ledger.close()
        self.queue.close()
        self.ranks.close()


"""The actor's side: host the TCPStore, track rollout members, broadcast weights per generation."""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from omnirl.weight_sync import protocol as P
from omnirl.weight_sync.errors import BindingError, ReceiverLost, SyncAborted
from omnirl.weight_sync.groups import abandon_group, broadcast_bucket, new_group, resolve_backend, shutdown_group
from omnirl.weight_sync.manifest import Manifest, build_manifest, pack_bucket

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SyncReport:
    """One completed sync (every listed receiver acknowledged an exact bind).

    Attributes:
        version: policy_version sent.
        receivers: worker ids that acknowledged, sorted.
        bytes: payload bytes broadcast (once; a broadcast reaches every receiver).
        seconds: wall time from announcing to the last ack (s).
        buckets: number of broadcasts.
        generation: the sync's generation number (store keys ``gen/{g}/...``).
        group_seconds: time spent building the process group (s); 0.0 when a cached group was reused.
    """

    version: int
    receivers: list[str]
    bytes: int
    seconds: float
    buckets: int
    generation: int = 0
    group_seconds: float = 0.0


@dataclass
class _Member:
    incarnation: str
    version: int | None = None  # last policy_version it acknowledged


class WeightSender:
    """Actor-side weight broadcaster (docs/architecture.md §2 step 5, §3 "Weight sync").

    Hosts a `torch.distributed.TCPStore` (master) on ``port`` (0 picks a free port, see `.port`).
    Receivers register in the store; each `broadcast` is a generation: announce the manifest,
    wait for the announced receivers to be ready, broadcast the buckets from rank 0 over a group of
    the ready receivers (cached while the membership is unchanged), and wait for their acks.

    Lost receivers (no ready/ack within ``timeout_s``, or a failed collective): the sync completes
    for the others, the lost ones are deregistered (and told so through ``evict/{id}``), and
    `ReceiverLost` is raised carrying the partial `SyncReport` — see `errors.ReceiverLost`.

    Args:
        host: the address receivers use to reach this store (``OMNIRL_WEIGHT_SYNC_ADDR``'s host).
        port: TCP port of the store (29500 in Kubernetes; 0 = any free port).
        backend: ``gloo``/``nccl``/``hccl``; None chooses by device (cpu → gloo, cuda → nccl,
            npu → hccl).
        device: where the actor's tensors live; nccl/hccl broadcast from this device, gloo stages
            buckets on the CPU.
        bucket_mb: bucket capacity in MiB (one broadcast per bucket, one dtype per bucket).
        timeout_s: bound (s) on each phase of a sync: ready, group build, each bucket, acks.
        abort: polled while a sync waits for its receivers (ready, each bucket's collective, acks);
            True ends the sync with `SyncAborted` (the actor passes "SIGTERM received": its
            receivers may be gone). A bucket's collective gets `ABORT_GRACE_S` to finish after the
            stop (healthy receivers finish it); cuda-ipc buckets are synchronous and finish or time out.
    """

    def __init__(self, host: str, port: int, *, backend: str | None = None, device: str | torch.device = "cpu",
                 bucket_mb: float = 64, timeout_s: float = 120, abort: Callable[[], bool] | None = None) -> None:
        if bucket_mb <= 0 or timeout_s <= 0:
            raise ValueError(f"WeightSender: bucket_mb ({bucket_mb}) and timeout_s ({timeout_s}) must be > 0")
        self.backend, self.transport = resolve_backend(backend, device)
        self.host = host
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.timeout_s = float(timeout_s)
        self._abort = abort
        self._store: dist.TCPStore | None = dist.TCPStore(
            host, port, is_master=True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        self.port: int = self._store.port
        P.set_json(self._store, P.SESSION, {"id": uuid.uuid4().hex, "backend": self.backend})
        self._members: dict[str, _Member] = {}
        self._reg_seen = 0
        self._generation = 0
        self._group: dist.ProcessGroup | None = None
        self._group_key: tuple[tuple[str, str], ...] | None = None
        self._group_name = ""
        self.lost_total = 0  # receivers deregistered as lost since start (a counter for metrics)

    @property
    def store(self) -> dist.TCPStore:
        """The hosted store; raises after `close`."""
        if self._store is None:
            raise RuntimeError("WeightSender is closed")
        return self._store

    def members(self) -> list[str]:
        """Worker ids currently registered (sorted); reads new registrations first."""
        self._refresh()
        return sorted(self._members)

    def broadcast(self, named_tensors: dict[str, torch.Tensor], version: int) -> SyncReport:
        """Send `named_tensors` as policy_version `version` to every registered receiver.

        Args:
            named_tensors: name → tensor (e.g. `named_trainable_tensors`); not modified.
            version: policy_version (any int; the ack keys are ``ack/{version}/...``).

        Returns:
            The `SyncReport`; with no receiver registered, an empty report (``receivers == []``,
            ``bytes == 0``) — late joiners get this version from `serve_new_members`.

        Raises:
            ValueError: `named_tensors` empty.
            BindingError: a receiver bound zero tensors, missed/received unexpected names or saw a
                checksum mismatch; the message lists worker ids and module names.
            ReceiverLost: receivers did not answer within ``timeout_s`` (deregistered; see class doc).
        """
        if not named_tensors:
            raise ValueError("broadcast: named_tensors is empty: nothing to send")
        self._refresh()
        targets = sorted(self._members)
        if not targets:
            log.warning("weight sync v%d: no rollout worker registered; late joiners get it via "
                        "serve_new_members", version)
            return SyncReport(version, [], 0, 0.0, 0)
        return self._sync(named_tensors, version, targets)

    def serve_new_members(self, named_tensors: dict[str, torch.Tensor], version: int) -> SyncReport | None:
        """Sync `version` to registered receivers that have not acknowledged it (new or restarted).

        Cheap when nothing changed (one store counter read); call it periodically from the actor.

        Returns:
            None when every member already has `version`; else the `SyncReport` of that sync.

        Raises:
            BindingError, ReceiverLost: as `broadcast`.
        """
        self._refresh()
        targets = sorted(w for w, m in self._members.items() if m.version != version)
        if not targets:
            return None
        return self._sync(named_tensors, version, targets)

    def close(self) -> None:
        """Release the group and stop hosting the store (receivers then see a store error)."""
        self._drop_group()
        self._store = None

    # -- one generation -------------------------------------------------------------------------------

    def _sync(self, named: dict[str, torch.Tensor], version: int, targets: list[str]) -> SyncReport:
        t0 = time.perf_counter()
        manifest = build_manifest(named, version, self.bucket_bytes)
        self._generation += 1
        g = self._generation
        ready, lost = self._announce(manifest, g, targets)
        if not ready and not lost:  # every target restarted meanwhile: served by the next serve_new_members
            return SyncReport(version, [], 0, time.perf_counter() - t0, 0, g)
        if not ready:
            raise ReceiverLost(f"weight sync v{version} (generation {g}): no receiver became ready within "
                               f"{self.timeout_s:.1f} s; lost {lost}", lost)
        group, group_s = self._group_for(ready, g)
        stop = (lambda: self._abort()) if self._abort is not None else None
        try:
            for i in range(len(manifest.buckets)):
                broadcast_bucket(group, pack_bucket(manifest, i, named, self.transport), self.timeout_s, stop)
        except SyncAborted as err:
            abandon_group(group)  # a shutdown would wait for the collective in flight until its timeout
            self._group, self._group_key, self._group_name = None, None, ""
            self.store.delete_key(P.manifest_key(g))
            raise SyncAborted(f"weight sync v{version} (generation {g}) aborted during the broadcast of bucket "
                              f"{i + 1}/{len(manifest.buckets)}: {err}") from err
        except RuntimeError as err:
            first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
            self._drop_group()
            self.store.delete_key(P.manifest_key(g))
            self._evict(ready, f"broadcast failed: {first_line}")
            raise ReceiverLost(f"weight sync v{version} (generation {g}): broadcast failed ({first_line}); "
                               f"lost {sorted(lost + ready)}", lost + ready) from err
        ok, failures, missing, mismatched = self._collect_acks(version, g, ready)
        for key in [P.manifest_key(g), *(P.ready_key(g, w) for w in ready)]:
            self.store.delete_key(key)  # bounded store memory over many generations
        report = SyncReport(version, ok, manifest.nbytes, time.perf_counter() - t0, len(manifest.buckets),
                            g, group_s)
        if missing:
            self._drop_group()
            missing = self._drop_lost(missing, f"no ack within {self.timeout_s:.1f} s")
        if failures:
            lines = "; ".join(f"worker {w}: {why}" for w, why in sorted(failures.items()))
            raise BindingError(f"weight sync v{version}: binding failed on {sorted(failures)}: {lines}", failures,
                               mismatch=bool(mismatched))
        if lost or missing:
            raise ReceiverLost(f"weight sync v{version} (generation {g}): lost {sorted(lost + missing)} "
                               f"(no answer within {self.timeout_s:.1f} s); delivered to {ok}", lost + missing, report)
        log.info("weight sync v%d: %d bytes in %d buckets to %s in %.3f s", version, report.bytes,
                 report.buckets, ok, report.seconds)
        return report

    def _announce(self, manifest: Manifest, g: int, targets: list[str]) -> tuple[list[str], list[str]]:
        """Publish the manifest and assignments; wait for ``ready``; evict the silent ones."""
        store = self.store
        store.set(P.manifest_key(g), manifest.to_json())
        for w in targets:
            store.delete_key(P.ack_key(manifest.version, w))
            P.set_json(store, P.assign_key(w), {"generation": g, "version": manifest.version,
                                                "incarnation": self._members[w].incarnation})
        before = {w: self._members[w].incarnation for w in targets}

        def stop() -> bool:
            # a target that registered again (a restarted rollout worker) will never answer this
            # generation, which names its old incarnation: stop waiting once every other target is ready
            # (was: the whole timeout_s, then ReceiverLost, and the actor failed the job's restart-job)
            if self._abort is not None and self._abort():
                return True
            self._refresh()
            new = [w for w in targets if w in self._members and self._members[w].incarnation != before[w]]
            return bool(new) and all(w in new or store.check([P.ready_key(g, w)]) for w in targets)

        ready, silent = P.wait_keys(store, {w: P.ready_key(g, w) for w in targets}, self.timeout_s, stop)
        self._check_abort(manifest.version, g, silent)
        lost = self._drop_lost(silent, f"not ready within {self.timeout_s:.1f} s", before)
        if not ready:
            store.delete_key(P.manifest_key(g))
        return ready, lost

    def _group_for(self, ready: list[str], g: int) -> tuple[dist.ProcessGroup, float]:
        """Publish ``go`` and return the group of rank 0 + `ready` (reused while unchanged)."""
        key = tuple((w, self._members[w].incarnation) for w in ready)
        reuse = key == self._group_key and self._group is not None
        name = self._group_name if reuse else f"sync/{g}"
        P.set_json(self.store, P.go_key(g), {"ranks": ready, "group": name})
        if reuse:
            assert self._group is not None
            return self._group, 0.0
        self._drop_group()
        t0 = time.perf_counter()
        try:
            group = new_group(self.store, name, 0, len(ready) + 1, self.backend, self.transport,
                              self.timeout_s, self.host)
        except RuntimeError as err:
            self._evict(ready, f"group build failed: {err}")
            raise ReceiverLost(f"weight sync generation {g}: building the {self.backend} group with {ready} "
                               f"failed ({err})", ready) from err
        self._group, self._group_key, self._group_name = group, key, name
        return group, time.perf_counter() - t0

    def _collect_acks(self, version: int, g: int,
                      ready: list[str]) -> tuple[list[str], dict[str, str], list[str], list[str]]:
        """Wait for ``ack/{version}/{id}``; returns (ok ids, failures id → reason, missing ids, ids
        whose module does not fit the sent names or shapes: `BindReport.mismatch`)."""
        acked, missing = P.wait_keys(self.store, {w: P.ack_key(version, w) for w in ready}, self.timeout_s,
                                     self._abort)
        self._check_abort(version, g, missing)
        ok: list[str] = []
        failures: dict[str, str] = {}
        mismatched: list[str] = []
        for w in acked:
            doc = P.get_json(self.store, P.ack_key(version, w))
            self.store.delete_key(P.ack_key(version, w))  # read once; the outcome is in the report
            if doc["generation"] != g or doc["incarnation"] != self._members[w].incarnation:
                missing.append(w)
            elif doc["ok"]:
                ok.append(w)
                self._members[w].version = version
            else:
                failures[w] = doc["error"]
                if doc.get("mismatch"):
                    mismatched.append(w)
        return sorted(ok), failures, sorted(missing), sorted(mismatched)

    def _check_abort(self, version: int, g: int, waiting_for: list[str]) -> None:
        """Raise `SyncAborted` when `abort` says stop while receivers have not answered (a sync whose
        receivers all answered goes on); the generation's manifest is withdrawn."""
        if waiting_for and self._abort is not None and self._abort():
            self.store.delete_key(P.manifest_key(g))
            raise SyncAborted(f"weight sync v{version} (generation {g}) aborted: the sender is stopping")

    # -- membership -----------------------------------------------------------------------------------

    def _refresh(self) -> None:
        self._reg_seen, events = P.read_registrations(self.store, self._reg_seen)
        for e in events:
            w, inc = e["worker_id"], e["incarnation"]
            if e["event"] == "join":
                if w in self._members:
                    log.warning("weight sync: worker %s registered again (restart); it gets the current "
                                "weights at the next sync", w)
                self._members[w] = _Member(inc)
            elif e["event"] == "leave" and w in self._members and self._members[w].incarnation == inc:
                del self._members[w]

    def _drop_lost(self, silent: list[str], why: str, before: dict[str, str] | None = None) -> list[str]:
        """Evict the `silent` members, except those that registered again meanwhile; returns the evicted.

        A receiver whose collective broke, or which reconnected, registers a new incarnation: it is
        not lost but new (its own `receive` raised), and `serve_new_members` will serve it.
        """
        if before is None:  # the incarnations the sync was announced to (`_announce` refreshes while it waits)
            before = {w: self._members[w].incarnation for w in silent if w in self._members}
        self._refresh()
        rejoined = [w for w in silent if w in self._members and self._members[w].incarnation != before.get(w)]
        if rejoined:
            log.warning("weight sync: %s registered again during the sync (restarted: the sync named its old "
                        "incarnation); served at the next sync", rejoined)
        lost = [w for w in silent if w not in rejoined]
        if lost:
            self._evict(lost, why)
        return lost

    def _evict(self, workers: list[str], why: str) -> None:
        for w in workers:
            member = self._members.pop(w, None)
            if member is not None:
                self.store.set(P.evict_key(w), member.incarnation)
        self.lost_total += len(workers)
        log.error("weight sync: deregistered %s (%s); total lost since start: %d", sorted(workers), why,
                  self.lost_total)

    def _drop_group(self) -> None:
        if self._group is not None:
            shutdown_group(self._group)
        self._group, self._group_key, self._group_name = None, None, ""

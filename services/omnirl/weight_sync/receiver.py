"""A rollout worker's side: register, notice an announced sync, join its group, bind, verify, ack."""

from __future__ import annotations

import datetime
import logging
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict

import torch
import torch.distributed as dist
from torch import nn

from omnirl.weight_sync import protocol as P
from omnirl.weight_sync.binding import BindingPlan, BindReport, NameMap, copy_verified, finish_report, plan_binding
from omnirl.weight_sync.errors import BindingError, SyncAborted, WeightSyncError
from omnirl.weight_sync.groups import broadcast_bucket, new_group, resolve_backend, shutdown_group
from omnirl.weight_sync.manifest import Manifest, empty_bucket, unpack_bucket

log = logging.getLogger(__name__)
_MAX_GROUPS = 2  # cached groups (the sender caches one; a spare covers a late-joiner subset group)
REPORT_EVERY_S = 30.0  # a connect still waiting says so this often (it waited up to 30 min without a word)
CONNECT_RETRY_S = 1.0  # between two connects to an address where nothing answered


class WeightReceiver:
    """Rollout-side weight receiver; registers with the actor's store on construction.

    Usage in a rollout loop: between denoising steps call `pending_version()`; when it is not None,
    finish or abort in-flight requests (no mixed-weight samples), then `receive(module)`.

    Failure rules: a bind that is not exact raises `BindingError` after writing a failure ack (a
    job failure). A broken collective or a sync that excluded this worker makes it register again
    (a new incarnation) so the actor serves it the current weights via ``serve_new_members``;
    a broken collective is also raised as `WeightSyncError`. If the actor's store goes away (actor
    restart), the next call reconnects (waiting up to ``timeout_s``) and registers again.

    Args:
        host, port: the actor's store (``OMNIRL_WEIGHT_SYNC_ADDR``).
        worker_id: unique, stable id of this replica (``OMNIRL_WORKER_ID``); no ``/`` or spaces.
        backend: ``gloo``/``nccl``/``hccl``, or None to use the actor's (published in the store; e.g.
            a CUDA rollout worker follows a CPU actor's gloo). An explicit value must match it.
        device: where the received buckets land (nccl/hccl); gloo receives on the CPU and the copy
            into the module moves the data to the module's device.
        timeout_s: bound (s) on reconnecting, on waiting for ``go``, on each bucket, and on `receive`'s
            wait for an announcement.
        connect_timeout_s: bound (s) on the first connection (the actor hosts the store once it has
            loaded its model: minutes); None: ``timeout_s``. A connect keeps trying the address (a
            restarted actor's stable DNS name resolves to its new pod) and logs a warning every
            ``REPORT_EVERY_S`` naming the address, the error, the time waited and the deadline.
        connect_limit: what sets ``connect_timeout_s``, named in those warnings (the knob to raise).
        connect_note: called for each warning; its text is appended (what the caller knows of the
            actor, e.g. its last heartbeat), or "" for nothing.
        abort: called between connect attempts; True stops the wait with `SyncAborted` (the rollout
            role got SIGTERM: a connect inside the store's own retries ignored it for up to 30 min).

    Raises:
        ValueError: a bad worker_id or backend/device pair, or a backend unlike the actor's.
        WeightSyncError: the store was not reachable within ``connect_timeout_s``.
        SyncAborted: ``abort`` said stop before the store answered.
    """

    def __init__(self, host: str, port: int, worker_id: str, *, backend: str | None = None,
                 device: str | torch.device = "cpu", timeout_s: float = 120,
                 connect_timeout_s: float | None = None, connect_limit: str = "connect_timeout_s",
                 connect_note: Callable[[], str] | None = None, abort: Callable[[], bool] | None = None) -> None:
        if not worker_id or any(c in worker_id for c in "/ \t\n"):
            raise ValueError(f"WeightReceiver: worker_id {worker_id!r} must be non-empty without '/' or spaces")
        if timeout_s <= 0:
            raise ValueError(f"WeightReceiver: timeout_s must be > 0, got {timeout_s}")
        self.backend, self.transport = resolve_backend(backend, device)
        self._backend_arg, self._device = backend, device
        self.host, self.port, self.worker_id, self.timeout_s = host, int(port), worker_id, float(timeout_s)
        self._connect_note, self._abort = connect_note, abort
        self.incarnation = ""
        self._done_generation = 0
        self._groups: dict[str, dist.ProcessGroup] = {}
        self._store: dist.TCPStore | None = None
        if connect_timeout_s is None:
            self._connect()
        else:
            self._connect(float(connect_timeout_s), connect_limit)
        self._register()

    def pending_version(self) -> int | None:
        """The policy_version of a sync announced for this worker, or None (non-blocking).

        Blocks (≤ ``timeout_s``) only to reconnect after the actor's store went away.
        """
        a = self._poll()
        return None if a is None else int(a["version"])

    def receive(self, module: nn.Module, *, name_map: NameMap | None = None) -> BindReport:
        """Wait (≤ ``timeout_s``) for an announced sync, join it, bind into `module`, verify, ack.

        Args:
            module: the rollout model; its parameters/buffers are overwritten in place by exact name
                (after `name_map`).
            name_map: optional rename sender name → module name (one-to-one), for engines whose
                module names differ (e.g. a fused qkv).

        Returns:
            The `BindReport` (``ok``), also written as ``ack/{version}/{worker_id}``.

        Raises:
            BindingError: zero tensors bound, missing/unexpected names or a checksum mismatch (the
                failure ack names the modules; nothing is copied when names do not match).
            WeightSyncError: nothing announced within ``timeout_s``, or the collective failed.
        """
        deadline = time.monotonic() + self.timeout_s
        while True:
            a = self._poll()
            if a is not None:
                report = self._run_generation(a, module, name_map)
                if report is not None:
                    return report
            elif time.monotonic() > deadline:
                raise WeightSyncError(f"worker {self.worker_id}: no weight sync announced within "
                                      f"{self.timeout_s:.1f} s")
            else:
                time.sleep(P.POLL_S)

    def close(self, *, leave: bool = True) -> None:
        """Deregister (best effort: the actor may already be gone) and release groups.

        Args:
            leave: deregister from the actor's store. False when the whole job has ended: the
                actor's store goes away with it, so there is nobody to tell (and trying would
                warn whenever the actor exited first).
        """
        self._drop_groups()
        if self._store is not None and leave:
            try:
                P.append_registration(self._store, "leave", self.worker_id, self.incarnation)
            except dist.DistError as err:
                log.warning("worker %s: could not deregister (actor store gone: %s)", self.worker_id, err)
        self._store = None

    # -- store ----------------------------------------------------------------------------------------

    def _connect(self, timeout_s: float | None = None, limit: str = "the receiver's timeout_s") -> None:
        """Connect to the actor's store, trying again until `timeout_s` (None: ``self.timeout_s``) has
        passed and warning every ``REPORT_EVERY_S`` while it waits; `limit` names what set the bound.

        Raises:
            WeightSyncError: naming the address, the time waited and the last error.
            SyncAborted: ``abort`` said stop.
        """
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        start = time.monotonic()
        deadline = start + timeout_s
        reported = start
        while True:
            left = deadline - time.monotonic()
            # a plain connect first: the store's own retries ignore its timeout (a 30 s attempt took 78 s) and
            # were one silent wait of the whole bound; this one is answered at once when nothing listens
            reason = _unreachable(self.host, self.port, max(min(left, 5.0), 0.1))
            if reason is None:
                try:
                    self._store = dist.TCPStore(self.host, self.port, is_master=False, wait_for_workers=False,
                                                timeout=datetime.timedelta(seconds=max(min(left, REPORT_EVERY_S), 1.0)))
                    self._store.wait([P.SESSION])  # the actor writes it right after it listens
                    self._store.set_timeout(datetime.timedelta(seconds=self.timeout_s))  # later waits: the usual bound
                    break
                except dist.DistError as err:  # it listens but is not the actor's store (yet)
                    self._store, reason = None, str(err).splitlines()[0]
            now = time.monotonic()
            if self._abort is not None and self._abort():
                raise SyncAborted(f"worker {self.worker_id}: stopped waiting for the weight-sync store "
                                  f"{self.host}:{self.port} after {now - start:.0f} s (abort)")
            if now >= deadline:
                raise WeightSyncError(f"worker {self.worker_id}: weight-sync store {self.host}:{self.port} not "
                                      f"reachable within {timeout_s:.1f} s ({limit}): {reason}")
            if now - reported >= REPORT_EVERY_S:
                reported = now
                self._waiting(reason, now - start, timeout_s, limit, deadline)
            time.sleep(min(CONNECT_RETRY_S, max(deadline - now, 0.0)))
        if time.monotonic() - start > REPORT_EVERY_S:
            log.info("worker %s: the actor's weight-sync store %s:%d answered after %.0f s", self.worker_id,
                     self.host, self.port, time.monotonic() - start)
        backend = P.get_json(self._store, P.SESSION)["backend"]
        if backend != self.backend:
            if self._backend_arg is not None:
                raise ValueError(f"worker {self.worker_id}: backend={self._backend_arg!r} but the actor "
                                 f"broadcasts with {backend!r}; pass backend={backend!r} or None")
            self.backend, self.transport = resolve_backend(backend, self._device)  # follow the actor

    def _waiting(self, reason: str, waited: float, timeout_s: float, limit: str, deadline: float) -> None:
        """Warn that the store at this address did not answer yet: for how long, until when, and why."""
        until = time.strftime("%H:%M:%S", time.localtime(time.time() + deadline - time.monotonic()))
        note = self._connect_note() if self._connect_note is not None else ""
        log.warning("worker %s: waiting for the actor's weight-sync store at %s:%d (%s): %.0f s so far, trying "
                    "until %s (%.0f s, %s)%s", self.worker_id, self.host, self.port, reason, waited, until,
                    timeout_s, limit, f"; {note}" if note else "")

    def _register(self) -> None:
        """Register a new incarnation: forget generations and groups of the previous one."""
        assert self._store is not None
        self._drop_groups()
        self.incarnation = uuid.uuid4().hex
        self._done_generation = 0
        P.set_json(self._store, P.member_key(self.worker_id), {"incarnation": self.incarnation, "time": time.time()})
        P.append_registration(self._store, "join", self.worker_id, self.incarnation)
        log.info("worker %s registered for weight sync (incarnation %s)", self.worker_id, self.incarnation[:8])

    def _poll(self) -> dict | None:
        try:
            return self._poll_once()
        except dist.DistError as err:
            log.warning("worker %s: weight-sync store error (%s); reconnecting", self.worker_id,
                        str(err).splitlines()[0])
            self._store = None
            self._connect()
            self._register()
            return self._poll_once()

    def _poll_once(self) -> dict | None:
        store = self._store
        assert store is not None
        evict = P.evict_key(self.worker_id)
        if store.check([evict]) and store.get(evict).decode() == self.incarnation:
            log.error("worker %s: the actor dropped this worker (it missed a sync); registering again",
                      self.worker_id)
            self._register()
            return None
        a = P.try_get_json(store, P.assign_key(self.worker_id))
        if a is None or a["incarnation"] != self.incarnation or a["generation"] <= self._done_generation:
            return None
        return a

    # -- one generation -------------------------------------------------------------------------------

    def _run_generation(self, a: dict, module: nn.Module, name_map: NameMap | None) -> BindReport | None:
        """Join generation ``a["generation"]``; None when the sender left this worker out."""
        store = self._store
        assert store is not None
        g, version = int(a["generation"]), int(a["version"])
        if not store.check([P.manifest_key(g)]):  # the sender finished g without this worker
            log.error("worker %s: generation %d is over (too late); registering again", self.worker_id, g)
            self._register()
            return None
        manifest = Manifest.from_json(store.get(P.manifest_key(g)))
        plan = plan_binding(module, {e.name: e.shape for e in manifest.tensors}, manifest.scope, name_map)
        store.set(P.ready_key(g, self.worker_id), self.incarnation)
        try:
            store.wait([P.go_key(g)])
        except dist.DistError as err:
            self._register()
            raise WeightSyncError(f"worker {self.worker_id}: generation {g} never started: {err}") from err
        go = P.get_json(store, P.go_key(g))
        if self.worker_id not in go["ranks"]:
            log.error("worker %s: left out of generation %d (too late); registering again", self.worker_id, g)
            self._register()
            return None
        try:
            group = self._group(go["group"], go["ranks"].index(self.worker_id) + 1, len(go["ranks"]) + 1)
            bound, mismatched = self._receive_buckets(group, manifest, plan)
        except RuntimeError as err:
            self._register()
            raise WeightSyncError(f"worker {self.worker_id}: weight sync v{version} (generation {g}) failed: "
                                  f"{err}; registered again for the next sync") from err
        self._done_generation = g
        report = finish_report(version, plan, bound, mismatched)
        P.set_json(store, P.ack_key(version, self.worker_id),
                   {"generation": g, "incarnation": self.incarnation, "ok": report.ok,
                    "error": report.problem(), "mismatch": report.mismatch, "report": asdict(report)})
        if not report.ok:
            raise BindingError(f"worker {self.worker_id}: weight binding failed for policy_version {version}: "
                               f"{report.problem()}", {self.worker_id: report.problem()}, report,
                               mismatch=report.mismatch)
        return report

    def _receive_buckets(self, group: dist.ProcessGroup, manifest: Manifest,
                         plan: BindingPlan) -> tuple[list[str], list[str]]:
        """Receive every bucket; bind each tensor as its bucket lands (only when the plan is exact)."""
        checksums = {e.name: e.checksum for e in manifest.tensors}
        bound: list[str] = []
        mismatched: list[str] = []
        for i in range(len(manifest.buckets)):
            flat = empty_bucket(manifest, i, self.transport)
            broadcast_bucket(group, flat, self.timeout_s)
            if not plan.ok:
                continue  # stay in step with the collective; bind nothing
            for name, t in unpack_bucket(manifest, i, flat).items():
                (bound if copy_verified(plan, name, t, checksums[name]) else mismatched).append(name)
        return bound, mismatched

    def _group(self, name: str, rank: int, size: int) -> dist.ProcessGroup:
        if name not in self._groups:
            assert self._store is not None
            self._groups[name] = new_group(self._store, name, rank, size, self.backend, self.transport,
                                           self.timeout_s, self.host)
            while len(self._groups) > _MAX_GROUPS:
                shutdown_group(self._groups.pop(next(iter(self._groups))))
        return self._groups[name]

    def _drop_groups(self) -> None:
        for group in self._groups.values():
            shutdown_group(group)
        self._groups.clear()


def _unreachable(host: str, port: int, timeout_s: float) -> str | None:
    """Why a TCP connect to ``host:port`` failed within `timeout_s` (refused, a name that does not
    resolve, no answer), or None when something accepted it (the connection is closed at once)."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:  # gaierror, ConnectionRefusedError, TimeoutError: all are "not yet" to a retry
        return str(err) or type(err).__name__
    return None

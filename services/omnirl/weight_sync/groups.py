"""Process groups built straight from the TCPStore, without a global `init_process_group`.

Each sync "generation" needs a group of the actor (rank 0) plus the receivers of that moment, and
processes come and go; the default-group machinery (`init_process_group`/`new_group`) assumes one
fixed world. So a group is constructed directly from a `PrefixStore(f"sync/{gid}", store)`:

- gloo: ``torch.distributed.ProcessGroupGloo(store, rank, size, options)`` with
  ``ProcessGroupGloo._Options`` (``_timeout``, ``_devices``) — exactly what torch's own
  ``distributed_c10d._new_process_group_helper`` builds. The device is given an explicit address
  (see `gloo_hostname`): torch's default device guessed a wrong interface on our test machine.
- nccl: ``torch.distributed.ProcessGroupNCCL(store, rank, size, options)`` with
  ``ProcessGroupNCCL.Options()._timeout``; the current CUDA device must be set first.
- hccl: ``torch.distributed.ProcessGroupHCCL(store, rank, size, timeout)``, registered into
  ``torch.distributed`` by ``import torch_npu`` (Ascend's documented constructor).
- cuda-ipc: `omnirl.weight_sync.ipc.IpcGroup` (same interface): actor and receivers on one GPU.

Only gloo is exercised by the tests here (CPU machine).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from omnirl.weight_sync.errors import SyncAborted
from omnirl.weight_sync.ipc import IpcGroup

log = logging.getLogger("omnirl.weight_sync")

ABORT_POLL_S = (0.001, 0.05)
"""Seconds between checks of a broadcast's completion while an `abort` callback is watched: the
first during the bucket's first second (a 64 MiB bucket takes ~10 ms on NVLink, so a coarse poll
would add up over a full-weight sync's ~90 buckets), the second after it."""
ABORT_GRACE_S = 5.0
"""Seconds a bucket's collective may still take after `abort` turned True: receivers that are alive
finish a bucket in well under this (64 MiB over loopback gloo: ~0.1 s), so only a stalled one is
abandoned — and healthy receivers are not left waiting for the rest of an abandoned sync."""

BACKENDS = ("gloo", "nccl", "hccl", "cuda-ipc")
IFNAME_ENV = "OMNIRL_WEIGHT_SYNC_IFNAME"  # optional: network interface gloo binds to (e.g. eth0)


def resolve_backend(backend: str | None, device: str | torch.device) -> tuple[str, torch.device]:
    """Choose the collective backend and the device the buckets travel on.

    Args:
        backend: ``"gloo"``, ``"nccl"``, ``"hccl"``, ``"cuda-ipc"`` (every member on one shared
            GPU, `omnirl.weight_sync.ipc`) or None (by device: cpu → gloo, cuda → nccl, npu → hccl).
        device: the caller's device (``"cpu"``, ``"cuda:0"``, ``"npu:0"``).

    Returns:
        (backend, transport device): gloo always moves CPU tensors (buckets are staged in host
        memory); nccl/hccl move tensors on `device`.

    Raises:
        ValueError: unknown backend, nccl/hccl asked for a device of another kind, or an npu device
            without torch_npu installed.
    """
    dev = _device(device)
    if backend is None:
        backend = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}.get(dev.type)
        if backend is None:
            raise ValueError(f"weight sync: no default backend for device {dev}; pass backend='gloo'")
    if backend not in BACKENDS:
        raise ValueError(f"weight sync backend={backend!r}: expected one of {BACKENDS}")
    need = {"nccl": "cuda", "hccl": "npu", "cuda-ipc": "cuda"}.get(backend)
    if need is not None and dev.type != need:
        raise ValueError(f"weight sync backend={backend!r} needs a device of type {need!r}, got device={dev}")
    return backend, (torch.device("cpu") if backend == "gloo" else dev)


def _device(device: str | torch.device) -> torch.device:
    """`torch.device`, importing torch_npu first for ``npu`` (it registers that device type)."""
    if isinstance(device, str) and device.split(":")[0] == "npu":
        try:
            import torch_npu  # noqa: F401
        except ImportError as err:
            raise ValueError(f"weight sync device={device!r} needs torch_npu (Ascend) installed") from err
    return torch.device(device)


def gloo_hostname(peer_host: str, is_sender: bool) -> str:
    """The local address gloo should listen on and advertise to its peers.

    Loopback peer → ``127.0.0.1``. A receiver picks the local address that routes to the sender's
    host (a connected UDP socket; no packet is sent). The sender, which only knows the name it was
    given (in Kubernetes the Service name), advertises the address of its own hostname (the pod IP).
    """
    try:
        peer_ip = socket.gethostbyname(peer_host)
    except OSError as err:
        raise ValueError(f"weight sync: cannot resolve host {peer_host!r}: {err}") from err
    if ipaddress.ip_address(peer_ip).is_loopback:
        return "127.0.0.1"
    if is_sender:
        return socket.gethostbyname(socket.gethostname())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((peer_ip, 9))
        return s.getsockname()[0]


def new_group(store: dist.Store, prefix: str, rank: int, size: int, backend: str, device: torch.device,
              timeout_s: float, peer_host: str) -> dist.ProcessGroup | IpcGroup:
    """Construct one group from `PrefixStore(prefix, store)`; blocks until all `size` ranks joined.

    Raises:
        RuntimeError / DistStoreError: a rank did not join within `timeout_s` (from torch).
    """
    pstore = dist.PrefixStore(prefix, store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        ifname = os.environ.get(IFNAME_ENV)
        device_ = (dist.ProcessGroupGloo.create_device(interface=ifname) if ifname else
                   dist.ProcessGroupGloo.create_device(hostname=gloo_hostname(peer_host, rank == 0)))
        opts._devices = [device_]
        return dist.ProcessGroupGloo(pstore, rank, size, opts)
    if backend == "cuda-ipc":
        return IpcGroup(pstore, rank, size, _indexed(device, torch.cuda.current_device), timeout_s)
    if backend == "nccl":
        torch.cuda.set_device(_indexed(device, torch.cuda.current_device))
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(pstore, rank, size, opts)
    import torch_npu  # noqa: F401  (registers torch.distributed.ProcessGroupHCCL and the npu device)

    torch.npu.set_device(_indexed(device, torch.npu.current_device))
    return dist.ProcessGroupHCCL(pstore, rank, size, timeout)


def _indexed(device: torch.device, current) -> torch.device:
    """`device` with an index (``cuda`` → the current ``cuda:N``): set_device needs one."""
    return device if device.index is not None else torch.device(device.type, current())


def broadcast_bucket(group: dist.ProcessGroup | IpcGroup, flat: torch.Tensor, timeout_s: float,
                     abort: Callable[[], bool] | None = None) -> None:
    """Broadcast `flat` (shape ``[numel]``, any dtype) from rank 0, in place: rank 0 sends, others receive.

    The bucket is viewed as uint8 on the wire, so any dtype (bf16, fp8, bool) travels even where
    the backend lacks a reduction for it. Blocks until done on this rank. With `abort`, the wait
    polls the collective (every `ABORT_POLL_S`) and gives up `ABORT_GRACE_S` after `abort()` turned
    True: a stopping sender must not sit out the collective timeout for a receiver that froze.

    Raises:
        RuntimeError: a peer failed or the collective exceeded `timeout_s` (from torch).
        SyncAborted: the collective had not completed `ABORT_GRACE_S` after `abort()` turned True
            (the group is then unusable: drop it without waiting on it).
    """
    raw = flat.view(torch.uint8)
    work = group.broadcast(raw, 0, datetime.timedelta(seconds=timeout_s))
    if abort is not None:
        start, stopped_at = time.monotonic(), None
        while not work.is_completed() and time.monotonic() < start + timeout_s:
            now = time.monotonic()
            if stopped_at is None and abort():
                stopped_at = now
            if stopped_at is not None and now - stopped_at >= ABORT_GRACE_S:
                raise SyncAborted(f"the sender is stopping and the collective did not finish within "
                                  f"{ABORT_GRACE_S:.0f} s")
            time.sleep(ABORT_POLL_S[0] if now - start < 1.0 else ABORT_POLL_S[1])
    work.wait(datetime.timedelta(seconds=timeout_s))  # raises the collective's own error, if any
    if raw.device.type == "cuda":
        torch.cuda.current_stream(raw.device).synchronize()


_LEFT_BEHIND: list = []  # groups with a collective in flight, referenced until the process ends


def abandon_group(group: dist.ProcessGroup | IpcGroup) -> None:
    """Leave `group` behind with a collective in flight (after `SyncAborted`).

    The backend's `abort` runs where it has one (NCCL aborts its communicator). The group stays
    referenced for the rest of the process: gloo's destructor joins worker threads that wait out
    the collective's timeout, so letting it be collected would block wherever that happens. A
    process that abandoned a group should end with `os._exit` (see `groups_left_behind`).
    """
    abort = getattr(group, "abort", None)
    if abort is not None:
        try:
            abort()
        except RuntimeError as err:  # best effort: the group is left behind either way
            log.warning("weight sync: could not abort a group with a collective in flight: %s", err)
    _LEFT_BEHIND.append(group)


def groups_left_behind() -> int:
    """How many groups this process abandoned with a collective in flight (`abandon_group`)."""
    return len(_LEFT_BEHIND)


def shutdown_group(group: dist.ProcessGroup | IpcGroup) -> None:
    """Release a group's connections (communicators for nccl/hccl)."""
    group.shutdown()

"""The ``cuda-ipc`` transport: a weight broadcast between processes that share one CUDA GPU.

NCCL refuses two ranks on one GPU, and gloo stages every byte through host memory (17.6 s for
4.9 GB on an H200). Here rank 0 exports each bucket's device memory as a CUDA IPC handle
(`cudaIpcGetMemHandle`, through torch's `UntypedStorage._share_cuda_`, the mechanism
`torch.multiprocessing` uses) and the receivers map it (`_new_shared_cuda`) and copy it
device-to-device into their own buffer. The handle travels as JSON through the weight-sync store
(bytes in base64; no pickle). Rank 0 keeps the bucket alive until every receiver said it copied.

Both ends must see the same physical GPU (checked by its UUID): actor and rollout placed on one
device by `omnirl run --share-gpus`.
"""

from __future__ import annotations

import base64
import datetime
import json

import torch
import torch.distributed as dist


def gpu_uuid(device: torch.device) -> str:
    """The physical GPU's UUID (the same whatever CUDA_VISIBLE_DEVICES numbering a process has)."""
    return str(torch.cuda.get_device_properties(device).uuid)


class _Done:
    """The `Work` a broadcast returns: already complete when `broadcast` returns (so a stopping
    sender's abort is seen between buckets, not inside one)."""

    def is_completed(self) -> bool:
        return True

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        return True


class IpcGroup:
    """One rank 0 and ``size - 1`` receivers on the same GPU, rendezvousing through `store`.

    Args:
        store: the weight-sync store, already prefixed for this group.
        rank: 0 sends, others receive.
        size: ranks in the group.
        device: this rank's CUDA device (indexed).
        timeout_s: bound (s) on each wait for the peers.

    Raises:
        RuntimeError: a peer is on another GPU, or did not answer within `timeout_s`.
    """

    def __init__(self, store: dist.Store, rank: int, size: int, device: torch.device, timeout_s: float) -> None:
        self.store, self.rank, self.size, self.device = store, rank, size, device
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.uuid = gpu_uuid(device)
        self._seq = 0

    def broadcast(self, raw: torch.Tensor, root: int, timeout: datetime.timedelta | None = None) -> _Done:
        """Rank 0: publish `raw`'s memory and wait until every receiver copied it. Receivers: fill
        `raw` (``[nbytes]`` uint8 on this GPU) from rank 0's bucket of the same size.

        Raises:
            RuntimeError: root is not 0; a size or GPU mismatch; a peer timed out.
        """
        if root != 0:
            raise RuntimeError(f"cuda-ipc broadcast: root must be 0, got {root}")
        self._seq += 1
        key = f"bucket/{self._seq}"
        done = [f"{key}/done/{r}" for r in range(1, self.size)]
        try:
            if self.rank == 0:
                self._send(raw, key, done)
            else:
                self._receive(raw, key, done[self.rank - 1])
        except dist.DistError as err:
            raise RuntimeError(f"cuda-ipc broadcast {key}: a peer did not answer within "
                               f"{self.timeout.total_seconds():.0f} s ({err})") from err
        return _Done()

    def _send(self, raw: torch.Tensor, key: str, done: list[str]) -> None:
        torch.cuda.current_stream(raw.device).synchronize()  # the bucket is written before anyone reads it
        fields = list(raw.untyped_storage()._share_cuda_())
        for i in (1, 4, 6):  # the memory, ref-counter and event handles are bytes
            fields[i] = base64.b64encode(fields[i]).decode() if fields[i] else ""
        self.store.set(key, json.dumps({"share": fields, "offset": raw.storage_offset(), "nbytes": raw.numel(),
                                        "uuid": self.uuid}))
        self.store.wait(done, self.timeout)
        for k in [key, *done]:
            self.store.delete_key(k)

    def _receive(self, raw: torch.Tensor, key: str, done: str) -> None:
        self.store.wait([key], self.timeout)
        doc = json.loads(self.store.get(key))
        if doc["uuid"] != self.uuid:
            raise RuntimeError(f"cuda-ipc: the actor is on GPU {doc['uuid']}, this worker on {self.uuid}; "
                               "cuda-ipc needs one shared GPU (set OMNIRL_WEIGHT_SYNC_BACKEND=gloo or nccl)")
        if doc["nbytes"] != raw.numel():
            raise RuntimeError(f"cuda-ipc: bucket of {doc['nbytes']} bytes, expected {raw.numel()}")
        fields = doc["share"]
        for i in (1, 4, 6):
            fields[i] = base64.b64decode(fields[i]) if fields[i] else b""
        fields[0] = raw.device.index  # the same GPU under this process's numbering
        storage = torch.UntypedStorage._new_shared_cuda(*fields)
        shared = torch.empty(0, dtype=torch.uint8, device=raw.device).set_(storage, doc["offset"], (raw.numel(),))
        raw.copy_(shared)
        torch.cuda.current_stream(raw.device).synchronize()
        del shared, storage  # unmap before rank 0 may free the bucket
        self.store.set(done, "1")

    def shutdown(self) -> None:
        """Nothing to release: mappings are dropped after each bucket."""

"""Actor → rollout weight broadcast over torch.distributed, with binding verification.

docs/architecture.md §2 step 5 and §3 "Weight sync". One actor hosts a TCPStore and runs `WeightSender`;
every rollout worker runs a `WeightReceiver`. Each is its own process and may (re)start at any time.

Protocol (store keys in `protocol`): a receiver registers (a new *incarnation* per start). A sync
is a *generation*: the sender writes a JSON `Manifest` (names, shapes, dtypes, bucket layout, one
checksum per tensor — see `manifest`) and one assignment per receiver; receivers that are ready
get ranks 1..n (order published in ``gen/{g}/go``) in a group with the sender (rank 0), built from
``PrefixStore("sync/{gid}", store)`` — gloo on CPU, nccl on CUDA, hccl on Ascend (see `groups`).
The group is reused while the membership is unchanged. Tensors travel as raw bytes in flat
same-dtype buckets of ≤ ``bucket_mb``; no pickle anywhere. Each receiver binds by exact name,
verifies checksums on arrival and after the copy, and writes ``ack/{version}/{worker_id}``.

Rules:
- A bind that is not exact (zero tensors, a missing or unexpected name, a checksum mismatch) raises
  `BindingError` on the receiver and on the sender, naming worker ids and modules: a job failure.
- A receiver that does not answer within ``timeout_s`` (per phase) is **deregistered and reported**:
  the sync completes for the others, then the sender raises `ReceiverLost` (with ``.lost`` and the
  partial ``.report``). Uncaught, it fails the actor, which restarts and re-syncs every worker; an
  actor that prefers to continue catches it, logs and counts it (``WeightSender.lost_total``). It is
  never silently ignored. A dropped worker that is still alive sees ``evict/{id}`` and registers
  again; restarted and late workers get the current weights from `WeightSender.serve_new_members`.
- A sender built with ``abort`` (the actor: "SIGTERM received") stops waiting for its receivers
  when it returns True and raises `SyncAborted`: a stopping actor must not wait out ``timeout_s``
  for rollout workers that are stopping too.

Public API: `WeightSender`, `SyncReport`, `WeightReceiver`, `BindReport`, `apply_to_module`,
`named_trainable_tensors`, `tensor_checksum`, and the errors `WeightSyncError`, `BindingError`,
`ReceiverLost`, `SyncAborted`. Imports only torch and the standard library (nothing else of ours).
"""

from omnirl.weight_sync.binding import BindReport, apply_to_module
from omnirl.weight_sync.errors import BindingError, ReceiverLost, SyncAborted, WeightSyncError
from omnirl.weight_sync.manifest import Manifest, named_trainable_tensors, tensor_checksum
from omnirl.weight_sync.receiver import WeightReceiver
from omnirl.weight_sync.sender import SyncReport, WeightSender

__all__ = [
    "BindReport",
    "BindingError",
    "Manifest",
    "ReceiverLost",
    "SyncAborted",
    "SyncReport",
    "WeightReceiver",
    "WeightSender",
    "WeightSyncError",
    "apply_to_module",
    "named_trainable_tensors",
    "tensor_checksum",
]

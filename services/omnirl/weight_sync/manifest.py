"""What a sync carries: the manifest (names, shapes, dtypes, bucket layout, checksums) and the buckets.

The sender publishes the manifest as JSON in the TCPStore *before* any tensor moves; the data then
travels as raw bytes over the collective, one flat bucket per broadcast. No pickle anywhere.

Checksum (`tensor_checksum`): the tensor's raw bytes are read as 16-bit words u_j (1-byte dtypes:
bytes); with k = j mod 2^20, two position-weighted sums are formed in exact integer arithmetic,

    S1 = Σ_j u_j · (1 + (k · 40503 mod 32749)),   S2 = Σ_j u_j · (1 + (k · 48271 mod 32719)),

each mod 2^64, written as 32 hex digits. Every weight lies in [1, 2^15] and |Δu| < 2^16, so a
change of any single word always changes both sums; swapping two words changes them unless both
weight sequences agree at the two positions (periods 32749 and 32719 are coprime primes). Each
product is < 2^31 (int32) and each 2^20-word partial sum < 2^51 (int64): no overflow, and integer
sums are associative, so the value is identical on CPU, CUDA or NPU whatever the reduction order —
unlike float sums. It is computed where the tensor lives (no device → host copy of the weights);
the weight table (2 × 2^20 int32, 8 MiB) is built once per device.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from omnirl.api.spec import is_lora_tensor

_WEIGHTS = ((40503, 32749), (48271, 32719))  # (multiplier, prime modulus) per sum
_CHUNK_WORDS = 1 << 20
_MASK64 = (1 << 64) - 1
_TABLES: dict[torch.device, torch.Tensor] = {}
SCOPE_ADAPTERS = "adapters"
SCOPE_FULL = "full"


def _weight_table(device: torch.device) -> torch.Tensor:
    """``[2, 2^20]`` int32: row i holds 1 + (k · multiplier_i mod modulus_i) for k = 0 … 2^20 − 1."""
    table = _TABLES.get(device)
    if table is None:
        k = torch.arange(_CHUNK_WORDS, dtype=torch.int64, device=device)
        table = torch.stack([(k * mult) % mod + 1 for mult, mod in _WEIGHTS]).to(torch.int32)
        _TABLES[device] = table
    return table


def tensor_checksum(t: torch.Tensor) -> str:
    """Position-weighted checksum of a tensor's raw bytes (formula in the module docstring).

    Args:
        t: any dtype, any device, any shape (non-contiguous tensors are made contiguous first).

    Returns:
        32 lowercase hex digits (S1 then S2, 16 digits each). Bit-identical tensors of the same
        dtype give equal strings; the shape is not part of it (the manifest carries the shape).
    """
    flat = t.detach().contiguous().reshape(-1)
    words = flat.view(torch.int16) if flat.element_size() >= 2 else flat.view(torch.uint8)
    table = _weight_table(words.device)
    parts = []
    for start in range(0, words.numel(), _CHUNK_WORDS):
        u = words[start:start + _CHUNK_WORDS].to(torch.int32) & 0xFFFF
        parts.append((u * table[:, :u.numel()]).sum(dim=1, dtype=torch.int64))
    sums = torch.stack(parts).sum(dim=0).tolist() if parts else [0, 0]  # int64 wrap = mod 2^64
    return f"{sums[0] & _MASK64:016x}{sums[1] & _MASK64:016x}"


def named_trainable_tensors(module: nn.Module, adapters_only: bool) -> dict[str, torch.Tensor]:
    """The tensors the actor broadcasts, keyed by the names a rollout worker binds.

    Args:
        module: the actor's model (a peft-injected module when LoRA is on).
        adapters_only: True → only state_dict entries whose name contains ``lora_`` (peft adapter
            names such as ``blocks.0.attn.qkv.lora_A.default.weight``); False → the whole state_dict.

    Returns:
        name → detached tensor (shares storage with the module; no copy).

    Raises:
        ValueError: the selection is empty (e.g. adapters_only=True on a module without LoRA).
    """
    state = module.state_dict()
    named = {n: t for n, t in state.items() if not adapters_only or is_lora_tensor(n)}
    if not named:
        what = "no LoRA tensors (names containing 'lora_')" if adapters_only else "an empty state_dict"
        raise ValueError(f"named_trainable_tensors: module {type(module).__name__} has {what}; "
                         "inject the adapters first or pass adapters_only=False")
    return named


def scope_of(names: Iterable[str]) -> str:
    """``"adapters"`` when every name is a LoRA tensor (contains ``lora_``), else ``"full"``."""
    return SCOPE_ADAPTERS if all(is_lora_tensor(n) for n in names) else SCOPE_FULL


def dtype_from_name(name: str) -> torch.dtype:
    """``"float32"`` → ``torch.float32``; raises ValueError for a name that is not a torch dtype."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"manifest dtype {name!r} is not a torch dtype")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` → ``"float32"`` (the manifest's spelling)."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a sync: where it lies in its bucket (offset and numel in elements)."""

    name: str
    shape: list[int]
    dtype: str
    bucket: int
    offset: int
    numel: int
    checksum: str


@dataclass(frozen=True)
class BucketEntry:
    """One flat bucket: all tensors of one dtype, concatenated; nbytes = numel × element size."""

    dtype: str
    numel: int
    nbytes: int


@dataclass(frozen=True)
class Manifest:
    """Everything a receiver needs before the first byte arrives (published as JSON).

    Attributes:
        version: the policy_version these weights are.
        scope: ``"adapters"`` (LoRA only) or ``"full"``; decides which module names must be bound.
        tensors: in broadcast order.
        buckets: in broadcast order; bucket i is one broadcast of ``nbytes`` bytes.
    """

    version: int
    scope: str
    tensors: list[TensorEntry]
    buckets: list[BucketEntry]

    @property
    def nbytes(self) -> int:
        """Total payload in bytes."""
        return sum(b.nbytes for b in self.buckets)

    def to_json(self) -> str:
        """Compact JSON text (the store value)."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Inverse of `to_json`; raises ValueError on a malformed document."""
        try:
            doc = json.loads(text)
            return cls(version=int(doc["version"]), scope=str(doc["scope"]),
                       tensors=[TensorEntry(**e) for e in doc["tensors"]],
                       buckets=[BucketEntry(**b) for b in doc["buckets"]])
        except (KeyError, TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"malformed weight-sync manifest: {err}") from err


def build_manifest(named: dict[str, torch.Tensor], version: int, bucket_bytes: int) -> Manifest:
    """Lay `named` out in buckets of one dtype each, ≤ `bucket_bytes` (a larger tensor gets its own).

    Args:
        named: name → tensor (any devices); insertion order is kept within each dtype.
        version: policy_version.
        bucket_bytes: bucket capacity in bytes (> 0).

    Raises:
        ValueError: `named` is empty, or `bucket_bytes` ≤ 0.
    """
    if not named:
        raise ValueError("named_tensors is empty: nothing to broadcast")
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_mb must be > 0 (got {bucket_bytes} bytes)")
    by_dtype: dict[torch.dtype, list[str]] = {}
    for name, t in named.items():
        by_dtype.setdefault(t.dtype, []).append(name)
    tensors: list[TensorEntry] = []
    buckets: list[BucketEntry] = []
    for dtype, names in by_dtype.items():
        size = torch.empty((), dtype=dtype).element_size()
        numel = -1  # -1: no open bucket
        for name in names:
            t = named[name]
            if numel < 0 or (numel + t.numel()) * size > bucket_bytes:
                if numel > 0:
                    buckets.append(BucketEntry(dtype_name(dtype), numel, numel * size))
                numel = 0
            tensors.append(TensorEntry(name, list(t.shape), dtype_name(dtype), len(buckets), numel,
                                       t.numel(), tensor_checksum(t)))
            numel += t.numel()
        buckets.append(BucketEntry(dtype_name(dtype), numel, numel * size))
    return Manifest(version, scope_of(named), tensors, buckets)


def pack_bucket(manifest: Manifest, index: int, named: dict[str, torch.Tensor],
                device: torch.device) -> torch.Tensor:
    """Bucket `index` as one flat tensor of its dtype on `device` (a new buffer). Shape ``[numel]``."""
    parts = [named[e.name].detach().reshape(-1).to(device) for e in manifest.tensors if e.bucket == index]
    return torch.cat(parts) if len(parts) > 1 else parts[0].clone()


def empty_bucket(manifest: Manifest, index: int, device: torch.device) -> torch.Tensor:
    """An uninitialised receive buffer for bucket `index`: shape ``[numel]``, the bucket's dtype."""
    b = manifest.buckets[index]
    return torch.empty(b.numel, dtype=dtype_from_name(b.dtype), device=device)


def unpack_bucket(manifest: Manifest, index: int, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views into a received bucket: name → tensor of the manifest's shape (no copy)."""
    return {e.name: flat[e.offset:e.offset + e.numel].view(e.shape)
            for e in manifest.tensors if e.bucket == index}

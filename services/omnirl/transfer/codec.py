"""The wire codec of the TransferQueue: safetensors for tensors, msgpack for metadata, no pickle.

Tensors travel as the bytes of one safetensors file (a JSON header naming dtype, shape and byte
offsets, then the raw little-endian data), so a decode is bit-exact for every dtype safetensors
knows (float32, bfloat16, float16, int64, uint8, bool, …) and cannot execute code. Metadata is a
msgpack map restricted to plain values: ``None``, ``bool``, ``int`` (64-bit), ``float``, ``str``,
``bytes``, lists/tuples and dicts of those (tuples come back as lists).
"""

from __future__ import annotations

from typing import Any

import msgpack
import torch
from safetensors.torch import load as _st_load
from safetensors.torch import save as _st_save

_SCALARS = (type(None), bool, int, float, str, bytes)


def encode_tensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """Serialise named tensors to safetensors bytes.

    Args:
        tensors: name → tensor of any shape and any safetensors dtype, on any device; each is
            detached, copied to CPU and made contiguous first (the caller's tensors are untouched).

    Returns:
        The bytes of one safetensors file; :func:`decode_tensors` inverts it bit-exactly.

    Raises:
        TypeError: when ``tensors`` is not a dict, a name is not a str, or a value is not a tensor
            (the message names the key).
    """
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict[str, torch.Tensor], got {type(tensors).__name__}")
    prepared: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor name {name!r} must be a str, got {type(name).__name__}")
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"tensors[{name!r}] must be a torch.Tensor, got {type(value).__name__}; "
                "put plain values in the metadata instead"
            )
        prepared[name] = value.detach().to("cpu").contiguous()
    return _st_save(prepared)


def decode_tensors(data: bytes) -> dict[str, torch.Tensor]:
    """Inverse of :func:`encode_tensors`: safetensors bytes → name → CPU tensor.

    Raises:
        TypeError: when ``data`` is not bytes.
        ValueError: when ``data`` is not a valid safetensors file (truncated or corrupted).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    try:
        return _st_load(bytes(data))
    except Exception as err:  # safetensors raises its own SafetensorError; re-raise a clear one
        raise ValueError(f"not a valid safetensors payload ({len(data)} bytes): {err}") from err


def _find_unencodable(value: Any, path: str) -> tuple[str, Any] | None:
    """Depth-first search for the first value msgpack cannot encode; returns (path, value)."""
    if isinstance(value, bool) or value is None or isinstance(value, (float, str, bytes)):
        return None
    if isinstance(value, int):
        return None if -(2**63) <= value < 2**64 else (path, value)
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _find_unencodable(item, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                return (f"{path} key {key!r}", key)
            found = _find_unencodable(item, f"{path}[{key!r}]")
            if found is not None:
                return found
        return None
    return (path, value)


def encode_meta(meta: dict) -> bytes:
    """Serialise a metadata dict with msgpack (no pickle, no custom types).

    Raises:
        TypeError: when ``meta`` is not a dict, or holds a value msgpack cannot encode (a tensor,
            a numpy scalar, an object, an int beyond 64 bits); the message names the key path,
            e.g. ``meta['reward']['raw']``, and the fix (``.item()`` / ``.tolist()`` or send it
            as a tensor).
    """
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a dict, got {type(meta).__name__}")
    found = _find_unencodable(meta, "meta")
    if found is not None:
        path, value = found
        raise TypeError(
            f"{path} of type {type(value).__name__} cannot be sent as metadata: use plain "
            "None/bool/int/float/str/bytes/list/dict values (call .item() or .tolist() on a scalar "
            "tensor), or send it in the tensors dict"
        )
    return msgpack.packb(meta, use_bin_type=True)


def decode_meta(data: bytes) -> dict:
    """Inverse of :func:`encode_meta` (tuples come back as lists).

    Raises:
        ValueError: when ``data`` is not msgpack or does not hold a map.
    """
    try:
        meta = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)
    except Exception as err:  # msgpack raises several unrelated exception types
        raise ValueError(f"metadata is not valid msgpack ({len(data)} bytes): {err}") from err
    if not isinstance(meta, dict):
        raise ValueError(f"metadata must decode to a dict, got {type(meta).__name__}")
    return meta

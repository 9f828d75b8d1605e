"""Pure tests of the wire codec and the key names (no Redis)."""

from __future__ import annotations

import msgpack
import pytest
import torch

from omnirl.transfer.codec import decode_meta, decode_tensors, encode_meta, encode_tensors
from omnirl.transfer.keys import StreamNames, done_key, image_key, job_pattern, kv_key, tensor_key, validate_job


def _bits(t: torch.Tensor) -> bytes:
    """The raw bytes of a tensor, so NaN payloads and -0.0 compare bit-exactly."""
    return t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [
        (torch.float32, (2, 3, 4)),
        (torch.bfloat16, (5, 7)),
        (torch.int64, (11,)),
        (torch.uint8, (3, 8, 8)),
        (torch.float16, (1, 1, 1, 2)),
        (torch.bool, (6,)),
        (torch.float32, ()),
        (torch.float32, (0, 4)),
    ],
)
def test_tensor_round_trip_is_bit_exact(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(0)
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=gen).to(dtype)
        if x.numel() >= 2:
            x.view(-1)[0] = float("nan")
            x.view(-1)[1] = -0.0
    elif dtype == torch.bool:
        x = torch.randint(0, 2, shape, generator=gen).bool()
    else:
        hi = 256 if dtype == torch.uint8 else 2**62
        x = torch.randint(0, hi, shape, generator=gen, dtype=dtype)
    out = decode_tensors(encode_tensors({"x": x}))
    assert list(out) == ["x"]
    assert out["x"].dtype == dtype
    assert tuple(out["x"].shape) == shape
    assert _bits(out["x"]) == _bits(x)


def test_many_tensors_non_contiguous_and_views_of_one_storage() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    tensors = {
        "latents": base.t(),  # non-contiguous
        "first": base[:2],  # two views of one storage
        "last": base[2:],
        "log_prob": torch.tensor([-1.5, 0.25], dtype=torch.float64),
        "token_ids": torch.tensor([[101, 7, 102]], dtype=torch.int64),
    }
    out = decode_tensors(encode_tensors(tensors))
    assert set(out) == set(tensors)
    for name, value in tensors.items():
        assert torch.equal(out[name], value), name
    assert out["latents"].is_contiguous()
    assert base.stride() == (6, 1)  # the caller's tensor is untouched


def test_encode_tensors_rejects_non_tensors_naming_the_key() -> None:
    with pytest.raises(TypeError, match=r"tensors\['reward'\]"):
        encode_tensors({"x": torch.ones(1), "reward": 0.5})
    with pytest.raises(TypeError, match="must be a dict"):
        encode_tensors([torch.ones(1)])


def test_decode_tensors_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="safetensors"):
        decode_tensors(b"\x00\x01not safetensors")


def test_meta_round_trip() -> None:
    meta = {
        "sample_id": "3:1:0",
        "policy_version": 7,
        "reward": 0.625,
        "prompt": "a red \u00fcmlaut cat",
        "seeds": [1, 2, 2**40],
        "ok": True,
        "none": None,
        "raw": b"\x00\xff",
        "nested": {"sigma": [1.0, 0.5], "3": {"deep": -1}},
        "neg_big": -(2**63),
    }
    assert decode_meta(encode_meta(meta)) == meta
    assert decode_meta(encode_meta({"t": (1, 2)})) == {"t": [1, 2]}  # tuples come back as lists


def test_meta_is_plain_msgpack_not_pickle() -> None:
    data = encode_meta({"a": 1})
    assert msgpack.unpackb(data) == {"a": 1}
    assert not data.startswith(b"\x80")  # a pickle stream starts with the PROTO opcode


@pytest.mark.parametrize(
    ("meta", "path"),
    [
        ({"sample_id": "1", "log_prob": torch.zeros(2)}, r"meta\['log_prob'\] of type Tensor"),
        ({"a": {"b": [1, torch.tensor(1.0)]}}, r"meta\['a'\]\['b'\]\[1\] of type Tensor"),
        ({"x": object()}, r"meta\['x'\] of type object"),
        ({"big": 2**70}, r"meta\['big'\] of type int"),
        ({(1, 2): 3}, r"meta key \(1, 2\)"),
    ],
)
def test_meta_refuses_unencodable_values_naming_the_key(meta: dict, path: str) -> None:
    with pytest.raises(TypeError, match=path):
        encode_meta(meta)


def test_meta_must_be_a_dict_both_ways() -> None:
    with pytest.raises(TypeError, match="meta must be a dict"):
        encode_meta([1, 2])
    with pytest.raises(ValueError, match="must decode to a dict"):
        decode_meta(msgpack.packb([1, 2]))
    with pytest.raises(ValueError, match="not valid msgpack"):
        decode_meta(b"\xc1")


def test_key_names() -> None:
    names = StreamNames("demo-ocr")
    assert names.requests == "omnirl:demo-ocr:requests"
    assert names.samples == "omnirl:demo-ocr:samples"
    assert names.scores == "omnirl:demo-ocr:scores"
    assert names.control == "omnirl:demo-ocr:control"
    assert names.all() == (names.requests, names.samples, names.scores, names.control)
    assert tensor_key("demo-ocr", "3:1:0") == "omnirl:demo-ocr:tensors:3:1:0"
    assert image_key(tensor_key("demo-ocr", "3:1:0")) == "omnirl:demo-ocr:images:3:1:0"
    assert image_key("omnirl:j:tensors:val:tensors:1") == "omnirl:j:images:val:tensors:1"  # only the job's segment
    for bad in ("omnirl:j:kv:x", "other:j:tensors:1", "omnirl:a:b:tensors:1", None):
        with pytest.raises(ValueError, match="is not a tensor key"):
            image_key(bad)
    assert job_pattern("demo-ocr") == "omnirl:demo-ocr:*"
    assert done_key("j", "reward", "0:0:1") == "omnirl:j:done:reward:0:0:1"
    assert kv_key("j", "policy_version") == "omnirl:j:kv:policy_version"


@pytest.mark.parametrize("job", ["", "a:b", "has space", "Upper", "-lead", "trail-", "st*r", "q?", "[x]", "a" * 254])
def test_invalid_job_names_are_refused(job: str) -> None:
    with pytest.raises(ValueError, match="invalid job name"):
        StreamNames(job)
    with pytest.raises(ValueError, match="invalid job name"):
        job_pattern(job)


def test_valid_job_names_and_bad_sample_ids() -> None:
    for job in ["a", "demo", "rl-job.v2", "0x1"]:
        assert validate_job(job) == job
    with pytest.raises(ValueError, match="sample_id"):
        tensor_key("demo", "")
    with pytest.raises(ValueError, match="whitespace"):
        tensor_key("demo", "a b")

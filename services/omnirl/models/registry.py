"""`load_adapter`: model family name → a loaded `ModelAdapter` (the one place that dispatches).

Families (`RLJob.spec.model.family`):
- ``"ocr-digits"``: the built-in CPU demo model (`omnirl.models.digits.adapter.load_digits_adapter`).
- ``"sd3"``: SD3 / SD3.5 from a local diffusers directory (`SD3Adapter.load`).
- ``"qwen-image"``: Qwen-Image from a local diffusers directory (`QwenImageAdapter.load`).
- ``"flux"``: FLUX.1 dev/schnell from a local diffusers directory (`FluxAdapter.load`).
"""

from __future__ import annotations

import torch

from omnirl.api.spec import RLJobSpec
from omnirl.models.protocol import ModelAdapter

FAMILIES = ("ocr-digits", "sd3", "qwen-image", "flux")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """`torch.bfloat16` or its spec name `"bfloat16"` → the torch dtype.

    Raises:
        ValueError: an unknown name (the message lists the allowed ones).
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"model.dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def load_adapter(family: str, path: str, device: torch.device | str = "cpu",
                 dtype: torch.dtype | str = torch.float32, **kwargs) -> ModelAdapter:
    """Load the adapter of `family` from `path` onto `device` with weights in `dtype`.

    Args:
        family: one of `FAMILIES`.
        path: local directory ("builtin" for ocr-digits' shipped weights). Nothing is downloaded.
        device: where the modules live.
        dtype: weight dtype (latents and SDE math stay float32 whatever it is).
        kwargs: family-specific constructor options (diffusers families: resolution,
            guidance_scale, negative_prompt, max_sequence_length, cache_size; Qwen-Image also
            text_bucket).
    Raises:
        ValueError: an unknown family (the message lists the supported ones) or dtype.
        FileNotFoundError / OSError: the path or its layout is wrong (see each loader).
    """
    dtype = resolve_dtype(dtype)
    if family == "ocr-digits":
        from omnirl.models.digits.adapter import load_digits_adapter

        if kwargs:
            raise ValueError(f"family 'ocr-digits' takes no options; got {sorted(kwargs)}")
        return load_digits_adapter(path, device=device, dtype=dtype)
    if family == "sd3":
        from omnirl.models.diffusers.sd3 import SD3Adapter

        return SD3Adapter.load(path, device=device, dtype=dtype, **kwargs)
    if family == "qwen-image":
        from omnirl.models.diffusers.qwen_image import QwenImageAdapter

        return QwenImageAdapter.load(path, device=device, dtype=dtype, **kwargs)
    if family == "flux":
        from omnirl.models.diffusers.flux import FluxAdapter

        return FluxAdapter.load(path, device=device, dtype=dtype, **kwargs)
    raise ValueError(f"unknown model.family {family!r}; supported: {', '.join(FAMILIES)}")


def adapter_options(spec: RLJobSpec) -> dict:
    """The constructor options an RLJob sets on its adapter (`load_adapter(..., **options)`).

    Rollout, actor and eval all load with these, so the guided velocity (CFG weight
    `algorithm.sampling.guidanceScale`) and the resolution are the same everywhere. ocr-digits
    takes none (the spec rejects a resolution or CFG for it).
    """
    if spec.model.family == "ocr-digits":
        return {}
    guidance = spec.algorithm.sampling.guidanceScale
    if spec.model.family == "flux" and guidance == 1.0:
        options: dict = {}  # FLUX-dev's embedded guidance keeps its default (3.5); schnell has none
    else:
        options = {"guidance_scale": guidance}
    if spec.model.resolution is not None:
        options["resolution"] = tuple(spec.model.resolution)
    return options


def load_tokenizer(family: str, path: str):
    """Text → token ids for `family`, for the controller (which tokenizes each prompt once).

    For ocr-digits this loads the (tiny) adapter; diffusers families load their adapter on the
    CPU, whose tokenize needs only the tokenizers. Returns a callable `str -> list[int]`.
    """
    return load_adapter(family, path, device="cpu").tokenize

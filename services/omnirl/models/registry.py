"""A model family's name → what the roles, pre-flight and eval need of it, through its registration.

Each family is one adapter module that registers itself (`omnirl.models.families.register_family`): the
built-in `ocr-digits` (`omnirl.models.digits.adapter.DigitsFamily`) and the diffusers families
(`omnirl.models.diffusers.*`); `omnirl.api.extensions.FAMILIES` lists them. The functions here are the ones
callers use; each asks `get_family(family)`, which imports only that family's module.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnirl.api.spec import LoRASpec, RLJobSpec
from omnirl.models.families import get_family
from omnirl.models.protocol import ModelAdapter

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
        family: one of `omnirl.api.extensions.FAMILIES`.
        path: local directory ("builtin" for ocr-digits' shipped weights). Nothing is downloaded.
        device: where the modules live.
        dtype: weight dtype (latents and SDE math stay float32 whatever it is).
        kwargs: family-specific constructor options (diffusers families: resolution,
            guidance_scale, negative_prompt, max_sequence_length, cache_size; Qwen-Image also
            text_bucket; ocr-digits none).
    Raises:
        ValueError: an unknown family (the message lists the supported ones) or dtype, or options the family
            does not take.
        FileNotFoundError / OSError: the path or its layout is wrong (see each loader).
    """
    dtype = resolve_dtype(dtype)
    return get_family(family).load(path, device=device, dtype=dtype, **kwargs)


def adapter_options(spec: RLJobSpec) -> dict:
    """The constructor options an RLJob sets on its adapter (`load_adapter(..., **options)`): its family's
    `adapter_options`.

    Rollout, actor and eval all load with these, so the guided velocity (CFG weight
    `algorithm.sampling.guidanceScale`) and the resolution are the same everywhere.
    """
    return get_family(spec.model.family).adapter_options(spec)


def describe_sigma_grid(spec: RLJobSpec) -> str:
    """One line naming the σ grid a job's rollouts, validation and `omnirl eval` use (`omnirl validate`).

    The manifest's override `algorithm.sampling.shift` is computed here (first and last steps); without it the
    family describes its own grid (`describe_default_grid`: the built-in model's steps, or a diffusers
    family's scheduler config, whose grid depends on each sample's resolution).
    """
    from omnirl.algorithms.sigmas import sigma_schedule

    n, shift = spec.algorithm.sampling.numSteps, spec.algorithm.sampling.shift
    if shift is None:
        return get_family(spec.model.family).describe_default_grid(spec)
    g = [f"{x:.4f}" for x in sigma_schedule(n, shift).tolist()]
    return f"σ grid: override (algorithm.sampling.shift), shift {shift:g}, {n} steps: {g[0]}, {g[1]} … {g[-2]}, {g[-1]}"


def load_tokenizer(family: str, path: str):
    """Text → token ids for `family`, for the controller (which tokenizes each prompt once), from the
    tokenizers alone (no weights are loaded). Returns a callable `str -> list[int]`, equal to the adapter's
    `tokenize` with default options.

    Raises:
        ValueError: an unknown family. FileNotFoundError / OSError: the path or its layout is wrong.
    """
    return get_family(family).load_tokenizer(path)


def check_weight_files(family: str, path: str) -> None:
    """Check that `path` holds every weights file `load_adapter(family, path)` reads, without
    reading them (`omnirl run`'s pre-flight): each family's loader owns its list.

    Raises:
        ValueError: an unknown family. FileNotFoundError: the directory, a subfolder or a weights
            file is missing (the message names the file and the layout).
    """
    get_family(family).check_weights(path)


def check_model_path(family: str, path: str, field: str = "spec.model.path") -> None:
    """`check_weight_files`, its message starting with `field` and ending with the fix; a run's checkpoint
    given as the model (`OUT/checkpoints/latest`: policy.safetensors, state.json) is named as one, with the
    export to use instead. Called before anything reads the model (its tokenizer included: a directory without
    config.json said only "…/config.json not found", naming no field).

    Raises:
        FileNotFoundError: naming `field`, the missing file and the fix.
        ValueError: naming `field` and an unreadable sharded-weights index, or an unknown family.
    """
    if path != "builtin" and all((Path(path) / name).is_file() for name in ("policy.safetensors", "state.json")):
        raise FileNotFoundError(
            f"{field}: {path} is an omnirl run's checkpoint, not a model directory; point {field} at the run's export "
            "(OUT/exports/latest, or omnirl export OUT --out DIR --checkpoint THAT_CHECKPOINT), or continue the run "
            "with omnirl run --resume")
    try:
        check_weight_files(family, path)
    except (FileNotFoundError, ValueError) as err:
        raise type(err)(f"{field}: {path} is incomplete: {err}; copy the whole model directory there, "
                        f"or point {field} at a complete one") from err


def check_lora_targets(family: str, path: str, lora: LoRASpec) -> None:
    """`spec.model.lora.targetModules` (empty: the family's defaults) checked against the model's layers the
    way the roles check them when they inject LoRA (`models.lora.check_targets`), on a skeleton of the model
    built from its config on the meta device (the family's `lora_skeleton`): no weights are read and no memory
    is taken (`omnirl run`'s pre-flight; a no-op with LoRA off). Left to the roles, a target that names no layer
    stopped the job with exit 4 only after Redis, Ray and every role had started and loaded the model.

    Raises:
        ConfigError (a ValueError): naming `spec.model.lora.targetModules`, the target and the model's linear layers.
        FileNotFoundError / OSError / ValueError: the model's config is missing or unreadable (`check_model_path`
            names those first).
    """
    if not lora.enabled:
        return
    from omnirl.models.lora import check_targets

    loader = get_family(family)
    with torch.device("meta"):  # the layers' names and types only: parameters without storage
        module = loader.lora_skeleton(path)
    check_targets(module, list(lora.targetModules or loader.default_lora_targets))


def default_lora_targets(family: str) -> list[str]:
    """The layers LoRA adapts in `family`'s model when `spec.model.lora.targetModules` is empty (what the roles'
    `inject_lora` gets then).

    Raises:
        ValueError: an unknown family.
    """
    return list(get_family(family).default_lora_targets)



def check_media(spec: RLJobSpec) -> str | None:
    """The clip of a video family's job checked against its VAE and patch (the family's `check_media` hook: the
    configs of `model.path` when they are here, else the released checkpoints' factors), for `omnirl validate` and
    `omnirl run`'s pre-flight. Returns the line saying what was checked; for a family whose sizes are its model's
    (`FamilyInfo.media`, checked by the spec itself) the line saying those sizes; None for a family with neither.

    Raises:
        ValueError: naming `spec.model.video.<key>` (or `spec.model.audio.<key>`) and the nearest valid values.
    """
    family = get_family(spec.model.family)
    hook = getattr(family, "check_media", None)
    if hook is not None:
        return hook(spec)
    if family.info.media:
        sizes = "; ".join(f"{key} " + ", ".join(f"{name} {value:g}" for name, value in fixed.items())
                          for key, fixed in family.info.media.items())
        return f"{family.family} media: the model's own sizes ({sizes}), the only ones it makes"
    return None

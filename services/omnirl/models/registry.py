"""`load_adapter`: model family name → a loaded `ModelAdapter` (the one place that dispatches).

Families (`RLJob.spec.model.family`):
- ``"ocr-digits"``: the built-in CPU demo model (`omnirl.models.digits.adapter.load_digits_adapter`).
- ``"sd3"``: SD3 / SD3.5 from a local diffusers directory (`SD3Adapter.load`).
- ``"qwen-image"``: Qwen-Image from a local diffusers directory (`QwenImageAdapter.load`).
- ``"flux"``: FLUX.1 dev/schnell from a local diffusers directory (`FluxAdapter.load`).
- ``"av-digits"``: the built-in audio+video demo model (`omnirl.models.avdigits.adapter.load_avdigits_adapter`):
  a flat multi-modal latent (`models/layout.py`), media decoded by `decode_media` (docs/omni.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omnirl.api.spec import LoRASpec, RLJobSpec
from omnirl.models.protocol import ModelAdapter

FAMILIES = ("ocr-digits", "sd3", "qwen-image", "flux", "av-digits")

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
    if family == "av-digits":
        from omnirl.models.avdigits.adapter import load_avdigits_adapter

        unknown = sorted(set(kwargs) - {"modalities"})
        if unknown:
            raise ValueError(f"family 'av-digits' takes only the option modalities; got {unknown}")
        return load_avdigits_adapter(path, device=device, dtype=dtype, **kwargs)
    return _diffusers_class(family).load(path, device=device, dtype=dtype, **kwargs)


def adapter_options(spec: RLJobSpec) -> dict:
    """The constructor options an RLJob sets on its adapter (`load_adapter(..., **options)`).

    Rollout, actor and eval all load with these, so the guided velocity (CFG weight
    `algorithm.sampling.guidanceScale`) and the resolution are the same everywhere. ocr-digits
    takes none (the spec rejects a resolution or CFG for it).
    """
    if spec.model.family == "ocr-digits":
        return {}
    guidance = spec.algorithm.sampling.guidanceScale
    if spec.model.family == "av-digits":  # per-modality training, weights and guidance (`models/layout.py`)
        return {"modalities": spec.model.modality_settings(guidance)}
    if spec.model.family == "flux" and guidance == 1.0:
        options: dict = {}  # FLUX-dev's embedded guidance keeps its default (3.5); schnell has none
    else:
        options = {"guidance_scale": guidance}
    default = spec.model.resolution_for(0)  # with model.resolutions, requests carry their own sizes
    if default is not None:
        options["resolution"] = default
    return options


def describe_sigma_grid(spec: RLJobSpec) -> str:
    """One line naming the σ grid a job's rollouts, validation and `omnirl eval` use (`omnirl validate`).

    The manifest's override `algorithm.sampling.shift` and the built-in model's grid are computed
    here (first and last steps); a diffusers family's own grid depends on each sample's resolution,
    so the line names its scheduler config (and its shift, when that file is readable here).
    """
    from omnirl.algorithms.sigmas import sigma_schedule

    n, shift, family = spec.algorithm.sampling.numSteps, spec.algorithm.sampling.shift, spec.model.family
    if shift is None and family not in ("ocr-digits", "av-digits"):
        config = Path(spec.model.path) / "scheduler" / "scheduler_config.json"
        try:
            cfg = json.loads(config.read_text())
        except (OSError, ValueError):
            return f"σ grid: family default ({family}: its scheduler's grid, {n} steps; {config} not readable here)"
        kind = "dynamic, by image size" if cfg.get("use_dynamic_shifting") else f"shift {cfg.get('shift', 1.0)}"
        return f"σ grid: family default ({family}: its scheduler's grid, {kind}, {n} steps, from {config})"
    if shift is None:
        from omnirl.models.digits.adapter import FAMILY_SHIFT, digits_sigma_grid

        source, shift, grid = f"family default ({family})", FAMILY_SHIFT, digits_sigma_grid(n)
    else:
        source, grid = "override (algorithm.sampling.shift)", sigma_schedule(n, shift)
    g = [f"{x:.4f}" for x in grid.tolist()]
    return f"σ grid: {source}, shift {shift:g}, {n} steps: {g[0]}, {g[1]} … {g[-2]}, {g[-1]}"


def load_tokenizer(family: str, path: str):
    """Text → token ids for `family`, for the controller (which tokenizes each prompt once), from the
    tokenizers alone: ocr-digits reads its config.json, diffusers families their tokenizer folders
    (no weights are loaded). Returns a callable `str -> list[int]`, equal to the adapter's `tokenize`
    with default options.

    Raises:
        ValueError: an unknown family. FileNotFoundError / OSError: the path or its layout is wrong.
    """
    if family == "ocr-digits":
        from omnirl.models.digits.adapter import load_digits_tokenizer

        return load_digits_tokenizer(path)
    if family == "av-digits":
        from omnirl.models.avdigits.adapter import load_avdigits_tokenizer

        return load_avdigits_tokenizer(path)
    return _diffusers_class(family).load_tokenizer(path)


def check_weight_files(family: str, path: str) -> None:
    """Check that `path` holds every weights file `load_adapter(family, path)` reads, without
    reading them (`omnirl run`'s pre-flight): each family's loader owns its list.

    Raises:
        ValueError: an unknown family. FileNotFoundError: the directory, a subfolder or a weights
            file is missing (the message names the file and the layout).
    """
    if family == "ocr-digits":
        from omnirl.models.digits.adapter import check_digits_weights

        check_digits_weights(path)
        return
    if family == "av-digits":
        from omnirl.models.avdigits.adapter import check_avdigits_weights

        check_avdigits_weights(path)
        return
    _diffusers_class(family).check_weights(path)


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
    built from its config on the meta device: no weights are read and no memory is taken (`omnirl run`'s
    pre-flight; a no-op with LoRA off). Left to the roles, a target that names no layer stopped the job with
    exit 4 only after Redis, Ray and every role had started and loaded the model.

    Raises:
        ConfigError (a ValueError): naming `spec.model.lora.targetModules`, the target and the model's linear layers.
        FileNotFoundError / OSError / ValueError: the model's config is missing or unreadable (`check_model_path`
            names those first).
    """
    if not lora.enabled:
        return
    from omnirl.models.lora import check_targets

    with torch.device("meta"):  # the layers' names and types only: parameters without storage
        if family == "ocr-digits":
            from omnirl.models.digits.adapter import _digits_directory, read_digits_config
            from omnirl.models.digits.model import LORA_TARGET_MODULES, DigitsConfig, DigitsDiT

            config = read_digits_config(_digits_directory(path))["model"]
            module, defaults = DigitsDiT(DigitsConfig.from_dict(config)), LORA_TARGET_MODULES
        elif family == "av-digits":
            from omnirl.models.avdigits.adapter import avdigits_directory, read_avdigits_config
            from omnirl.models.avdigits.model import LORA_TARGET_MODULES as AV_TARGETS
            from omnirl.models.avdigits.model import AVDigitsConfig, AVDigitsDiT

            config = read_avdigits_config(avdigits_directory(path))["model"]
            module, defaults = AVDigitsDiT(AVDigitsConfig.from_dict(config)), AV_TARGETS
        else:
            adapter_cls = _diffusers_class(family)
            transformer_cls = adapter_cls.transformer_class()
            config = transformer_cls.load_config(str(Path(path) / "transformer"), local_files_only=True)
            module, defaults = transformer_cls.from_config(config), adapter_cls.default_lora_targets
    check_targets(module, list(lora.targetModules or defaults))


def default_lora_targets(family: str) -> list[str]:
    """The layers LoRA adapts in `family`'s model when `spec.model.lora.targetModules` is empty (what the roles'
    `inject_lora` gets then).

    Raises:
        ValueError: an unknown family.
    """
    if family == "ocr-digits":
        from omnirl.models.digits.model import LORA_TARGET_MODULES

        return list(LORA_TARGET_MODULES)
    if family == "av-digits":
        from omnirl.models.avdigits.model import LORA_TARGET_MODULES as AV_TARGETS

        return list(AV_TARGETS)
    return list(_diffusers_class(family).default_lora_targets)


def _diffusers_class(family: str):
    if family == "sd3":
        from omnirl.models.diffusers.sd3 import SD3Adapter

        return SD3Adapter
    if family == "qwen-image":
        from omnirl.models.diffusers.qwen_image import QwenImageAdapter

        return QwenImageAdapter
    if family == "flux":
        from omnirl.models.diffusers.flux import FluxAdapter

        return FluxAdapter
    raise ValueError(f"unknown model.family {family!r}; supported: {', '.join(FAMILIES)}")

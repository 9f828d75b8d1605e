"""Pieces shared by the diffusers-family adapters: layout checks, σ grids, prompt cache, images.

diffusers and transformers are imported inside functions only, so importing this module (and
`omnirl.models`) never requires them.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor


def require_diffusers() -> None:
    """Raise a clear ImportError when diffusers/transformers are missing.

    Raises:
        ImportError: naming the extra to install (`pip install 'omnirl[diffusers]'`).
    """
    try:
        import diffusers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"the diffusers model families need diffusers and transformers ({err}); "
            "install them with `pip install 'omnirl[diffusers]'`"
        ) from err


def check_pipeline_dir(path: str | Path, family: str, required: Sequence[str]) -> Path:
    """Check that `path` is a local diffusers pipeline directory holding `required` subfolders.

    Raises:
        FileNotFoundError: the directory or one of its subfolders is missing; the message names
            the path and the expected layout (nothing is ever downloaded).
    """
    root = Path(path)
    layout = ", ".join(f"{name}/" for name in required)
    if not root.is_dir():
        raise FileNotFoundError(
            f"model.path {str(path)!r} for family {family!r} is not a readable local directory; expected a "
            f"diffusers pipeline directory (as written by `save_pretrained`) with subfolders {layout}"
        )
    missing = [name for name in required if not (root / name).is_dir()]
    if missing:
        raise FileNotFoundError(
            f"model.path {str(root)!r} for family {family!r} lacks subfolder(s) {missing}; expected a diffusers "
            f"pipeline directory with subfolders {layout}"
        )
    return root


DIFFUSERS_WEIGHTS = "diffusion_pytorch_model.safetensors"
"""A diffusers model folder's weights (transformer/, vae/) as `save_pretrained` writes them."""
TRANSFORMERS_WEIGHTS = "model.safetensors"
"""A transformers model folder's weights (text_encoder*/) as `save_pretrained` writes them."""


def missing_weights(folder: Path, weights_name: str) -> Path | None:
    """The weights file `from_pretrained(folder, use_safetensors=True)` would not find, or None.

    Present means `weights_name` itself, or its sharded index `{weights_name}.index.json` (large
    models) with every shard its `weight_map` names. Without either the answer is
    `folder/weights_name`. Only existence is checked; nothing is read but the index.

    Raises:
        ValueError: the index is not JSON with a `weight_map` mapping (naming the file).
    """
    single, index = folder / weights_name, folder / f"{weights_name}.index.json"
    if single.is_file():
        return None
    if not index.is_file():
        return single
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{index} is not a sharded-weights index (JSON with a 'weight_map' mapping): "
                         f"{type(err).__name__}: {err}") from err
    return next((folder / shard for shard in shards if not (folder / shard).is_file()), None)


def check_resolution(resolution: Sequence[int], multiple: int) -> tuple[int, int]:
    """Validate an image size `(height, width)` in pixels that must be a multiple of `multiple`.

    Raises:
        ValueError: not two positive ints, or not divisible (the message gives the nearest sizes).
    """
    if len(resolution) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in resolution):
        raise ValueError(f"resolution must be (height, width) in pixels, two positive ints; got {resolution!r}")
    h, w = resolution
    if h % multiple or w % multiple:
        raise ValueError(
            f"resolution {h}x{w} is not a multiple of {multiple} (VAE downsampling x patch size); "
            f"use e.g. {h // multiple * multiple or multiple}x{w // multiple * multiple or multiple}"
        )
    return int(h), int(w)


def dynamic_shift_mu(image_seq_len: int, config: dict) -> float:
    """mu of resolution-dependent shifting: linear in the image token count.

    mu = base_shift + (max_shift − base_shift)·(L − base_len)/(max_len − base_len), the
    `calculate_shift` of diffusers' FLUX/SD3/Qwen-Image pipelines (FLUX.1, Black Forest Labs 2024;
    SD3, arXiv 2403.03206 §5.3.2), with the scheduler config's keys and diffusers' defaults.
    """
    base_len = config.get("base_image_seq_len", 256)
    max_len = config.get("max_image_seq_len", 4096)
    base_shift = config.get("base_shift", 0.5)
    max_shift = config.get("max_shift", 1.15)
    m = (max_shift - base_shift) / (max_len - base_len)
    return float(image_seq_len * m + (base_shift - m * base_len))


def shift_from_config(config: dict, image_seq_len: int) -> float:
    """The SD3-form shift s for which σ' = s·σ/(1 + (s − 1)·σ) reproduces the scheduler's shift.

    Fixed shifting (`use_dynamic_shifting` false): s = config["shift"]. Dynamic shifting: the
    scheduler applies σ' = e^mu/(e^mu + (1/σ − 1)) ("exponential", = SD3 form with s = e^mu) or
    mu/(mu + (1/σ − 1)) ("linear", s = mu), mu from `dynamic_shift_mu`. A `shift_terminal`
    stretch (Qwen-Image) is not a shift and is not included; `scheduler_sigmas` includes it.
    """
    if isinstance(image_seq_len, bool) or not isinstance(image_seq_len, int) or image_seq_len < 1:
        raise ValueError(f"image_seq_len must be an int >= 1 (image tokens after patching), got {image_seq_len!r}")
    if not config.get("use_dynamic_shifting", False):
        return float(config.get("shift", 1.0))
    mu = dynamic_shift_mu(image_seq_len, config)
    if config.get("time_shift_type", "exponential") == "linear":
        return mu
    return math.exp(mu)


def scheduler_sigmas(config: dict, num_steps: int, image_seq_len: int, *, linear_sigmas: bool) -> Tensor:
    """The exact σ grid diffusers' `FlowMatchEulerDiscreteScheduler` gives the family's pipeline.

    Args:
        config: the scheduler config (`scheduler/scheduler_config.json`).
        num_steps: denoising steps N ≥ 1.
        image_seq_len: image tokens (for dynamic shifting).
        linear_sigmas: pass σ = linspace(1, 1/N, N) explicitly (Qwen-Image's pipeline) instead of
            the scheduler's default grid (SD3's pipeline).
    Returns:
        `[N + 1]` float32, decreasing from σ_0 (≤ 1) to 0.
    Raises:
        ValueError: num_steps < 1.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(config)
    kwargs = {}
    if scheduler.config.use_dynamic_shifting:
        kwargs["mu"] = dynamic_shift_mu(image_seq_len, dict(scheduler.config))
    if linear_sigmas:
        sigmas = [1.0 - k / num_steps for k in range(num_steps)]
        scheduler.set_timesteps(sigmas=sigmas, **kwargs)
    else:
        scheduler.set_timesteps(num_steps, **kwargs)
    return scheduler.sigmas.detach().to("cpu", torch.float32).clone()


def check_latents(x: Tensor, sigma: Tensor, channels: int) -> None:
    """Check `x` `[B, C, H, W]` float32 with C = `channels` and `sigma` `[B]`.

    Raises:
        ValueError: wrong rank, channel count, dtype or σ length.
    """
    if x.ndim != 4 or x.shape[1] != channels:
        raise ValueError(f"x must be latents [B, {channels}, H, W]; got shape {tuple(x.shape)}")
    check_float32_and_sigma(x, sigma)


def check_float32_and_sigma(x: Tensor, sigma: Tensor) -> None:
    """What every adapter's `velocity` checks of its inputs whatever the latents' layout: `x` float32 (latents stay
    fp32 at the adapter boundary) and `sigma` `[B]` with B = `x.shape[0]`.

    Raises:
        ValueError: another dtype, or a σ of another rank or length.
    """
    if x.dtype != torch.float32:
        raise ValueError(f"x must be float32 (latents stay fp32 at the adapter boundary); got {x.dtype}")
    if sigma.ndim != 1 or sigma.shape[0] != x.shape[0]:
        raise ValueError(f"sigma must be [B] = [{x.shape[0]}]; got shape {tuple(sigma.shape)}")


def guided(v_cond: Tensor, v_uncond: Tensor, scale: float, detach_uncond: bool) -> Tensor:
    """Classifier-free guidance v = v_u + w·(v_c − v_u) (Ho & Salimans, arXiv 2207.12598, eq. 6).

    `detach_uncond` stops the gradient through the unconditional branch (Flow-GRPO trains the
    guided velocity with the unconditional prediction detached); values are unchanged.
    """
    if detach_uncond:
        v_uncond = v_uncond.detach()
    return v_uncond + scale * (v_cond - v_uncond)


def to_uint8_images(pixels: Tensor) -> Tensor:
    """VAE output `[B, 3, H, W]` in [−1, 1] → `[B, H, W, 3]` uint8, as diffusers' image processor.

    x ↦ round(clamp(x/2 + 0.5, 0, 1)·255) (`VaeImageProcessor.postprocess` then `numpy_to_pil`).
    """
    images = (pixels.float() / 2 + 0.5).clamp(0, 1)
    return (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def decode_scaled(vae, x0: Tensor) -> Tensor:
    """Clean latents `[B, C, H, W]` → images `[B, f·H, f·W, 3]` uint8 through an `AutoencoderKL`:
    VAE(z / scaling_factor + shift_factor), decoded in the VAE's dtype (SD3 and FLUX)."""
    config = vae.config
    z = x0.float() / config.scaling_factor + (config.shift_factor or 0.0)
    pixels = vae.decode(z.to(next(vae.parameters()).dtype), return_dict=False)[0]
    return to_uint8_images(pixels)


class PromptCache:
    """An LRU cache of per-prompt conditioning rows keyed by the prompt's token-id tuple.

    Values are dicts of tensors with leading dimension 1 on one device. `size` 0 disables it.
    """

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"cache_size must be >= 0, got {size}")
        self.size = size
        self._rows: OrderedDict[tuple, dict[str, Tensor]] = OrderedDict()

    def get_or_compute(self, key: tuple, compute: Callable[[], dict[str, Tensor]]) -> dict[str, Tensor]:
        """The cached row for `key`, or `compute()` stored (evicting the least recently used)."""
        if key in self._rows:
            self._rows.move_to_end(key)
            return self._rows[key]
        row = compute()
        if self.size:
            self._rows[key] = row
            while len(self._rows) > self.size:
                self._rows.popitem(last=False)
        return row

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        """Drop every row (e.g. after the text encoders changed)."""
        self._rows.clear()


def load_component(cls, root: Path, subfolder: str, *, dtype: torch.dtype | None = None,
                   device: torch.device | str | None = None):
    """`cls.from_pretrained(root, subfolder=...)` from local files only, with a clear error.

    Args:
        cls: a diffusers model, transformers model or tokenizer class.
        dtype: weight dtype (`torch_dtype`); None for tokenizers.
        device: moved there when given; the module is put in eval mode.
    Raises:
        OSError: the subfolder cannot be loaded; the message names the path and the class.
    """
    from safetensors import SafetensorError

    kwargs: dict = {"local_files_only": True}
    if dtype is not None:  # a module: safetensors weights only (the files `missing_weights` checks), never pickle
        kwargs.update(torch_dtype=dtype, use_safetensors=True)
    folder = root / subfolder
    try:
        obj = cls.from_pretrained(str(folder), **kwargs)
    except (OSError, ValueError, SafetensorError) as err:
        damaged = _safetensors_cause(err)
        if damaged is not None:  # a truncated or corrupt file: name it, not the library's fallback attempts
            files = sorted(folder.glob("*.safetensors"))
            which = str(files[0]) if len(files) == 1 else f"a .safetensors file in {folder}"
            raise OSError(f"{which} is unreadable (truncated or not a safetensors file: {damaged}); copy the "
                          "model directory again from its source") from err
        raise OSError(f"cannot load {cls.__name__} from {folder} (local files only): {err}") from err
    if isinstance(obj, torch.nn.Module):
        if device is not None:
            obj = obj.to(device)
        obj.eval()
    return obj


def _safetensors_cause(err: BaseException) -> BaseException | None:
    """The SafetensorError `err` is or was raised from (diffusers wraps it in an OSError), or None."""
    from safetensors import SafetensorError

    from omnirl.system.causes import cause_of

    return cause_of(err, SafetensorError)

"""`DiffusersAdapterBase`: what the SD3 and Qwen-Image adapters share.

A subclass supplies the family's text encoding (`_encode_one`), its transformer call
(`velocity`), its VAE decode and its `load`. The base owns resolution → latent shape, the σ grid
and shift rules, the guidance settings and the per-prompt conditioning cache.

Resolution: the constructor's `resolution=(height, width)` (pixels) is the default for every
prompt; `latent_shape(ids, resolution=...)` takes a per-request override, so one adapter serves
several resolutions (requests of different latent shapes are simply not batched together).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import torch
from torch import Tensor, nn

from omnirl.algorithms.sigmas import sigma_schedule
from omnirl.models.diffusers._common import (
    DIFFUSERS_WEIGHTS,
    TRANSFORMERS_WEIGHTS,
    PromptCache,
    check_pipeline_dir,
    check_resolution,
    load_component,
    missing_weights,
    require_diffusers,
    scheduler_sigmas,
    shift_from_config,
)
from omnirl.models.protocol import Conditioning

NEGATIVE_PREFIX = "negative_"


class DiffusersAdapterBase:
    """Shared state and logic of the diffusers adapters (time convention "sigma": no conversion).

    Args:
        transformer: the denoiser (`module`, trainable); its dtype is the compute dtype.
        vae: the family's VAE (frozen, used by `decode`).
        scheduler_config: the pipeline's `scheduler/scheduler_config.json` as a dict.
        resolution: default image size `(height, width)` in pixels.
        guidance_scale: classifier-free guidance weight w; > 1 makes `encode` add the negative
            prompt's embeddings and `velocity` return the guided velocity (rollout and training
            alike). 1 = no CFG.
        cache_size: prompts kept in the conditioning cache (0 disables it).
    Raises:
        ValueError: a resolution that is not a multiple of `vae_scale_factor·patch_size`,
            guidance_scale < 1.
    """

    time_convention = "sigma"
    latent_channels: int
    vae_scale_factor: int
    patch_size: int
    linear_sigmas: bool = False

    def __init__(self, transformer: nn.Module, vae: nn.Module, scheduler_config: dict, *,
                 resolution: Sequence[int], guidance_scale: float, cache_size: int) -> None:
        self.module = transformer
        self.vae = vae
        self.scheduler_config = dict(scheduler_config)
        self.resolution = check_resolution(resolution, self.vae_scale_factor * self.patch_size)
        if not guidance_scale >= 1.0:
            raise ValueError(f"guidance_scale must be >= 1 (1 = no classifier-free guidance), got {guidance_scale}")
        self.guidance_scale = float(guidance_scale)
        self.cache = PromptCache(cache_size)

    # ----------------------------------------------------------------- shapes and σ
    def latent_shape(self, prompt_ids: list[int], resolution: Sequence[int] | None = None) -> tuple[int, int, int]:
        """`(C, H/f, W/f)` for the default or the given `(height, width)` (f = VAE scale factor).

        The prompt does not change the shape; `resolution` is the per-request override.
        Raises:
            ValueError: a resolution not divisible by f·patch_size.
        """
        h, w = self.resolution if resolution is None else check_resolution(
            resolution, self.vae_scale_factor * self.patch_size)
        return (self.latent_channels, h // self.vae_scale_factor, w // self.vae_scale_factor)

    def image_seq_len(self, latent_shape: Sequence[int]) -> int:
        """Image tokens the transformer sees for a latent `(C, H, W)`: (H/p)·(W/p)."""
        _, h, w = latent_shape
        return (h // self.patch_size) * (w // self.patch_size)

    def sigma_shift(self, num_steps: int, image_seq_len: int) -> float:
        """The shift s for `omnirl.algorithms.sigma_schedule(num_steps, s)`.

        SD3 form σ' = s·σ/(1 + (s − 1)·σ) (arXiv 2403.03206 §5.3.2): a fixed `shift` from the
        scheduler config, or e^mu for dynamic shifting (mu linear in `image_seq_len`, see
        `_common.dynamic_shift_mu`). `num_steps` does not change the shift (validated only).
        Raises:
            ValueError: num_steps < 1 or image_seq_len < 1.
        """
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")
        return shift_from_config(self.scheduler_config, image_seq_len)

    def sigmas(self, num_steps: int, image_seq_len: int) -> Tensor:
        """The exact σ grid `[num_steps + 1]` float32 the family's diffusers pipeline samples with.

        Differs from `sigma_schedule(N, sigma_shift(...))` only where diffusers adds a twist: SD3's
        default grid ends at the shifted σ_min instead of 1/N before the final 0; Qwen-Image
        stretches to `shift_terminal`. Store these σ values, never integer timesteps.
        """
        return scheduler_sigmas(self.scheduler_config, num_steps, image_seq_len, linear_sigmas=self.linear_sigmas)

    def sigma_grid(self, num_steps: int, latent_shape: Sequence[int], shift: float | None = None) -> Tensor:
        """The grid samples of `latent_shape` run on: the family's own, `sigmas(num_steps, image_seq_len)`
        (the scheduler config's shift, dynamic in the image token count), when `shift` is None; the
        manifest's override `sigma_schedule(num_steps, shift)` otherwise. `[num_steps + 1]` float32.
        Raises:
            ValueError: num_steps < 1, shift ≤ 0.
        """
        if shift is not None:
            return sigma_schedule(num_steps, shift)
        return self.sigmas(num_steps, self.image_seq_len(latent_shape))

    # ----------------------------------------------------------------- conditioning
    @property
    def cfg_enabled(self) -> bool:
        """True when `encode` adds negative embeddings and `velocity` guides (w > 1)."""
        return self.guidance_scale > 1.0

    def encode(self, prompt_ids: list[list[int]], device: torch.device | str = "cpu") -> Conditioning:
        """Token ids of B prompts → conditioning with leading dimension B (see the subclass's keys).

        Each prompt is encoded alone (batch of one), so its embeddings are a function of its ids
        only — the same in rollout and actor whatever else shares the batch — and cached by the
        ids tuple. With CFG (w > 1) the negative prompt's rows are added under `negative_*` keys.
        Text encoders run under `torch.no_grad()` (they are frozen).
        Raises:
            ValueError: an empty batch or malformed ids (see the subclass's `tokenize`).
        """
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; encode needs at least one prompt")
        rows = [self._cached_row(tuple(int(i) for i in ids), device) for ids in prompt_ids]
        cond = {key: torch.cat([row[key] for row in rows]) for key in rows[0]}
        if self.cfg_enabled:
            neg = self._cached_row(("negative",) + tuple(self.negative_ids), device)
            for key, value in neg.items():
                cond[NEGATIVE_PREFIX + key] = value.expand(len(rows), *value.shape[1:]).contiguous()
        return cond

    def _cached_row(self, key: tuple, device: torch.device | str) -> dict[str, Tensor]:
        ids = [i for i in key if not isinstance(i, str)]
        device = torch.device(device)

        def compute() -> dict[str, Tensor]:
            with torch.no_grad():
                return {k: v.detach().to(device) for k, v in self._encode_one(ids, device).items()}

        row = self.cache.get_or_compute((str(device),) + key, compute)
        return row

    def has_negative(self, cond: Conditioning) -> bool:
        """True when `cond` carries negative embeddings and w > 1, i.e. `velocity` applies CFG."""
        return self.cfg_enabled and any(key.startswith(NEGATIVE_PREFIX) for key in cond)

    # ----------------------------------------------------------------- text
    def tokenize(self, text: str) -> list[int]:
        """Prompt → the family's flat id list (`tokenize_with`, layout in the family's module docstring)."""
        return self.tokenize_with(self.tokenizers, self.max_sequence_length, text)

    @classmethod
    def _load_parts(cls, path: str | Path, transformer_cls, vae_cls, dtype: torch.dtype,
                    device: torch.device | str) -> tuple[Path, nn.Module, nn.Module, dict, list]:
        """What every family's `load` reads: (checked root, transformer, VAE, scheduler config, tokenizers).

        Raises:
            FileNotFoundError: the path or a subfolder is missing (message gives the layout).
            OSError: a component cannot be read.
        """
        require_diffusers()
        from diffusers import FlowMatchEulerDiscreteScheduler

        root = cls.check_weights(path)
        transformer = load_component(transformer_cls, root, "transformer", dtype=dtype, device=device)
        vae = load_component(vae_cls, root, "vae", dtype=dtype, device=device)
        config = dict(FlowMatchEulerDiscreteScheduler.load_config(str(root / "scheduler"), local_files_only=True))
        return root, transformer, vae, config, cls.read_tokenizers(root)

    @classmethod
    def weight_files(cls, root: Path) -> list[tuple[str, str]]:
        """(subfolder, weights file name) of every module `load` reads from the pipeline directory
        `root`: transformer/ and vae/ (diffusers), the family's text_encoder*/ (transformers)."""
        encoders = [name for name in cls.subfolders if name.startswith("text_encoder")]
        return ([("transformer", DIFFUSERS_WEIGHTS), ("vae", DIFFUSERS_WEIGHTS)]
                + [(name, TRANSFORMERS_WEIGHTS) for name in encoders + cls.optional_text_encoders(root)])

    @staticmethod
    def optional_text_encoders(root: Path) -> list[str]:
        """Text encoder subfolders `load` reads only when `root` has them (SD3's T5); none by default."""
        return []

    @classmethod
    def check_weights(cls, path: str | Path) -> Path:
        """The pipeline directory `path`, checked to hold the layout and every weights file `load`
        reads (`weight_files`, single or sharded safetensors); only existence is checked. Returns it.

        Raises:
            FileNotFoundError: the directory, a subfolder or a weights file is missing (the message
                names the file). ValueError: a sharded index that is not JSON.
        """
        root = check_pipeline_dir(path, cls.family, cls.subfolders)
        for subfolder, name in cls.weight_files(root):
            missing = missing_weights(root / subfolder, name)
            if missing is not None:
                raise FileNotFoundError(f"{missing} not found; family {cls.family!r} loads {subfolder}/ from it "
                                        f"(safetensors, as `save_pretrained` writes it: {name} or a sharded "
                                        f"{name}.index.json with its shards)")
        return root

    @classmethod
    def load_tokenizer(cls, path: str | Path, max_sequence_length: int | None = None) -> Callable[[str], list[int]]:
        """`tokenize` of the family's diffusers directory `path` from its tokenizers alone: no text
        encoder, no transformer, no VAE (what the controller needs). `max_sequence_length` defaults
        to the constructor's. Raises FileNotFoundError for a wrong layout (the message gives it)."""
        require_diffusers()
        tokenizers = cls.read_tokenizers(check_pipeline_dir(path, cls.family, cls.subfolders))
        n = cls.MAX_SEQUENCE_LENGTH if max_sequence_length is None else max_sequence_length
        return partial(cls.tokenize_with, tokenizers, n)

    # ----------------------------------------------------------------- the family's registry hooks
    merges_lora = False  # a LoRA run exports the adapters alone, in diffusers' format (`pipeline`)

    @classmethod
    def lora_skeleton(cls, path: str | Path) -> nn.Module:
        """The transformer built from `path/transformer/config.json` alone; called under `torch.device("meta")`
        (`registry.check_lora_targets`: layer names and types, no weights read)."""
        transformer_cls = cls.transformer_class()
        config = transformer_cls.load_config(str(Path(path) / "transformer"), local_files_only=True)
        return transformer_cls.from_config(config)

    @classmethod
    def adapter_options(cls, spec) -> dict:
        """`load` options of an RLJob (rollout, actor and eval alike): its CFG weight
        `algorithm.sampling.guidanceScale`, and `model.resolution` (with `model.resolutions` each request
        carries its own size)."""
        options: dict = {"guidance_scale": spec.algorithm.sampling.guidanceScale}
        default = spec.model.resolution_for(0)
        if default is not None:
            options["resolution"] = default
        return options

    @classmethod
    def describe_default_grid(cls, spec) -> str:
        """The family's own σ grid depends on each sample's resolution: the line names the scheduler config
        (and its shift, when that file is readable here)."""
        n, config = spec.algorithm.sampling.numSteps, Path(spec.model.path) / "scheduler" / "scheduler_config.json"
        try:
            cfg = json.loads(config.read_text())
        except (OSError, ValueError):
            return f"σ grid: family default ({cls.family}: its scheduler's grid, {n} steps; {config} not readable here)"
        kind = "dynamic, by image size" if cfg.get("use_dynamic_shifting") else f"shift {cfg.get('shift', 1.0)}"
        return f"σ grid: family default ({cls.family}: its scheduler's grid, {kind}, {n} steps, from {config})"

    @classmethod
    def export_weights(cls, job, policy: Path, lora: bool, out: Path, state: dict) -> list[str]:
        """LoRA: `pytorch_lora_weights.safetensors` through `<pipeline>.save_lora_weights`; full weights: the
        transformer's `save_pretrained` layout (`omnirl.models.export`)."""
        from omnirl.models.export import diffusers_full, diffusers_lora

        return diffusers_lora(cls.pipeline, job, policy, out) if lora else diffusers_full(job, policy, out)

    # ----------------------------------------------------------------- subclass hooks
    family: str  # set by `register_family`
    pipeline: str  # the diffusers pipeline class name (`save_lora_weights`, `load_lora_weights`)
    default_lora_targets: tuple[str, ...]
    subfolders: list[str]
    MAX_SEQUENCE_LENGTH: int
    tokenizers: list
    max_sequence_length: int
    negative_ids: list[int]

    @staticmethod
    def read_tokenizers(root: Path) -> list:
        """The family's tokenizers from a checked pipeline directory."""
        raise NotImplementedError

    @staticmethod
    def tokenize_with(tokenizers: list, max_sequence_length: int, text: str) -> list[int]:
        """The family's tokenization with `tokenizers` (as `read_tokenizers` returns them)."""
        raise NotImplementedError

    def _encode_one(self, ids: list[int], device: torch.device) -> dict[str, Tensor]:
        raise NotImplementedError

    def compute_dtype(self) -> torch.dtype:
        """The transformer's parameter dtype (latents are cast to it inside `velocity`)."""
        return next(self.module.parameters()).dtype

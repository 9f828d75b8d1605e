"""`AVDigitsAdapter`: the built-in audio+video digits model (family `av-digits`) as a multi-modal
`ModelAdapter`, plus its checkpoint format.

Its latent is flat, `[D]` = video `[8, 16, 32]` then audio `[16, 16]` (`latent_layout`,
`models/layout.py`); `decode_media` turns it into 8 frames and 1 s of audio (`avdigits/media.py`).

Checkpoint directory = ``config.json`` (``{"format": "omnirl-avdigits-v1", "model": AVDigitsConfig,
"provenance": {...}}``) + ``model.safetensors`` (fp32 state dict). No pickle.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from omnirl.algorithms.sigmas import sigma_schedule
from omnirl.api.prompts import target_text
from omnirl.models.avdigits.media import (
    AUDIO_SECONDS,
    AUDIO_SHAPE,
    FPS,
    FRAME_HEIGHT,
    FRAME_WIDTH,
    FRAMES,
    MAX_DIGITS,
    MIN_DIGITS,
    SAMPLE_RATE,
    VIDEO_SHAPE,
    decode_media,
)
from omnirl.models.avdigits.model import LORA_TARGET_MODULES, TEXT_ROWS, AVDigitsConfig, AVDigitsDiT
from omnirl.models.avdigits.prompts import parse_beeps
from omnirl.models.builtin import CONFIG_FILE, WEIGHTS_FILE, export_weights, load_weights
from omnirl.models.families import register_family
from omnirl.models.layout import LatentLayout, ModalitySlot, guided
from omnirl.models.protocol import Conditioning
from omnirl.system.disk import readable_as_umask_allows

FAMILY = "av-digits"
CHECKPOINT_FORMAT = "omnirl-avdigits-v1"
BUILTIN_DIR = Path(__file__).parent / "weights"
FAMILY_SHIFT = 1.0
"""The model's own σ grid: uniform in σ (it was pretrained on it)."""
MODALITIES = ("video", "audio")
MEDIA_SIZES = {"video": {"frames": FRAMES, "height": FRAME_HEIGHT, "width": FRAME_WIDTH, "fps": FPS},
               "audio": {"seconds": AUDIO_SECONDS, "sampleRate": SAMPLE_RATE}}
"""What the model makes, the only values `spec.model.video` / `spec.model.audio` may hold: registered as the
family's `media` capability, which the torch-free spec checks a manifest against (`ModelSpec.check_media`)."""


def tokenize_prompt(text: str) -> list[int]:
    """`A sign that says "<number>" with <k> beeps` → 5 ids: the number's digits left-packed (id = digit + 1,
    pad 0 after them) and k.

    Raises:
        ValueError: the quoted number is not 2–4 digits, or the prompt does not say `with <k> beeps`, k in 1..4.
    """
    number = target_text(text)
    if not (number.isdigit() and MIN_DIGITS <= len(number) <= MAX_DIGITS):
        raise ValueError(f"prompt {text!r}: the quoted number must have {MIN_DIGITS}–{MAX_DIGITS} digits "
                         f"(e.g. \"2048\"), got {number!r}")
    ids = [int(c) + 1 for c in number] + [0] * (MAX_DIGITS - len(number))
    return ids + [parse_beeps(text)]


class AVDigitsAdapter:
    """The audio+video digits DiT behind the `ModelAdapter` protocol (time convention "sigma").

    Args:
        module: an `AVDigitsDiT`.
        modalities: per modality ("video", "audio") `{"train": bool, "weight": float, "guidance_scale": float}`,
            the manifest's `spec.model.modalities` (missing keys: trained, weight 1, no guidance).
        provenance: the checkpoint's provenance dict.
    Raises:
        ValueError: an unknown modality, or no trained one.
    """

    time_convention = "sigma"
    latent_channels = 1

    def __init__(self, module: AVDigitsDiT, modalities: dict[str, dict] | None = None,
                 provenance: dict | None = None) -> None:
        self.module = module
        self.config: AVDigitsConfig = module.config
        self.lora_target_modules = list(LORA_TARGET_MODULES)
        self.compile_block_types = ["Block"]
        self.provenance = dict(provenance or {})
        modalities = dict(modalities or {})
        unknown = sorted(set(modalities) - set(MODALITIES))
        if unknown:
            raise ValueError(f"family {FAMILY} has the modalities {', '.join(MODALITIES)}; not {', '.join(unknown)}")
        shapes = {"video": VIDEO_SHAPE, "audio": AUDIO_SHAPE}
        self.layout = LatentLayout([
            ModalitySlot(name, shapes[name], trained=bool(modalities.get(name, {}).get("train", True)),
                         weight=float(modalities.get(name, {}).get("weight", 1.0)),
                         guidance_scale=float(modalities.get(name, {}).get("guidance_scale", 1.0)))
            for name in MODALITIES])

    def tokenize(self, text: str) -> list[int]:
        """Prompt line → 5 ids (`tokenize_prompt`). Raises ValueError for a prompt the task cannot draw."""
        return tokenize_prompt(text)

    def latent_shape(self, prompt_ids: list[int]) -> tuple[int]:
        """`(D,)`, D = 8·16·32 + 16·16 = 4352, for every prompt."""
        return (self.layout.numel,)

    def latent_layout(self, prompt_ids: list[int] | None = None) -> LatentLayout:
        """The flat latent's slots: video `[8, 16, 32]`, then audio `[16, 16]` (trained, weights and guidance
        from the manifest)."""
        return self.layout

    def sigma_grid(self, num_steps: int, latent_shape: tuple[int, ...], shift: float | None = None) -> torch.Tensor:
        """`sigma_schedule(num_steps, shift)`, `FAMILY_SHIFT` when `shift` is None: `[num_steps + 1]` float32."""
        return sigma_schedule(num_steps, FAMILY_SHIFT if shift is None else shift)

    def encode(self, prompt_ids: list[list[int]], device: torch.device | str = "cpu") -> Conditioning:
        """Ids of B prompts → ``{"prompt_ids": [B, 5] int64}``.

        Raises:
            ValueError: a prompt that is not 5 ids of this task (4 digit ids 0..10, k 1..4).
        """
        for k, ids in enumerate(prompt_ids):
            ids = [int(i) for i in ids]
            if len(ids) != TEXT_ROWS or not all(0 <= i <= 10 for i in ids[:MAX_DIGITS]) or not 1 <= ids[-1] <= 4:
                raise ValueError(f"prompt_ids[{k}] = {ids}: expected {TEXT_ROWS} ids (4 digit ids 0..10, then k 1..4; "
                                 "AVDigitsAdapter.tokenize)")
        return {"prompt_ids": torch.tensor([list(map(int, ids)) for ids in prompt_ids], dtype=torch.int64,
                                           device=device)}

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """v = ε − x0 for flat latents `[B, D]` float32 at σ `[B]`; with a guided modality the conditional and
        the unconditional (all-zero prompt) velocities run in one forward and combine per modality (`guided`).
        Returns `[B, D]` float32."""
        dtype = next(self.module.parameters()).dtype
        ids = cond["prompt_ids"]
        if not self.layout.needs_guidance():
            return self.module(x.to(dtype), sigma.to(dtype), ids).float()
        both = self.module(torch.cat([x, x]).to(dtype), torch.cat([sigma, sigma]).to(dtype),
                           torch.cat([ids, torch.zeros_like(ids)])).float()
        v_cond, v_uncond = both.chunk(2)
        return guided(v_cond, v_uncond, self.layout)

    def decode_media(self, x0: torch.Tensor) -> dict[str, torch.Tensor]:
        """Flat latents `[B, D]` → batched media: `video` uint8 `[B, 8, 32, 64, 3]`, `audio` float32 `[B, 8000]`,
        `audio_sample_rate` int64 `[B]`, `fps` float32 `[B]` (`avdigits.media.decode_media`)."""
        parts = self.layout.split(x0.float())
        return decode_media(parts["video"], parts["audio"])

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Flat latents `[B, D]` → one poster image per sample, the 8 frames side by side: `[B, 32, 512, 3]` uint8."""
        video = self.decode_media(x0)["video"]  # [B, T, H, W, 3]
        return video.permute(0, 2, 1, 3, 4).reshape(video.shape[0], FRAME_HEIGHT, FRAMES * FRAME_WIDTH, 3).contiguous()


def save_avdigits_checkpoint(module: AVDigitsDiT, out_dir: str | Path, provenance: dict | None = None) -> Path:
    """Write `module`'s state dict (fp32 safetensors) and config (+ provenance) into `out_dir`; returns it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(out / WEIGHTS_FILE))
    readable_as_umask_allows(out / WEIGHTS_FILE)  # safetensors writes 0600
    meta = {"format": CHECKPOINT_FORMAT, "model": module.config.to_dict(), "provenance": provenance or {}}
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def avdigits_directory(path: str | Path) -> Path:
    """The checkpoint directory of `path` ("builtin": the shipped weights). Raises FileNotFoundError."""
    directory = BUILTIN_DIR if str(path) == "builtin" else Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"{FAMILY} checkpoint directory {directory} not found (expected {CONFIG_FILE} + "
                                f"{WEIGHTS_FILE})")
    return directory


def read_avdigits_config(directory: Path) -> dict:
    """The parsed `config.json` of an av-digits checkpoint directory.

    Raises:
        FileNotFoundError: no config.json. ValueError: not JSON, or not an av-digits config.
    """
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; an {FAMILY} checkpoint is a directory with {CONFIG_FILE} and "
                                f"{WEIGHTS_FILE}")
    try:
        meta = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT or "model" not in meta:
        raise ValueError(f"{path} is not an {FAMILY} checkpoint config (expected format {CHECKPOINT_FORMAT!r} and a "
                         "'model' key)")
    return meta


def check_avdigits_weights(path: str | Path = "builtin") -> Path:
    """The weights file `load_avdigits_adapter` reads, checked to exist (not read).

    Raises:
        FileNotFoundError / ValueError: as `read_avdigits_config`, or model.safetensors is missing.
    """
    directory = avdigits_directory(path)
    read_avdigits_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} not found; an {FAMILY} checkpoint needs {WEIGHTS_FILE} beside {CONFIG_FILE}")
    return weights


def load_avdigits_adapter(path: str | Path = "builtin", device: torch.device | str = "cpu",
                          dtype: torch.dtype = torch.float32, modalities: dict[str, dict] | None = None
                          ) -> AVDigitsAdapter:
    """Load an av-digits checkpoint directory ("builtin" = the shipped one in `models/avdigits/weights/`).

    Raises:
        FileNotFoundError: the directory or one of its files is missing.
        ValueError: config.json is not an av-digits config, model.safetensors is unreadable or does not match it,
            or `modalities` names an unknown modality or trains none.
    """
    directory = avdigits_directory(path)
    meta = read_avdigits_config(directory)
    check_avdigits_weights(directory)
    module = AVDigitsDiT(AVDigitsConfig.from_dict(meta["model"]))
    load_weights(module, directory)
    module.to(device=device, dtype=dtype).eval()
    return AVDigitsAdapter(module, modalities, provenance=meta.get("provenance"))


def load_avdigits_tokenizer(path: str | Path = "builtin"):
    """The tokenizer (`tokenize_prompt`) after checking `path` is an av-digits checkpoint (its config.json)."""
    read_avdigits_config(avdigits_directory(path))
    return tokenize_prompt


@register_family("av-digits", modalities=("video", "audio"), builtin=True, sized=False, media=MEDIA_SIZES,
                 notes={"sized": "its sizes are the model's: 8 frames of 32x64 at 8 fps and 1 s of 8 kHz audio, "
                        "spec.model.video / spec.model.audio"})
class AVDigitsFamily:
    """The built-in audio+video model as a registered family (`omnirl.models.families.Family`): the loader functions
    above, its LoRA defaults, and its export (the built-in layout, LoRA merged into the weights)."""

    default_lora_targets = tuple(LORA_TARGET_MODULES)
    merges_lora = True

    @staticmethod
    def load(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
             **options) -> AVDigitsAdapter:
        """`load_avdigits_adapter` with the option `modalities` (`adapter_options`). Raises ValueError for another."""
        unknown = sorted(set(options) - {"modalities"})
        if unknown:
            raise ValueError(f"family '{FAMILY}' takes only the option modalities; got {unknown}")
        return load_avdigits_adapter(path, device=device, dtype=dtype, **options)

    load_tokenizer = staticmethod(load_avdigits_tokenizer)
    check_weights = staticmethod(check_avdigits_weights)

    @staticmethod
    def lora_skeleton(path: str | Path) -> AVDigitsDiT:
        """The `AVDigitsDiT` of the checkpoint's config.json (under `torch.device("meta")`: no weights)."""
        return AVDigitsDiT(AVDigitsConfig.from_dict(read_avdigits_config(avdigits_directory(path))["model"]))

    @staticmethod
    def adapter_options(spec) -> dict:
        """`{"modalities": …}`: each modality's train, weight and guidance (`ModelSpec.modality_settings`).
        `spec.model.video` / `audio` were checked against `MEDIA_SIZES` by the spec (`ModelSpec.check_media`,
        reading the `media` this family registers), so they are the model's here."""
        return {"modalities": spec.model.modality_settings(spec.algorithm.sampling.guidanceScale)}

    @staticmethod
    def describe_default_grid(spec) -> str:
        """The model's own grid, `FAMILY_SHIFT`, first and last steps."""
        n = spec.algorithm.sampling.numSteps
        g = [f"{x:.4f}" for x in sigma_schedule(n, FAMILY_SHIFT).tolist()]
        return f"σ grid: family default ({FAMILY}), shift {FAMILY_SHIFT:g}, {n} steps: {g[0]}, {g[1]} … {g[-2]}, {g[-1]}"

    @staticmethod
    def export_weights(job, policy: Path, lora: bool, out: Path, state: dict) -> list[str]:
        """The built-in layout: config.json (the base's model config) + model.safetensors; LoRA merged in."""
        base = avdigits_directory(job.spec.model.path)
        return export_weights(job, policy, lora, out, state, base=base, meta=read_avdigits_config(base),
                              what=f"the {FAMILY} model in {base}")

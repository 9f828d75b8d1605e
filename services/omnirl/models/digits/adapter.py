"""`DigitsAdapter`: the built-in digits model as a `ModelAdapter`, plus its checkpoint format.

Checkpoint directory = ``config.json`` (``{"format": "omnirl-digits-v1", "model": DigitsConfig,
"provenance": {...}}``) + ``model.safetensors`` (fp32 state dict). No pickle.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from omnirl.algorithms.sigmas import sigma_schedule
from omnirl.models.builtin import CONFIG_FILE, WEIGHTS_FILE, export_weights, load_weights
from omnirl.models.digits.model import LORA_TARGET_MODULES, DigitsConfig, DigitsDiT
from omnirl.models.digits.render import SLOT_WIDTH, slots_for
from omnirl.models.families import register_family
from omnirl.models.protocol import Conditioning
from omnirl.models.tokenizer import PAD_ID, CharTokenizer, target_text
from omnirl.system.disk import readable_as_umask_allows

CHECKPOINT_FORMAT = "omnirl-digits-v1"
BUILTIN_DIR = Path(__file__).parent / "weights"
FAMILY_SHIFT = 1.0
"""The built-in model's own σ grid: `sigma_schedule(N, 1.0)`, uniform in σ (it was pretrained on it)."""


def digits_sigma_grid(num_steps: int, shift: float | None = None) -> torch.Tensor:
    """The built-in model's σ grid `[num_steps + 1]` float32: `sigma_schedule(num_steps, shift)`,
    `FAMILY_SHIFT` when `shift` is None. Raises ValueError for num_steps < 1 or shift ≤ 0."""
    return sigma_schedule(num_steps, FAMILY_SHIFT if shift is None else shift)


class DigitsAdapter:
    """The digits DiT behind the `ModelAdapter` protocol (time convention "sigma": no conversion).

    Args:
        module: a `DigitsDiT`.
    Attributes:
        tokenizer: `CharTokenizer` over the model's alphabet.
        provenance: the checkpoint's provenance dict ({} for a fresh module).
    """

    time_convention = "sigma"
    latent_channels = 1

    def __init__(self, module: DigitsDiT, provenance: dict | None = None) -> None:
        self.module = module
        self.config: DigitsConfig = module.config
        self.tokenizer = CharTokenizer(self.config.alphabet, max_length=self.config.max_text_len)
        self.lora_target_modules = list(LORA_TARGET_MODULES)
        self.compile_block_types = ["Block"]
        self.provenance = dict(provenance or {})

    def tokenize(self, text: str) -> list[int]:
        """Prompt line → character ids of its target text (the quoted part, see `target_text`).

        Raises:
            ValueError: characters outside the alphabet, empty or over-long target text.
        """
        return self.tokenizer.encode(target_text(text))

    def sigma_grid(self, num_steps: int, latent_shape: tuple[int, ...], shift: float | None = None) -> torch.Tensor:
        """`sigma_schedule(num_steps, shift)`, `FAMILY_SHIFT` when `shift` is None (every latent
        shape alike). Returns `[num_steps + 1]` float32; raises ValueError for num_steps < 1 or shift ≤ 0."""
        return digits_sigma_grid(num_steps, shift)

    def latent_shape(self, prompt_ids: list[int]) -> tuple[int, int, int]:
        """`(1, 32, 16·S)`, S = 4 for ≤ 4 characters else 8 (two widths: 64 and 128 px)."""
        n = sum(1 for i in prompt_ids if i != PAD_ID)
        return (1, self.config.height, SLOT_WIDTH * slots_for("x" * n))

    def encode(self, prompt_ids: list[list[int]], device: torch.device | str = "cpu") -> Conditioning:
        """Ids of B prompts → ``{"prompt_ids": [B, 8] int64}`` (right-padded with 0).

        The per-column character layout is derived inside the network from these ids, so
        conditionings of any two requests concatenate with `torch.cat(dim=0)`.

        Raises:
            ValueError: a prompt with no ids, more than 8 ids, a pad id inside the text, or an id
                outside the vocabulary.
        """
        rows = []
        for k, ids in enumerate(prompt_ids):
            ids = [int(i) for i in ids]
            if not ids or len(ids) > self.config.max_text_len:
                raise ValueError(f"prompt_ids[{k}] has {len(ids)} ids; expected 1..{self.config.max_text_len}")
            if any(not 0 < i < self.tokenizer.vocab_size for i in ids):
                raise ValueError(
                    f"prompt_ids[{k}] = {ids} has ids outside 1..{self.tokenizer.vocab_size - 1} (pad 0 not allowed inside)"
                )
            rows.append(ids + [PAD_ID] * (self.config.max_text_len - len(ids)))
        return {"prompt_ids": torch.tensor(rows, dtype=torch.int64, device=device)}

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """v = ε − x0 for latents `[B, 1, 32, W]` float32 at σ `[B]`; returns `[B, 1, 32, W]` float32."""
        dtype = next(self.module.parameters()).dtype
        return self.module(x.to(dtype), sigma.to(dtype), cond["prompt_ids"]).float()

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Latents `[B, 1, 32, W]` (pixels in [−1, 1], white = +1) → `[B, 32, W, 3]` uint8 RGB."""
        pixels = ((x0.float().clamp(-1.0, 1.0) + 1.0) * 127.5).round().to(torch.uint8)
        return pixels[:, 0, :, :, None].expand(-1, -1, -1, 3).contiguous()


def save_digits_checkpoint(module: DigitsDiT, config: DigitsConfig, out_dir: str | Path, provenance: dict | None = None) -> Path:
    """Write `module`'s state dict (fp32 safetensors) and `config` (+ provenance) as JSON into `out_dir`.

    Returns:
        The directory written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(out / WEIGHTS_FILE))
    readable_as_umask_allows(out / WEIGHTS_FILE)  # safetensors writes 0600
    meta = {"format": CHECKPOINT_FORMAT, "model": config.to_dict(), "provenance": provenance or {}}
    (out / CONFIG_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return out


def read_digits_config(directory: Path) -> dict:
    """The parsed `config.json` of a digits checkpoint directory.

    Raises:
        FileNotFoundError: no config.json. ValueError: not JSON, or not a digits config.
    """
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{config_path} not found; a digits checkpoint is a directory with {CONFIG_FILE} and {WEIGHTS_FILE}"
        )
    try:
        meta = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from err
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT or "model" not in meta:
        raise ValueError(f"{config_path} is not a digits checkpoint config (expected format {CHECKPOINT_FORMAT!r} and a 'model' key)")
    return meta


def _digits_directory(path: str | Path) -> Path:
    directory = BUILTIN_DIR if str(path) == "builtin" else Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"digits checkpoint directory {directory} not found (expected {CONFIG_FILE} + {WEIGHTS_FILE})")
    return directory


def load_digits_tokenizer(path: str | Path = "builtin"):
    """The digits model's `tokenize` (prompt line → character ids of its target text) from the
    checkpoint's config.json alone: no weights are read. Returns a callable `str -> list[int]`.

    Raises:
        FileNotFoundError / ValueError: as `read_digits_config`.
    """
    config = DigitsConfig.from_dict(read_digits_config(_digits_directory(path))["model"])
    tokenizer = CharTokenizer(config.alphabet, max_length=config.max_text_len)
    return lambda text: tokenizer.encode(target_text(text))


def check_digits_weights(path: str | Path = "builtin") -> Path:
    """The weights file `load_digits_adapter` reads from `path`, checked to exist (not read).

    Raises:
        FileNotFoundError: the directory, its config.json or model.safetensors is missing (the message names it).
        ValueError: config.json is not a digits config.
    """
    directory = _digits_directory(path)
    read_digits_config(directory)  # config.json present and a digits config: the tokenizer reads it first
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise FileNotFoundError(f"{weights_path} not found; a digits checkpoint needs {WEIGHTS_FILE} beside {CONFIG_FILE}")
    return weights_path


def load_digits_adapter(
    path: str | Path = "builtin", device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> DigitsAdapter:
    """Load a digits checkpoint directory ("builtin" = the shipped one in `models/digits/weights/`).

    Raises:
        FileNotFoundError: the directory, its config.json or model.safetensors is missing.
        PermissionError: config.json or model.safetensors may not be read (the system's error).
        ValueError: config.json is not a digits config, model.safetensors is unreadable (truncated,
            not safetensors), or its tensors do not match the config.
    """
    directory = _digits_directory(path)
    meta = read_digits_config(directory)
    check_digits_weights(directory)
    module = DigitsDiT(DigitsConfig.from_dict(meta["model"]))
    load_weights(module, directory)
    module.to(device=device, dtype=dtype).eval()
    return DigitsAdapter(module, provenance=meta.get("provenance"))


def count_parameters(module: nn.Module) -> int:
    """Number of parameters of `module`."""
    return sum(p.numel() for p in module.parameters())


@register_family("ocr-digits", builtin=True, sized=False, guidance=False,
                 notes={"sized": "its image width follows the text", "guidance": "the model has no unconditional branch"})
class DigitsFamily:
    """The built-in digits model as a registered family (`omnirl.models.families.Family`): the loader
    functions above, its LoRA defaults, and its export (the built-in layout, LoRA merged into the weights)."""

    default_lora_targets = tuple(LORA_TARGET_MODULES)
    merges_lora = True

    @staticmethod
    def load(path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
             **options) -> DigitsAdapter:
        """`load_digits_adapter`. Raises ValueError for any option (the family takes none)."""
        if options:
            raise ValueError(f"family 'ocr-digits' takes no options; got {sorted(options)}")
        return load_digits_adapter(path, device=device, dtype=dtype)

    load_tokenizer = staticmethod(load_digits_tokenizer)
    check_weights = staticmethod(check_digits_weights)

    @staticmethod
    def lora_skeleton(path: str | Path) -> nn.Module:
        """The `DigitsDiT` of the checkpoint's config.json (under `torch.device("meta")`: no weights)."""
        return DigitsDiT(DigitsConfig.from_dict(read_digits_config(_digits_directory(path))["model"]))

    @staticmethod
    def adapter_options(spec) -> dict:
        """None: the spec refuses a resolution or CFG for this family."""
        return {}

    @staticmethod
    def describe_default_grid(spec) -> str:
        """The built-in model's grid, `FAMILY_SHIFT`, first and last steps."""
        n = spec.algorithm.sampling.numSteps
        g = [f"{x:.4f}" for x in digits_sigma_grid(n).tolist()]
        return (f"σ grid: family default (ocr-digits), shift {FAMILY_SHIFT:g}, {n} steps: {g[0]}, {g[1]} … "
                f"{g[-2]}, {g[-1]}")

    @staticmethod
    def export_weights(job, policy: Path, lora: bool, out: Path, state: dict) -> list[str]:
        """The built-in layout: config.json (the base's model config) + model.safetensors; LoRA merged in."""
        base = BUILTIN_DIR if job.spec.model.path == "builtin" else Path(job.spec.model.path)
        return export_weights(job, policy, lora, out, state, base=base, meta=read_digits_config(base),
                              what=f"the digits model in {base}")

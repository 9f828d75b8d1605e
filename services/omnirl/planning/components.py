"""Parameter counts and bytes of a diffusers pipeline directory's components, from their config files alone: each
is built on the meta device (no memory, no weights read) with the class its config names, and its parameters
counted with the dtype each will have (`_keep_in_fp32_modules` stay float32, as `from_pretrained` keeps them).

Roles: the `transformer/` (the DiT, sharded or split by the layout), the `text_encoder*/` (split by
`encoderTensor`), and the rest (VAEs, vocoder, connectors: whole on every rank that loads the adapter).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Component:
    """One model component as a device holds it whole.

    Attributes:
        name: its subfolder (`transformer`, `text_encoder`, `vae`, ...).
        cls: the class its config names.
        params: parameter count.
        bytes: bytes of its parameters in the job's dtype (fp32-kept modules at 4 bytes).
        largest_block_bytes: bytes of its largest repeated block (an FSDP2 unit gathered whole), 0 if none.
        layers: its repeated blocks (transformer layers), 0 if none.
        config: its config.
        split_bytes: of `bytes`, those encoder tensor parallelism splits (`encoder_tp.encoder_plan`'s layers; the
            embeddings, norms and a vision tower stay whole); 0 for a component that is not a text encoder.
    """

    name: str
    cls: str
    params: int
    bytes: int
    largest_block_bytes: int
    layers: int
    config: dict
    split_bytes: int = 0


def _class_of(config: dict):
    import diffusers
    import transformers

    name = config.get("_class_name")
    if name and hasattr(diffusers, name):
        return getattr(diffusers, name), "diffusers"
    if name and name.startswith("LTX2"):  # LTX-2's connectors and vocoder live with its pipeline
        from diffusers.pipelines import ltx2

        if hasattr(ltx2, name):
            return getattr(ltx2, name), "diffusers"
    for arch in config.get("architectures") or ():
        if hasattr(transformers, arch):
            return getattr(transformers, arch), "transformers"
    return None, None


def build_on_meta(config: dict) -> torch.nn.Module | None:
    """The module a config names, built on the meta device (None when no diffusers or transformers class fits)."""
    import transformers

    cls, library = _class_of(config)
    if cls is None:
        return None
    with torch.device("meta"):
        if library == "diffusers":
            return cls.from_config({k: v for k, v in config.items() if not k.startswith("_")})
        conf = transformers.AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
        return cls._from_config(conf)


def _bytes(module: torch.nn.Module, dtype_bytes: int, keep: tuple[str, ...] | None = None) -> int:
    """Parameter bytes of `module` with those of the `keep` modules (default: its `_keep_in_fp32_modules`; a
    block takes its model's) at 4."""
    keep = tuple(getattr(module, "_keep_in_fp32_modules", None) or ()) if keep is None else keep
    total = 0
    for name, p in module.named_parameters():
        total += p.numel() * (4 if any(k in name.split(".") or k in name for k in keep) else dtype_bytes)
    return total


def _blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    lists = [m for m in module.modules() if isinstance(m, torch.nn.ModuleList) and len(m) > 1]
    return max(lists, key=len) if lists else []


def read_components(root: str | Path, dtype_bytes: int) -> dict[str, Component]:
    """Every component of the pipeline directory `root` that has a `config.json` naming a known class (cached per
    directory, its configs' contents and `dtype_bytes`: `omnirl validate` and `plan` read the same ones again).

    Args:
        root: the model directory (its subfolders' config files are read; weights never).
        dtype_bytes: bytes per parameter of the job's `model.dtype` (2 for bf16, 4 for fp32).
    Raises:
        FileNotFoundError: `root` has no `transformer/config.json`.
    """
    root = Path(root)
    if not (root / "transformer" / "config.json").is_file():
        raise FileNotFoundError(f"{root / 'transformer' / 'config.json'} not found: the plan reads the model's "
                                "configs (spec.model.path, or omnirl plan --configs DIR)")
    texts = tuple((p.parent.name, p.read_text()) for p in sorted(root.glob("*/config.json")))
    return dict(_read_components(texts, dtype_bytes))


@functools.lru_cache(maxsize=8)
def _read_components(texts: tuple[tuple[str, str], ...], dtype_bytes: int) -> tuple[tuple[str, Component], ...]:
    return tuple(_components(texts, dtype_bytes).items())


def _components(texts: tuple[tuple[str, str], ...], dtype_bytes: int) -> dict[str, Component]:
    out: dict[str, Component] = {}
    for name, text in texts:
        config = json.loads(text)
        module = build_on_meta(config)
        if module is None:
            continue
        blocks = _blocks(module)
        split = 0
        if name.startswith("text_encoder"):
            from omnirl.models.parallel.encoder_tp import encoder_plan

            split = sum(_bytes(module.get_submodule(n), dtype_bytes) for n in encoder_plan(module))
        out[name] = Component(
            name=name, cls=type(module).__name__, params=sum(p.numel() for p in module.parameters()),
            bytes=_bytes(module, dtype_bytes),
            largest_block_bytes=max((_bytes(b, dtype_bytes, tuple(getattr(module, "_keep_in_fp32_modules", None)
                                                                  or ())) for b in blocks), default=0),
            layers=len(blocks),
            config=config, split_bytes=split)
    return out


def lora_params(transformer: Component, rank: int, targets: list[str]) -> int:
    """LoRA adapter parameters of `rank` on the transformer's linear layers whose names end with a target:
    r·(in + out) each (A: r×in, B: out×r)."""
    module = build_on_meta(transformer.config)
    total = 0
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
            total += rank * (m.in_features + m.out_features)
    return total

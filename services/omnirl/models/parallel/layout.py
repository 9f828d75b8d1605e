"""A job's `parallel` degrees against the model's own configs (docs/parallel.md), read from the model directory
alone (JSON, no torch, no weights): what the spec cannot know.

- Ulysses gives each rank `heads / ulysses` heads of every attention, and DiT tensor parallelism
  `heads / tensor`: every `*num_attention_heads` of `transformer/config.json` must divide by them.
- Encoder tensor parallelism splits each text encoder's heads (and key/value heads) over `encoderTensor`
  ranks, and needs an architecture with a plan (`ENCODER_MODEL_TYPES`).

`omnirl validate` prints these for a model directory on this machine; the roles raise them at start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENCODER_MODEL_TYPES: tuple[str, ...] = ("t5", "umt5", "clip_text_model", "gemma3", "gemma3_text", "qwen2",
                                        "qwen2_5_vl", "qwen2_5_vl_text", "qwen3", "qwen3_vl", "qwen3_vl_text",
                                        "llama")
"""Text-encoder `model_type`s whose layers `encoder_tp.encoder_plan` splits (T5/UMT5's SelfAttention and
DenseReluDense, CLIP's and the Llama-style decoders' self_attn and mlp)."""


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def transformer_heads(config: dict[str, Any]) -> dict[str, int]:
    """Every attention-head count of a diffusers transformer config (`num_attention_heads`,
    `audio_num_attention_heads`, ...): key → heads."""
    return {k: v for k, v in sorted(config.items()) if k.endswith("num_attention_heads") and isinstance(v, int)
            and not isinstance(v, bool)}


def encoder_heads(config: dict[str, Any]) -> tuple[str | None, dict[str, int]]:
    """(`model_type`, the counts encoder tensor parallelism splits: heads and MLP width) of a transformers
    text-encoder config; a vision-language model's text part (`text_config`) is the one read."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    model_type = config.get("model_type")
    # the MLP's width splits too (T5's d_ff, the decoders' intermediate_size): each rank takes width / degree
    heads = {k: v for k in ("num_attention_heads", "num_heads", "num_key_value_heads", "d_ff", "intermediate_size")
             if isinstance(v := text.get(k), int) and not isinstance(v, bool)}
    return model_type, heads


def check_layout(spec, root: str | Path | None = None) -> list[str]:
    """Problems of `spec.roles.{rollout,actor}.parallel` against the configs under the model directory.

    Args:
        spec: an `RLJobSpec`.
        root: the model directory (default `spec.model.path`); a missing config is not a problem here (the
            role's load reports the missing file).
    Returns:
        One line per problem: `spec.roles.ROLE.parallel.FIELD: ...` naming the config key and the valid degrees.
    """
    root = Path(root if root is not None else spec.model.path)
    problems: list[str] = []
    transformer = _read(root / "transformer" / "config.json")
    encoders = {p.parent.name: c for p in sorted(root.glob("text_encoder*/config.json"))
                if (c := _read(p)) is not None}
    for role in ("rollout", "actor"):
        layout = getattr(spec.roles, role).parallel
        for field in ("ulysses", "tensor"):
            degree = getattr(layout, field)
            if degree == 1 or transformer is None:
                continue
            for key, heads in transformer_heads(transformer).items():
                if heads % degree:
                    problems.append(f"spec.roles.{role}.parallel.{field}: {degree} does not divide the transformer's "
                                    f"{key} = {heads} (transformer/config.json): each rank takes heads / {field} "
                                    f"heads; valid: {[d for d in _divisors(heads) if d <= 64]}")
        if layout.encoderTensor == 1:
            continue
        for name, config in encoders.items():
            model_type, heads = encoder_heads(config)
            if model_type not in ENCODER_MODEL_TYPES:
                problems.append(f"spec.roles.{role}.parallel.encoderTensor: {layout.encoderTensor} needs a text encoder "
                                f"with a tensor-parallel plan; {name}/config.json is model_type {model_type!r} "
                                f"(planned: {', '.join(ENCODER_MODEL_TYPES)}): set encoderTensor: 1")
                continue
            for key, count in heads.items():
                if count % layout.encoderTensor:
                    what = "heads" if "head" in key else "MLP columns"
                    problems.append(f"spec.roles.{role}.parallel.encoderTensor: {layout.encoderTensor} does not divide "
                                    f"{name}'s {key} = {count} ({name}/config.json): each rank takes {what} / "
                                    f"encoderTensor {what}; valid: {[d for d in _divisors(count) if d <= 64]}")
    return problems

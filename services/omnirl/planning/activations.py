"""Activation memory of a diffusers transformer per token per layer, derived from its config with torch's meta
device: the model is built on `meta` (no memory) at its real width with one and with two layers, a forward over a
few hundred tokens runs on meta tensors, and every tensor autograd saves for the backward is counted
(`torch.autograd.graph.saved_tensors_hooks`, by storage). The difference between the two depths, per token, is
what one layer keeps alive until its backward: the activation memory a training step holds per token per layer
(Korthikanti et al., arXiv 2205.05198 §4, count the same tensors by hand for GPT).

Attention is counted as a fused kernel keeps it (FlashAttention, cuDNN, PyTorch's efficient kernel: the query,
key, value, output and one fp32 log-sum-exp per head and query), not as the math kernel's S×S probabilities: the
GPUs run the fused ones. `torch.nn.RMSNorm` likewise is counted as CUDA's fused kernel keeps it (its input and a
float32 reciprocal RMS per row): on CPU and meta `aten::_fused_rms_norm` has no kernel and decomposes, and autograd
then saves two float32 copies of the input instead (8 bytes per element against 2 in bf16). Counting the
decomposition overstated Wan2.1-1.3B's activations by 3 norms × 6 bytes × width per token per layer (its query and
key norms of the self-attention, the query norm of the cross-attention): 146,564 against 118,916 bytes, the 21 %
that made the plan's full fine-tune 0.785 of the H200's measured peak (docs/parallel.md, "Memory plan").
`tests/planning/test_plan.py` checks the count against the bytes a real CPU forward saves on tiny
models (the same count on real tensors).

Inputs per family (`forward_inputs`): `wan`, `ltx2`, `minimax-h3` (the video families `omnirl plan` is for); the image
families fall back to Korthikanti's 34·h bytes in 16-bit (`fallback_bytes`).

Not counted: the tensors a layer's forward holds only while it runs (the peak of an inference forward, the
rollout's; `memory.py` counts one layer's saves for it) and the allocator's fragmentation.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator

import torch
import torch.nn.functional as F


class _FusedAttention(torch.autograd.Function):
    """What a fused attention kernel saves for its backward: q, k, v, the output, an fp32 log-sum-exp per head and
    query. Forward only (the backward is never run: this counts memory)."""

    @staticmethod
    def forward(ctx, query, key, value, mask, scale, original):
        out = original(query, key, value, attn_mask=mask, scale=scale)
        lse = torch.empty(query.shape[:-1], dtype=torch.float32, device=query.device)
        ctx.save_for_backward(query, key, value, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - never called
        raise NotImplementedError


class _FusedRmsNorm(torch.autograd.Function):
    """What CUDA's fused RMSNorm saves for its backward: the input (its dtype), one float32 reciprocal RMS per row,
    the weight (a parameter, not counted). `aten::_fused_rms_norm` has a CUDA kernel and its own derivative
    (`derivatives.yaml`: `_fused_rms_norm_backward(grad, input, normalized_shape, rstd, weight)`); on CPU and meta it
    has none and decomposes (`rms_norm_composite`), so autograd there saves the float32 upcast input and the float32
    normalised product besides: 8 bytes per element where the GPU keeps 2 in 16-bit. Forward only."""

    @staticmethod
    def forward(ctx, x, shape, weight, eps, original):
        out = original(x, shape, weight, eps)
        rstd = torch.empty(x.shape[:x.dim() - len(shape)] + (1,) * len(shape), dtype=torch.float32, device=x.device)
        ctx.save_for_backward(x, rstd, weight)
        return out

    @staticmethod
    def backward(ctx, grad):  # pragma: no cover - never called
        raise NotImplementedError


def fused_rms_norm_applies(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """Whether `F.rms_norm(x, ..., weight)` runs CUDA's fused kernel (`rms_norm_symint`, ATen layer_norm.cpp): a real
    input in a non-channels-last layout whose weight is absent or of the input's dtype. Otherwise the composite runs
    on the GPU too (a float32-kept weight under a bf16 input, say) and the meta count is already what it saves."""
    if x.is_complex() or (weight is not None and weight.dtype != x.dtype):
        return False
    layout = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    return layout is None or x.is_contiguous() or not x.is_contiguous(memory_format=layout)


@contextlib.contextmanager
def _fused_rms_norm() -> Iterator[None]:
    original = F.rms_norm

    def rms_norm(input, normalized_shape, weight=None, eps=None):
        if not fused_rms_norm_applies(input, weight):
            return original(input, normalized_shape, weight, eps)
        return _FusedRmsNorm.apply(input, tuple(normalized_shape), weight, eps, original)

    F.rms_norm = rms_norm
    try:
        yield
    finally:
        F.rms_norm = original


@contextlib.contextmanager
def _fused_attention() -> Iterator[None]:
    original = F.scaled_dot_product_attention

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return _FusedAttention.apply(query, key, value, attn_mask, scale, original)

    F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original


def saved_bytes(run, module: torch.nn.Module | None = None) -> int:
    """Bytes of the distinct storages autograd saves while `run()` runs (meta tensors: numel × element size),
    leaving out `module`'s parameters and views of them (a linear layer saves its weight: weights, not
    activations)."""
    seen: dict[tuple, int] = {}
    params = {id(p) for p in module.parameters()} if module is not None else set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if id(t) in params or (t._base is not None and id(t._base) in params):
            return t
        if t.device.type == "meta":  # no storage to tell views apart: a view counts as its base, once
            base = t._base if t._base is not None else t
            seen[("meta", id(base))] = base.numel() * base.element_size()
        else:
            storage = t.untyped_storage()
            seen[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
        return t

    with _fused_attention(), _fused_rms_norm(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def forward_inputs(family: str, config: dict, device: str, dtype: torch.dtype, frames: int, audio: int,
                   side: int = 8, *, grid: tuple[int, int] | None = None, batch: int = 1, text: int = 16) -> dict:
    """Forward kwargs of `batch` samples for `family`: `frames` latent frames of video tokens, each `grid`
    (height, width) tokens (default side×side; MiniMax-H3: packed video rows beside `text` text rows), `audio`
    audio rows, `text` text tokens. Random values (what is measured is memory)."""
    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype)

    gh, gw = grid or (side, side)
    video = frames * gh * gw
    steps = torch.full((batch,), 500.0, device=device)
    if family == "wan":
        p = config.get("patch_size", (1, 2, 2))
        return {"hidden_states": randn(batch, config.get("in_channels", 16), frames * p[0], gh * p[1], gw * p[2]),
                "timestep": steps,
                "encoder_hidden_states": randn(batch, text, config.get("text_dim", 4096)), "return_dict": False}
    if family == "ltx2":
        prompts = config.get("use_prompt_embeddings", True)  # LTX-2.3 projects the text in its connectors instead
        return {"hidden_states": randn(batch, video, config.get("in_channels", 128)),
                "audio_hidden_states": randn(batch, audio, config.get("audio_in_channels", 128)),
                "encoder_hidden_states": randn(batch, text, config.get("caption_channels", 3840) if prompts
                                               else config.get("cross_attention_dim", 4096)),
                "audio_encoder_hidden_states": randn(batch, text, config.get("caption_channels", 3840) if prompts
                                                     else config.get("audio_cross_attention_dim", 2048)),
                "timestep": steps, "sigma": steps / 1000,
                "num_frames": frames, "height": gh, "width": gw, "audio_num_frames": audio, "return_dict": False}
    if family == "minimax-h3":
        n_text = text
        seq = video + n_text + audio
        tags = torch.zeros(seq, dtype=torch.long, device=device)
        tags[:n_text], tags[n_text:n_text + audio] = 1, 2
        p = config.get("patch_size", (1, 2, 2))
        return {"hidden_states": randn(batch, video, config.get("in_channels", 24) * p[0] * p[1] * p[2]),
                "audio_hidden_states": randn(batch, audio, config.get("audio_in_channels", 32)),
                "encoder_hidden_states": randn(batch, n_text, config.get("text_dim", 5120)),
                "timestep": torch.tensor([0.7, 0.0], device=device), "timestep_indices": (tags == 1).long(),
                "token_tags": tags, "position_ids": torch.zeros(seq, 3, dtype=torch.long, device=device),
                "video_indices": torch.arange(n_text + audio, seq, device=device),
                "audio_indices": torch.arange(n_text, n_text + audio, device=device),
                "text_indices": torch.arange(n_text, device=device), "return_dict": False}
    raise ValueError(f"no activation inputs for family {family!r}")


FAMILIES = ("wan", "ltx2", "minimax-h3")
"""The families whose activations are measured here (the others: `fallback_bytes`)."""


def transformer_class(family: str):
    """The diffusers transformer class of a video family."""
    import diffusers

    return {"wan": diffusers.WanTransformer3DModel, "ltx2": diffusers.LTX2VideoTransformer3DModel,
            "minimax-h3": diffusers.MiniMaxH3Transformer3DModel}[family]


def bytes_per_token_layer(family: str, config: dict, dtype: torch.dtype, *, device: str = "meta",
                          side: int = 8) -> dict[str, float]:
    """`_bytes_per_token_layer`, cached per config (a plan measures a model once however often it is asked)."""
    return dict(_cached(family, json.dumps(config, sort_keys=True), dtype, device, side))


@functools.lru_cache(maxsize=16)
def _cached(family: str, config: str, dtype: torch.dtype, device: str, side: int) -> tuple:
    return tuple(_bytes_per_token_layer(family, json.loads(config), dtype, device=device, side=side).items())


def _bytes_per_token_layer(family: str, config: dict, dtype: torch.dtype, *, device: str = "meta",
                           side: int = 8) -> dict[str, float]:
    """Activation bytes one transformer layer keeps per token until its backward (module docstring), per stream.

    Measured as differences: (2 layers − 1 layer) at two video lengths gives the bytes per video token (and, for
    LTX-2, at two audio lengths the bytes per audio token: its audio stream is narrower); the rest of a layer's
    saves (the text's keys, per-sample modulation) does not grow with the tokens and is left out.

    Args:
        family: `wan`, `ltx2` or `minimax-h3` (MiniMax-H3's rows are one packed stream: "video" holds every row's).
        config: the transformer's config (`transformer/config.json`), real width.
        dtype: the weights' dtype (activations follow it; fp32-kept modules stay fp32).
        device: `meta` (no memory: the planner) or `cpu` (real tensors: the check on tiny models).
        side: video tokens per latent frame side of the measuring forward (side² per frame).
    Returns:
        `{"video": bytes, "audio": bytes}` (audio only for ltx2).
    Raises:
        ValueError: a family without inputs here (`fallback_bytes`).
    """
    import inspect

    cls = transformer_class(family)
    keys = set(inspect.signature(cls.__init__).parameters)

    def layer_bytes(frames: int, audio: int) -> int:
        totals = []
        for layers in (1, 2):
            kwargs = {k: v for k, v in config.items() if k in keys}
            kwargs["num_layers"] = layers
            torch.manual_seed(0)
            with torch.device(device):
                model = cls(**kwargs).to(dtype)
            if family == "minimax-h3":  # its mixed checkpoint: the patch projections and heads stay float32
                for name in getattr(cls, "_keep_in_fp32_modules", None) or ():
                    for sub_name, sub in model.named_modules():
                        if sub_name.split(".")[0] == name:
                            sub.float()
            inputs = forward_inputs(family, config, device, dtype, frames, audio, side)
            totals.append(saved_bytes(lambda m=model, i=inputs: m(**i), model))
        return totals[1] - totals[0]

    base = layer_bytes(4, 32)
    out = {"video": (layer_bytes(8, 32) - base) / (4 * side * side)}
    if family == "ltx2":
        out["audio"] = (layer_bytes(4, 64) - base) / 32
    return out


def fallback_bytes(hidden: int, dtype_bytes: int) -> float:
    """Korthikanti et al.'s 34·h bytes per token per layer in 16-bit (attention without its S² term), scaled to
    the dtype: the estimate for families without meta inputs here."""
    return 34 * hidden * dtype_bytes / 2

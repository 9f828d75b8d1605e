"""One `SD3Transformer2DModel` forward over samples of different resolutions ("packing").

The step-wise engine can only batch samples of one latent shape through the model's own
`forward`; with many resolutions and few requests each, forwards fragment. Here every sample's
image tokens are concatenated into one `[N, D]` sequence (N = Σ_i h_i·w_i / p²), so every
per-token layer — the Q/K/V/out projections (LoRA included: the same submodules are called),
the MLPs, the norms, `proj_out` — runs once over all samples. Only what mixes tokens is done per
sample:

- joint attention: sample i attends over [its image tokens ‖ its text tokens] and nothing
  else. Samples of one shape are attended together by one `scaled_dot_product_attention` call
  (`[b, H, L + S, d]`, no mask: the same kernels as the unpacked forward), one call per shape;
- positional embeddings: `pos_embed` (PatchEmbed, cropped to h×w) runs per shape;
- AdaLayerNorm modulation: computed per sample from (timestep, pooled text) as diffusers does,
  then broadcast to that sample's tokens through a token → sample index.

Text tokens have one length S for every prompt (the SD3 pipeline pads), so the text stream stays
`[B, S, D]`. The arithmetic follows diffusers 0.42's `SD3Transformer2DModel.forward`,
`JointTransformerBlock.forward`, `JointAttnProcessor2_0` and the AdaLayerNorm variants; with fp32
weights a sample's output equals its own unpacked forward up to GEMM rounding (test).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from omnirl.models.attention import block_backend

SUPPORTED_PROCESSORS = ("JointAttnProcessor2_0",)


def _group_by_shape(latents: Sequence[Tensor]) -> list[list[int]]:
    """Indices of `latents` grouped by shape, groups and members in first-appearance order."""
    groups: dict[tuple, list[int]] = {}
    for i, x in enumerate(latents):
        groups.setdefault(tuple(x.shape), []).append(i)
    return list(groups.values())


def _index(values: list[int], device: torch.device) -> Tensor:
    """An int64 tensor on `device` without waiting for it (a blocking copy would sync the stream)."""
    t = torch.tensor(values, dtype=torch.long)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _check_supported(module: nn.Module) -> None:
    for i, block in enumerate(module.transformer_blocks):
        for name in ("attn", "attn2"):
            attn = getattr(block, name, None)
            if attn is None:
                continue
            kind = type(attn.processor).__name__
            if kind not in SUPPORTED_PROCESSORS:
                raise ValueError(f"packed SD3 forward: transformer_blocks[{i}].{name} uses {kind}; only "
                                 f"{SUPPORTED_PROCESSORS} is supported (reset it with `set_attn_processor`, or run "
                                 "the engine with batching='stepwise')")
        if block._chunk_size is not None:
            raise ValueError(f"packed SD3 forward: transformer_blocks[{i}] has feed-forward chunking on; turn it off "
                             "(`disable_forward_chunking`) or run the engine with batching='stepwise'")


def _heads(attn: nn.Module, x: Tensor, proj: str, norm: str | None) -> Tensor:
    """`attn.<proj>(x)` as `[..., heads, head_dim]`, then `attn.<norm>` (RMS/LayerNorm over head_dim)."""
    y = getattr(attn, proj)(x)
    y = y.view(*y.shape[:-1], attn.heads, y.shape[-1] // attn.heads)
    norm_layer = getattr(attn, norm) if norm else None
    return norm_layer(y) if norm_layer is not None else y


def _pre(block: nn.Module, x: Tensor, c: Tensor, temb: Tensor, seg: Tensor) -> tuple:
    """Per-token first half of a block: modulation, Q/K/V (image, text, SD3.5's attn2)."""
    norm1, attn = block.norm1, block.attn
    emb = norm1.linear(norm1.silu(temb))
    if block.use_dual_attention:  # SD35AdaLayerNormZeroX
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp, shift2, scale2, gate2 = emb.chunk(9, dim=1)
    else:  # AdaLayerNormZero
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
        gate2 = None
    normed = norm1.norm(x)
    h = normed * (1 + scale[seg]) + shift[seg]
    if block.context_pre_only:
        hc, c_mods = block.norm1_context(c, temb), None
    else:
        hc, *c_mods = block.norm1_context(c, emb=temb)
    qkv = (_heads(attn, h, "to_q", "norm_q"), _heads(attn, h, "to_k", "norm_k"), _heads(attn, h, "to_v", None))
    cqkv = (_heads(attn, hc, "add_q_proj", "norm_added_q"), _heads(attn, hc, "add_k_proj", "norm_added_k"),
            _heads(attn, hc, "add_v_proj", None))
    qkv2 = None
    if block.use_dual_attention:
        h2, attn2 = normed * (1 + scale2[seg]) + shift2[seg], block.attn2
        qkv2 = (_heads(attn2, h2, "to_q", "norm_q"), _heads(attn2, h2, "to_k", "norm_k"), _heads(attn2, h2, "to_v", None))
    return qkv, cqkv, qkv2, (gate, shift_mlp, scale_mlp, gate_mlp, gate2), c_mods


def _sdpa(spans: Sequence[tuple[int, int, int]], qkv: tuple, cqkv: tuple | None) -> tuple[Tensor, Tensor | None]:
    """Attention of each sample over [its image tokens ‖ its text tokens] (text: `cqkv` given).

    One `scaled_dot_product_attention` per shape group on `[b, H, L (+ S), d]`, no mask.
    Returns (image part `[N, H·d]`, text part `[B, S, H·d]` or None).
    """
    outs_x, outs_c, offset = [], [], 0
    for first, b, length in spans:
        rows = slice(offset, offset + b * length)
        parts = [t[rows].view(b, length, *t.shape[1:]) for t in qkv]
        if cqkv is not None:
            parts = [torch.cat([p, t[first:first + b]], dim=1) for p, t in zip(parts, cqkv, strict=True)]
        qs, ks, vs = (p.transpose(1, 2) for p in parts)  # [b, H, L (+ S), d]
        o = F.scaled_dot_product_attention(qs, ks, vs, dropout_p=0.0, is_causal=False)
        o = o.transpose(1, 2).flatten(2).to(qs.dtype)  # [b, L (+ S), H·d]
        outs_x.append(o[:, :length].reshape(b * length, -1))
        if cqkv is not None:
            outs_c.append(o[:, length:])
        offset += b * length
    return torch.cat(outs_x), (torch.cat(outs_c) if cqkv is not None else None)


def _post(block: nn.Module, x: Tensor, c: Tensor, seg: Tensor, attn_x: Tensor, attn_c: Tensor, attn_x2: Tensor | None,
          mods: tuple, c_mods: list | None) -> tuple[Tensor | None, Tensor]:
    """Per-token second half of a block: output projections, gated residuals, MLPs."""
    gate, shift_mlp, scale_mlp, gate_mlp, gate2 = mods
    attn = block.attn
    x = x + gate[seg] * attn.to_out[1](attn.to_out[0](attn_x))
    if attn_x2 is not None:
        x = x + gate2[seg] * block.attn2.to_out[1](block.attn2.to_out[0](attn_x2))
    h = block.norm2(x) * (1 + scale_mlp[seg]) + shift_mlp[seg]
    x = x + gate_mlp[seg] * block.ff(h)
    if block.context_pre_only:
        return None, x
    c_gate, c_shift_mlp, c_scale_mlp, c_gate_mlp = c_mods
    c = c + c_gate.unsqueeze(1) * attn.to_add_out(attn_c)
    hc = block.norm2_context(c) * (1 + c_scale_mlp[:, None]) + c_shift_mlp[:, None]
    return c + c_gate_mlp.unsqueeze(1) * block.ff_context(hc), x


class PackedBlock:
    """`JointTransformerBlock.forward` on packed image tokens, as three stages: the per-token
    halves (`_pre`, `_post`, optionally `torch.compile`d — their sizes are only N and B) around
    the per-shape attention calls (`_sdpa`, eager: a loop over a varying number of shapes would
    make a compiled graph per combination).

    Args:
        compile_options: None (eager) or `torch.compile` kwargs (e.g. `{"dynamic": True}`).
    """

    def __init__(self, compile_options: dict | None = None) -> None:
        wrap = (lambda fn: torch.compile(fn, **compile_options)) if compile_options is not None else (lambda fn: fn)
        self.pre, self.post = wrap(_pre), wrap(_post)

    def __call__(self, block: nn.Module, x: Tensor, c: Tensor, temb: Tensor, seg: Tensor,
                 spans: Sequence[tuple[int, int, int]]) -> tuple[Tensor | None, Tensor]:
        """One block.

        Args:
            block: a diffusers `JointTransformerBlock` (its submodules are called, LoRA included).
            x: packed image tokens `[N, D]`, each sample's contiguous, samples in `spans` order.
            c: text tokens `[B, S, D]` in the same sample order.
            temb: `[B, D]` time + pooled-text embedding.
            seg: `[N]` int64, the sample of each image token.
            spans: per shape group (first sample, samples b, tokens per sample L).
        Returns:
            (c `[B, S, D]`, or None after the last, `context_pre_only` block; x `[N, D]`).
        """
        qkv, cqkv, qkv2, mods, c_mods = self.pre(block, x, c, temb, seg)
        with block_backend(block):  # the kernel `spec.model.attention` chose for this block
            attn_x, attn_c = _sdpa(spans, qkv, cqkv)
            attn_x2 = _sdpa(spans, qkv2, None)[0] if qkv2 is not None else None
        return self.post(block, x, c, seg, attn_x, attn_c, attn_x2, mods, c_mods)


EAGER_BLOCK = PackedBlock()


def sd3_packed_forward(module: nn.Module, latents: Sequence[Tensor], encoder_hidden_states: Tensor,
                       pooled_projections: Tensor, timestep: Tensor, *,
                       block_fn: PackedBlock = EAGER_BLOCK) -> list[Tensor]:
    """`SD3Transformer2DModel` outputs for samples of different latent sizes, in one forward.

    Args:
        module: a diffusers `SD3Transformer2DModel` (peft LoRA layers allowed), attention
            processors `JointAttnProcessor2_0` (diffusers' default).
        latents: B tensors `[C, H_i, W_i]` in the module's dtype, H_i and W_i multiples of the
            patch size; any mix of sizes, any order.
        encoder_hidden_states: `[B, S, joint_attention_dim]` (one S for every sample).
        pooled_projections: `[B, pooled_projection_dim]`.
        timestep: `[B]` (σ·1000 for SD3).
        block_fn: how a block runs (`PackedBlock(compile_options)` for compiled stages).
    Returns:
        B tensors `[out_channels, H_i, W_i]` in the module's dtype, in the order of `latents`;
        sample i's equals `module(latents[i][None], ...)[0][0]` up to rounding.
    Raises:
        ValueError: an empty list, a latent that is not `[C, H, W]`, batch sizes that disagree,
            or an unsupported attention processor / feed-forward chunking.
    """
    if not latents:
        raise ValueError("latents is empty; the packed forward needs at least one sample")
    n = len(latents)
    for name, t in (("encoder_hidden_states", encoder_hidden_states), ("pooled_projections", pooled_projections),
                    ("timestep", timestep)):
        if t.shape[0] != n:
            raise ValueError(f"{name} has batch {t.shape[0]} but {n} latents were given")
    p = int(module.config.patch_size)
    for i, x in enumerate(latents):
        if x.ndim != 3 or x.shape[-2] % p or x.shape[-1] % p:
            raise ValueError(f"latents[{i}] must be [C, H, W] with H and W multiples of patch_size {p}; "
                             f"got {tuple(x.shape)}")
    _check_supported(module)
    groups = _group_by_shape(latents)
    order = [i for g in groups for i in g]
    device = latents[0].device
    perm = _index(order, device)
    embeds, pooled, t = (v.index_select(0, perm) for v in (encoder_hidden_states, pooled_projections, timestep))

    tokens, spans, first = [], [], 0
    for g in groups:
        h = module.pos_embed(torch.stack([latents[i] for i in g]))  # [b, L, D], positional embedding cropped to h×w
        spans.append((first, len(g), h.shape[1]))
        tokens.append(h.reshape(-1, h.shape[-1]))
        first += len(g)
    x = torch.cat(tokens)
    lengths = _index([length for _, b, length in spans for _ in range(b)], device)
    seg = torch.arange(n, device=device).repeat_interleave(lengths, output_size=x.shape[0])

    temb = module.time_text_embed(t, pooled)
    c = module.context_embedder(embeds)
    for block in module.transformer_blocks:
        c, x = block_fn(block, x, c, temb, seg, spans)

    norm = module.norm_out  # AdaLayerNormContinuous
    scale, shift = norm.linear(norm.silu(temb).to(x.dtype)).chunk(2, dim=1)
    x = module.proj_out(norm.norm(x) * (1 + scale[seg]) + shift[seg])

    out: list[Tensor | None] = [None] * n
    offset = 0
    for g, (_, b, length) in zip(groups, spans, strict=True):
        _, hh, ww = latents[g[0]].shape
        y = x[offset:offset + b * length].reshape(b, hh // p, ww // p, p, p, -1)
        y = torch.einsum("nhwpqc->nchpwq", y).reshape(b, -1, hh, ww)
        for j, i in enumerate(g):
            out[i] = y[j]
        offset += b * length
    return out

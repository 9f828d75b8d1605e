"""FLOPs of one `SD3Transformer2DModel` forward, computed from its configuration.

A multiply-add is 2 FLOPs; only matrix products count (norms, activations, RoPE-free
elementwise work are < 1% and, as in the usual MFU definition, left out). Per sample, with
N = (H/p)·(W/p) image tokens, T text tokens, D = heads·head_dim, J = joint_attention_dim,
P = pooled_projection_dim, C = in_channels, L layers (SD3, arXiv 2403.03206 §2; SD3.5's
dual-attention "MMDiT-X" blocks add a second, image-only attention):

- patch embedding 2·N·C·p²·D; context embedder 2·T·J·D; time + pooled text 2·(256·D + P·D + 2·D²)
- per block: AdaLN 2·D·kD (k = 6, 9 for dual, 6 or 2 for the context side); q, k, v, out
  2·(4N + 4T)·D² (the last block has no context output or context MLP); joint attention
  4·(N+T)²·D (QKᵀ and AV); dual attention 8·N·D² + 4·N²·D; MLPs (×4) 16·(N+T)·D²
- output AdaLN 4·D²; projection 2·N·D·p²·C_out

`tests/benchmarks/test_bench_flops.py` checks this against `torch.utils.flop_counter.FlopCounterMode` on a
small configuration; for SD3.5-Medium at 512² (N = 1024, T = 333) it gives 2.44 TFLOP, the
reference's count (`../shared/references/gpu-baseline.md`).
"""

from __future__ import annotations


def sd3_forward_flops(config: dict, latent_hw: tuple[int, int], text_tokens: int) -> float:
    """FLOPs of one forward for ONE sample of latent size `(H, W)` (in latent pixels).

    Raises:
        ValueError: H or W not a multiple of the patch size.
    """
    p = int(config["patch_size"])
    h, w = latent_hw
    if h % p or w % p:
        raise ValueError(f"latent size {h}x{w} is not a multiple of patch_size {p}")
    n, t = (h // p) * (w // p), int(text_tokens)
    d = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    c_in, c_out = int(config["in_channels"]), int(config.get("out_channels") or config["in_channels"])
    j, pooled, layers = int(config["joint_attention_dim"]), int(config["pooled_projection_dim"]), int(config["num_layers"])
    dual = set(config.get("dual_attention_layers") or ())
    total = 2.0 * n * c_in * p * p * d + 2.0 * t * j * d + 2.0 * (256 * d + pooled * d + 2 * d * d)
    for layer in range(layers):
        last = layer == layers - 1  # context_pre_only: no context output projection, no context MLP
        is_dual = layer in dual
        total += 2.0 * d * (9 if is_dual else 6) * d + 2.0 * d * (2 if last else 6) * d
        total += 2.0 * 3 * (n + t) * d * d + 2.0 * n * d * d + (0 if last else 2.0 * t * d * d)
        total += 4.0 * (n + t) ** 2 * d
        if is_dual:
            total += 8.0 * n * d * d + 4.0 * n * n * d
        total += 16.0 * n * d * d + (0 if last else 16.0 * t * d * d)
    total += 4.0 * d * d + 2.0 * n * d * p * p * c_out
    return total


def wan_forward_flops(config: dict, latent_thw: tuple[int, int, int], text_tokens: int) -> float:
    """FLOPs of one `WanTransformer3DModel` (text→video) forward for ONE sample (one CFG row) of latent size
    `(T', H', W')` (latent frames and pixels) with `text_tokens` text tokens (Wan pads to 512).

    Matrix products only, 2 per multiply-add, as `sd3_forward_flops`. With N = (T'/p_t)·(H'/p_h)·(W'/p_w)
    video tokens, D = heads·head_dim, F = ffn_dim, X = text_dim, f = freq_dim, C = in/out channels, L layers
    (diffusers' `WanTransformer3DModel`, Wan 2.1 arXiv 2503.20314 §2):

    - patch embedding (Conv3d, stride = kernel) 2·N·C·p_t·p_h·p_w·D; time embedding 2·(f·D + D²) and its
      6-way modulation projection 2·6·D²; text embedding 2·T·(X·D + D²)
    - per block: self-attention q, k, v, out 8·N·D², QKᵀ and AV 4·N²·D; cross-attention q, out 4·N·D²,
      k, v on the text 4·T·D², QKᵀ and AV 4·N·T·D; feed-forward 4·N·D·F
    - output projection 2·N·D·C·p_t·p_h·p_w

    `tests/benchmarks/test_bench_video.py` checks this against `torch.utils.flop_counter.FlopCounterMode` and a closed
    form. Wan2.1-1.3B at 33 frames × 240×416 (N = 9·15·26 = 3510, T = 512): 11.5 TFLOP per row.

    Raises:
        ValueError: a latent size off the patch grid, or text_tokens < 1.
    """
    pt, ph, pw = (int(p) for p in config["patch_size"])
    t, h, w = (int(v) for v in latent_thw)
    if t % pt or h % ph or w % pw:
        raise ValueError(f"latent size {t}x{h}x{w} is not a multiple of patch_size {(pt, ph, pw)}")
    if text_tokens < 1:
        raise ValueError(f"text_tokens must be >= 1, got {text_tokens}")
    n, tt = (t // pt) * (h // ph) * (w // pw), int(text_tokens)
    d = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    f, x, freq = int(config["ffn_dim"]), int(config["text_dim"]), int(config["freq_dim"])
    c_in, c_out = int(config["in_channels"]), int(config.get("out_channels") or config["in_channels"])
    patch = pt * ph * pw
    total = 2.0 * n * c_in * patch * d + 2.0 * (freq * d + d * d) + 2.0 * 6 * d * d + 2.0 * tt * (x * d + d * d)
    block = 8.0 * n * d * d + 4.0 * n * n * d + 4.0 * n * d * d + 4.0 * tt * d * d + 4.0 * n * tt * d + 4.0 * n * d * f
    return total + int(config["num_layers"]) * block + 2.0 * n * d * c_out * patch

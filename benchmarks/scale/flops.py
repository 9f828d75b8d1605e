"""FLOPs and sizes of the Wan2.1-T2V-1.3B transformer, from its configuration (no weights, no torch).

Same convention as `benchmarks.gpu.flops` (a multiply-add is 2 FLOPs, matrix products only). Wan's
block (Wan 2.1 technical report, arXiv 2503.20314 §3; diffusers ``WanTransformerBlock``): self-attention
q, k, v, o over the N video tokens, cross-attention (q, o over N; k, v over the T text tokens), a
feed-forward of width F; the timestep modulation is one projection shared by every block. With
D = heads × head_dim:

- per block: self q/k/v/o 8·N·D²; self attention 4·N²·D; cross q/o 4·N·D², k/v 4·T·D², attention
  4·N·T·D; feed-forward 4·N·D·F
- patch embedding 2·N·C·p_t·p_h·p_w·D; text embedding 2·T·(J·D + D²); time 2·(256·D + D² + 6·D²);
  head 2·N·D·C·p_t·p_h·p_w
"""

from __future__ import annotations

WAN_1_3B = {"dim": 1536, "ffn_dim": 8960, "num_heads": 12, "num_layers": 30, "in_channels": 16,
            "out_channels": 16, "patch_size": (1, 2, 2), "text_dim": 4096, "freq_dim": 256, "text_len": 512}
"""Wan-AI/Wan2.1-T2V-1.3B's ``config.json`` (diffusers layout)."""


def wan_tokens(config: dict, latent_thw: tuple[int, int, int]) -> int:
    """Video tokens of a latent of (T, H, W) latent frames/pixels.

    Raises:
        ValueError: a side not a multiple of the patch size.
    """
    pt, ph, pw = config["patch_size"]
    t, h, w = latent_thw
    if t % pt or h % ph or w % pw:
        raise ValueError(f"latent {latent_thw} is not a multiple of patch_size {config['patch_size']}")
    return (t // pt) * (h // ph) * (w // pw)


def wan_forward_flops(config: dict, latent_thw: tuple[int, int, int], text_tokens: int | None = None) -> float:
    """FLOPs of one forward of ONE video of latent size (T, H, W) (formulas in the module docstring)."""
    n = wan_tokens(config, latent_thw)
    t = config["text_len"] if text_tokens is None else text_tokens
    d, f, c = config["dim"], config["ffn_dim"], config["in_channels"]
    patch = config["patch_size"][0] * config["patch_size"][1] * config["patch_size"][2]
    block = 8 * n * d * d + 4 * n * n * d + 4 * n * d * d + 4 * t * d * d + 4 * n * t * d + 4 * n * d * f
    embed = 2 * n * c * patch * d + 2 * t * (config["text_dim"] * d + d * d) + 2 * (config["freq_dim"] * d + 7 * d * d)
    head = 2 * n * d * config["out_channels"] * patch
    return float(config["num_layers"] * block + embed + head)


def wan_parameters(config: dict) -> int:
    """Weights of the transformer (matrices and biases of the linear layers; norms' few are left out)."""
    d, f, c = config["dim"], config["ffn_dim"], config["in_channels"]
    patch = config["patch_size"][0] * config["patch_size"][1] * config["patch_size"][2]
    block = 8 * (d * d + d) + (d * f + f) + (f * d + d)
    embed = (c * patch * d + d) + (config["text_dim"] * d + d) + (d * d + d) + (config["freq_dim"] * d + d) \
        + (d * d + d) + (d * 6 * d + 6 * d)
    return config["num_layers"] * block + embed + d * config["out_channels"] * patch + config["out_channels"] * patch


def wan_lora_parameters(config: dict, rank: int) -> int:
    """LoRA parameters at `rank` on every attention projection (self and cross q, k, v, o) and both
    feed-forward layers of every block: rank × (in + out) per adapted linear."""
    d, f = config["dim"], config["ffn_dim"]
    return config["num_layers"] * rank * (8 * (d + d) + (d + f) + (f + d))

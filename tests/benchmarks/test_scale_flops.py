"""The simulation's Wan FLOP and size formulas equal torch's own counts (FlopCounterMode on the meta device)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

pytest.importorskip("diffusers")

from benchmarks.scale.flops import WAN_1_3B, wan_forward_flops, wan_lora_parameters, wan_parameters  # noqa: E402
from diffusers import WanTransformer3DModel  # noqa: E402

TINY = {"dim": 32, "ffn_dim": 48, "num_heads": 2, "num_layers": 2, "in_channels": 4, "out_channels": 4,
        "patch_size": (1, 2, 2), "text_dim": 24, "freq_dim": 16, "text_len": 7}


def _module(c: dict) -> WanTransformer3DModel:
    with torch.device("meta"):
        return WanTransformer3DModel(patch_size=c["patch_size"], num_attention_heads=c["num_heads"],
                                     attention_head_dim=c["dim"] // c["num_heads"], in_channels=c["in_channels"],
                                     out_channels=c["out_channels"], text_dim=c["text_dim"], freq_dim=c["freq_dim"],
                                     ffn_dim=c["ffn_dim"], num_layers=c["num_layers"], cross_attn_norm=True,
                                     qk_norm="rms_norm_across_heads")


def test_forward_flops_match_the_flop_counter() -> None:
    module, batch, thw = _module(TINY), 2, (3, 6, 8)
    x = torch.randn(batch, TINY["in_channels"], *thw, device="meta")
    text = torch.randn(batch, TINY["text_len"], TINY["text_dim"], device="meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(hidden_states=x, timestep=torch.full((batch,), 500, device="meta"), encoder_hidden_states=text)
    assert counter.get_total_flops() == batch * wan_forward_flops(TINY, thw)


def test_parameters_match_the_module() -> None:
    linear = sum(p.numel() for name, p in _module(TINY).named_parameters() if "norm" not in name
                 and "scale_shift_table" not in name)
    assert linear == wan_parameters(TINY)


def test_wan_1_3b_sizes() -> None:
    # Wan2.1-T2V-1.3B: ~1.4 B weights; a 33 × 240×416 video is 9 × 15 × 26 = 3510 tokens
    assert wan_parameters(WAN_1_3B) == pytest.approx(1.42e9, rel=0.01)
    assert wan_forward_flops(WAN_1_3B, (9, 30, 52)) == pytest.approx(11.54e12, rel=0.01)
    assert wan_lora_parameters(WAN_1_3B, 32) == 30 * 32 * (8 * 3072 + 2 * (1536 + 8960))

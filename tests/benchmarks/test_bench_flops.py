"""The benchmark's FLOP formula equals torch's own count (FlopCounterMode on the meta device)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

pytest.importorskip("diffusers")

from benchmarks.gpu.flops import sd3_forward_flops  # noqa: E402
from benchmarks.gpu.model import SD35_MEDIUM, TINY, build_transformer  # noqa: E402


@pytest.mark.parametrize(("config", "hw", "text"), [(TINY, (24, 16), 7), (SD35_MEDIUM, (64, 64), 333),
                                                    (SD35_MEDIUM, (96, 96), 333)])
def test_formula_matches_flop_counter(config, hw, text):
    module = build_transformer(config, "meta", torch.float32)
    batch = 2
    x = torch.randn(batch, 16, *hw, device="meta")
    embeds = torch.randn(batch, text, config["joint_attention_dim"], device="meta")
    pooled = torch.randn(batch, config["pooled_projection_dim"], device="meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module(hidden_states=x, encoder_hidden_states=embeds, pooled_projections=pooled,
               timestep=torch.full((batch,), 500.0, device="meta"))
    assert counter.get_total_flops() == batch * sd3_forward_flops(config, hw, text)


def test_sd35_medium_512_is_the_reference_count():
    # ../shared/references/gpu-baseline.md: 2.44 TFLOP per image per forward at 512²
    assert sd3_forward_flops(SD35_MEDIUM, (64, 64), 333) == pytest.approx(2.4426e12, rel=1e-4)


def test_rejects_a_size_off_the_patch_grid():
    with pytest.raises(ValueError, match="patch_size 2"):
        sd3_forward_flops(SD35_MEDIUM, (63, 64), 333)

"""`omnirl plan` (docs/parallel.md, "Memory plan"): the activation count derived from a config on the meta device
against the bytes a real CPU forward saves on tiny models, the components' sizes against real models, the token
rules in closed form, the per-device table of the example manifests (MiniMax-H3, LTX-2.3, their real configs shipped
in examples/models/), and `omnirl validate` refusing a job that does not fit its devices."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

from omnirl.api.loader import load_rljob
from omnirl.cli import main
from omnirl.planning.activations import bytes_per_token_layer
from omnirl.planning.components import read_components
from omnirl.planning.memory import GIB, RESERVE
from omnirl.planning.plan import plan_job
from omnirl.planning.tokens import read_configs, sample_tokens

ROOT = Path(__file__).resolve().parents[2]
LTX = ROOT / "examples" / "gpu-ltx2-flowgrpo.yaml"
H3 = ROOT / "examples" / "gpu-minimax-h3-nft.yaml"
TINY = {
    "wan": {"num_attention_heads": 4, "attention_head_dim": 16, "ffn_dim": 128, "in_channels": 4, "out_channels": 4,
            "text_dim": 32, "freq_dim": 16},
    "ltx2": {"in_channels": 8, "out_channels": 8, "num_attention_heads": 4, "attention_head_dim": 8,
             "cross_attention_dim": 32, "audio_in_channels": 4, "audio_out_channels": 4, "audio_num_attention_heads": 4,
             "audio_attention_head_dim": 4, "audio_cross_attention_dim": 16, "caption_channels": 16,
             "vae_scale_factors": (8, 32, 32), "base_height": 64, "base_width": 64},
    "minimax-h3": {"num_attention_heads": 4, "attention_head_dim": 16, "hidden_size": 24, "ffn_dim": 32,
                   "in_channels": 4, "audio_in_channels": 4, "text_dim": 16, "freq_dim": 16, "time_embed_hidden_dim": 24,
                   "time_embed_dim": 12, "rope_freq_dim": 2, "num_refiner_layers": 1},
}


@pytest.mark.parametrize(("family", "dtype"), [("wan", torch.float32), ("wan", torch.bfloat16),
                                                ("ltx2", torch.bfloat16), ("minimax-h3", torch.float32)])
def test_the_meta_count_is_the_cpu_forwards_saved_bytes_within_10_percent_above(family, dtype):
    """The plan's per-token-per-layer bytes (meta tensors, no storage: a view counts as its base) against what a real
    forward of the same tiny model saves (real storages, shared ones once): never below, at most 10 % above
    (measured: 3-8 % above, where the meta kernels' decompositions save a few more intermediates)."""
    torch.set_num_threads(1)
    meta = bytes_per_token_layer(family, TINY[family], dtype, device="meta", side=4)
    real = bytes_per_token_layer(family, TINY[family], dtype, device="cpu", side=4)
    assert meta.keys() == real.keys() and all(real[k] > 0 for k in real)
    for stream in real:
        assert real[stream] <= meta[stream] <= 1.10 * real[stream], (stream, meta, real)


def test_components_are_counted_on_meta_as_the_real_models_hold_them(tmp_path):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    WanTransformer3DModel(**TINY["wan"], num_layers=3).save_pretrained(tmp_path / "transformer")
    # as a role loads it: bf16, the modules Wan keeps in float32 (its norms, time embedder) float32
    real = WanTransformer3DModel.from_pretrained(tmp_path / "transformer", torch_dtype=torch.bfloat16)
    assert {p.dtype for p in real.parameters()} == {torch.bfloat16, torch.float32}
    parts = read_components(tmp_path, 2)
    t = parts["transformer"]
    assert t.params == sum(p.numel() for p in real.parameters())
    assert t.bytes == sum(p.numel() * p.element_size() for p in real.parameters())
    assert t.layers == 3
    assert t.largest_block_bytes == sum(p.numel() * p.element_size() for p in real.blocks[0].parameters())


def test_token_rules_in_closed_form():
    h3 = read_configs(ROOT / "examples" / "models" / "minimax-h3")
    # 124 frames = 5 + 7·17: 2 + 7·5 = 37 latent frames of (256/32)·(384/32) = 96 rows; 124/24 s · 40 audio rows
    assert sample_tokens("minimax-h3", h3, 124, 256, 384, 24.0).video == 512 + round(124 / 24 * 40) + 37 * 96
    ltx = read_configs(ROOT / "examples" / "models" / "ltx-2.3")
    # 81 frames: (81 − 1)/8 + 1 = 11 latent frames of 8·12; audio 81/24 s · 16000/160/4 per second
    tokens = sample_tokens("ltx2", ltx, 81, 256, 384, 24.0)
    assert (tokens.video, tokens.audio) == (11 * 96, round(81 / 24 * 25))
    with pytest.raises(ValueError, match="frames = 8k"):
        sample_tokens("ltx2", ltx, 80, 256, 384, 24.0)


def test_the_ltx_example_fits_and_its_table_adds_up(capsys):
    job = load_rljob(LTX)
    plan = plan_job(job, ROOT / "examples" / "models" / "ltx-2.3")
    rollout, actor = plan.roles
    assert rollout.fits and actor.fits and plan.fixes == {}
    rows = dict(rollout.rows)
    assert rows["transformer weights"] == pytest.approx(18.967e9 * 2, rel=1e-3)  # 19.0 B parameters in bf16, whole
    arows = dict(actor.rows)
    assert arows["transformer weights (1/4)"] == pytest.approx(rows["transformer weights"] / 4)  # FSDP over 2 × 2
    assert main(["plan", str(LTX), "--configs", str(ROOT / "examples" / "models" / "ltx-2.3")]) == 0
    out = capsys.readouterr().out
    assert "rollout: ulysses 2 × tensor 1, encoderTensor 2, per device of h100-80gb (79.6 GiB)" in out
    assert f"{rollout.allocated / GIB:9.2f} GiB" in out and out.count("fits") == 2


def test_a_job_that_does_not_fit_is_refused_by_validate_naming_a_layout_that_would(tmp_path, capsys):
    doc = yaml.safe_load(LTX.read_text())
    doc["spec"]["model"]["path"] = str(ROOT / "examples" / "models" / "ltx-2.3")
    doc["spec"]["data"]["trainPrompts"] = str(ROOT / "examples" / "prompts" / "ocr-train.txt")
    doc["spec"]["roles"]["rollout"]["accelerator"]["product"] = "a100-40gb"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path}: spec.roles.rollout.parallel: needs ")
    assert "the a100-40gb has 40.0 GiB (omnirl plan shows the table); fits: " in lines[0]
    fit = copy.deepcopy(doc)
    fit["spec"]["roles"]["rollout"]["accelerator"]["product"] = "a100-80gb"
    path.write_text(yaml.safe_dump(fit))
    assert main(["validate", str(path)]) == 0, capsys.readouterr().out
    assert main(["plan", str(path), "--gpu", "a100-40gb"]) == 1
    assert "would fit: " in capsys.readouterr().out


@pytest.mark.slow
def test_the_minimax_h3_example_fits_the_h200_and_not_the_h100(capsys):
    configs = str(ROOT / "examples" / "models" / "minimax-h3")
    assert main(["plan", str(H3), "--configs", configs]) == 0
    out = capsys.readouterr().out
    assert out.count("fits") == 2 and "per device of h200 (140.4 GiB)" in out
    plan = plan_job(load_rljob(H3), configs, "h100-80gb")
    assert not plan.roles[0].fits and plan.roles[0].allocated + RESERVE > 79.6 * GIB  # the replicated 33B DiT
    assert plan.fixes["rollout"][0].startswith("accelerator.product: h200")


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_rms_norm_is_counted_as_cudas_fused_kernel_keeps_it(device):
    """`torch.nn.RMSNorm` on n rows of width d: CUDA's `_fused_rms_norm` saves the input (2 bytes in bf16) and one
    float32 rstd per row, 2·n·d + 4·n; under a float32 weight (a dtype mismatch) CUDA runs the composite too, whose
    autograd saves the float32 upcast input and the float32 normalised product besides the rstd, 8·n·d + 4·n."""
    from omnirl.planning.activations import saved_bytes

    n, d = 6 * 7, 32
    for weight_dtype, expected in ((torch.bfloat16, 2 * n * d + 4 * n), (torch.float32, 8 * n * d + 4 * n)):
        norm = torch.nn.RMSNorm(d, eps=1e-6, device=device, dtype=weight_dtype)
        x = torch.randn(6, 7, d, device=device, dtype=torch.bfloat16, requires_grad=True)
        assert saved_bytes(lambda n=norm, x=x: n(x * 2), norm) == expected, weight_dtype


def test_wans_activation_count_drops_the_decomposed_rms_norms_float32_copies(monkeypatch):
    """Wan2.1-1.3B's (width h = 12·128) bytes per token per layer in bf16: counting RMSNorm's CPU decomposition
    overstated them by 3 norms over the video tokens (self-attention's q and k, cross-attention's q) × (8 − 2)
    bytes × h, exactly; the cross-attention's key norm runs over the text and does not grow with the tokens."""
    import contextlib

    from omnirl.planning import activations

    config = read_configs(ROOT / "examples" / "models" / "wan2.1-t2v-1.3b")["transformer"]
    h = config["num_attention_heads"] * config["attention_head_dim"]
    fused = activations._bytes_per_token_layer("wan", config, torch.bfloat16)
    monkeypatch.setattr(activations, "_fused_rms_norm", contextlib.nullcontext)
    decomposed = activations._bytes_per_token_layer("wan", config, torch.bfloat16)
    assert decomposed["video"] - fused["video"] == 3 * 6 * h == 27648
    assert (fused["video"], decomposed["video"]) == (118916, 146564)


def test_the_actor_holds_gradients_both_moments_and_the_activations_and_the_step_temporary_beyond_them():
    """The actor's rows in closed form (memory.py): weights P·b, reference copies, 3·trainable (gradient, AdamW's
    exp_avg and exp_avg_sq in the parameters' dtype), the activations, and the foreach step's √v temporary only
    where it exceeds the activations: its row is max(0, trainable − activations)."""
    from omnirl.api.loader import job_from_dict
    from omnirl.planning.memory import GATHER_BUCKET, SYNC_BUCKET, Model, actor_plan
    from omnirl.planning.tokens import SampleTokens

    spec = job_from_dict(_wan_full_doc()).spec
    tokens = SampleTokens(video=100, audio=0, text=0, latent_elements=0)
    for act_per_token, checkpointing in ((1000.0, False), (1.0, True)):
        spec.model.gradientCheckpointing = checkpointing
        model = Model(family="wan", transformer=8e9, encoders=1e9, encoders_split=0.0, others=2e8, largest_block=1e8,
                      layers=10, hidden={"video": 20.0}, act={"video": act_per_token}, lora=0.0, tokens=tokens)
        rows = dict(actor_plan(spec, model, 1e12, cfg=True, copies=1, old_lora=False).rows)
        mb = spec.algorithm.optimizer.microBatchSize * 2
        act = mb * 100 * (10 * 20.0 + 1.0) if checkpointing else mb * 100 * 10 * 1000.0
        assert rows["gradients + AdamW moments"] == 3 * 8e9 and rows["reference / old copies"] == 8e9
        assert rows["AdamW step's √v temporary beyond the activations"] == max(0.0, 8e9 - act)
        total = sum(rows.values())
        assert total == pytest.approx(8e9 + 8e9 + 3 * 8e9 + 1e9 + 2e8 + max(act, 8e9) + GATHER_BUCKET + SYNC_BUCKET)


def _wan_full_doc() -> dict:
    from benchmarks.gpu.plan_check import presets

    return presets()["wan-full"][0]


MEASURED = ROOT / "benchmarks" / "results" / "2026-12-07-nvidia-h200-plan-check.json"


@pytest.mark.slow
def test_the_plan_is_within_10_percent_of_the_h200s_measured_peaks():
    """The plan against `plan_check`'s measured peaks on the H200 (fixed numbers, the JSON under
    benchmarks/results/): every role of every preset within 10 % (the claim is 15 %; before RMSNorm was counted as
    CUDA's fused kernel keeps it, wan-full's actor was 0.785)."""
    import json

    from benchmarks.gpu.plan_check import presets

    from omnirl.api.loader import job_from_dict

    rows = {r["preset"]: r for r in json.loads(MEASURED.read_text())}
    table = presets()
    for name, row in rows.items():
        doc, configs = table[name]
        plan = plan_job(job_from_dict(doc), configs)
        for role in plan.roles:
            measured = row["measured_gib"][role.role] * GIB
            assert 0.90 <= measured / role.allocated <= 1.10, (name, role.role, measured / role.allocated)

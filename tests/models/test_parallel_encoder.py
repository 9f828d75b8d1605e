"""Encoder tensor parallelism (`omnirl.models.parallel.encoder_tp`): tiny random T5, UMT5, CLIP, Gemma 3 and Qwen3
text encoders split over 2 gloo ranks give the single process's embeddings (fp32), and the adapters' prompt cache
encodes a prompt once per step, not once per sample (the text encoder's calls counted through the rollout engine).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from omnirl.models.parallel.encoder_tp import encoder_mesh, encoder_plan, shard_encoder

ENCODERS = ("t5", "umt5", "clip", "gemma3", "qwen3")


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random text encoder `name` (fp32, eval), heads and MLP widths divisible by 2."""
    import transformers as tf

    torch.manual_seed(seed)
    if name in ("t5", "umt5"):
        cls, config = ((tf.T5EncoderModel, tf.T5Config) if name == "t5" else (tf.UMT5EncoderModel, tf.UMT5Config))
        model = cls(config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4,
                           feed_forward_proj="gated-gelu" if name == "umt5" else "relu"))
    elif name == "clip":
        model = tf.CLIPTextModel(tf.CLIPTextConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                                   num_hidden_layers=2, num_attention_heads=4,
                                                   max_position_embeddings=16))
    elif name == "gemma3":
        model = tf.Gemma3TextModel(tf.Gemma3TextConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                                       num_hidden_layers=2, num_attention_heads=4,
                                                       num_key_value_heads=2, head_dim=8, sliding_window=4))
    else:
        model = tf.Qwen3Model(tf.Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    return model.float().eval()


def embed(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        mesh = encoder_mesh(world, "cpu")
        ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(3))
        results = {}
        for name in ENCODERS:
            reference = embed(build(name), ids)
            model = build(name)
            split = shard_encoder(model, mesh)
            local = model.get_submodule(next(n for n, s in encoder_plan(model).items() if s == "colwise"))
            results[name] = {"diff": (embed(model, ids) - reference).abs().max().item(),
                             "scale": reference.abs().max().item(), "split": split,
                             "local_rows": local.weight.to_local().shape[0], "rows": local.weight.shape[0]}
        Path(out_dir, f"{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(300)
def test_two_ranks_give_the_single_process_embeddings(tmp_path):
    import transformers  # noqa: F401  (imported before the fork)

    mp.start_processes(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="fork")
    for rank in range(2):
        results = json.loads((tmp_path / f"{rank}.json").read_text())
        for name, r in results.items():
            assert r["diff"] <= 1e-5 * max(1.0, r["scale"]), (name, r)
            assert r["local_rows"] * 2 == r["rows"], (name, r)  # each rank holds half of a split layer
        # attention q/k/v/o and the MLP's 2 or 3 layers per block, 2 blocks (+ T5's bias table, UMT5's per block)
        assert {n: r["split"] for n, r in results.items()} == {"t5": 13, "umt5": 16, "clip": 12, "gemma3": 14,
                                                                "qwen3": 14}


def test_the_plan_splits_attention_and_mlp_and_leaves_a_vision_tower_whole():
    plan = encoder_plan(build("gemma3"))
    assert plan["layers.0.self_attn.q_proj"] == "colwise" and plan["layers.0.self_attn.o_proj"] == "rowwise"
    assert plan["layers.1.mlp.up_proj"] == "colwise" and plan["layers.1.mlp.down_proj"] == "rowwise"
    assert "embed_tokens" not in plan
    vision = torch.nn.Module()
    vision.visual = build("clip")
    assert encoder_plan(vision) == {}
    with pytest.raises(ValueError, match="no layer encoder tensor parallelism splits"):
        shard_encoder(torch.nn.Linear(2, 2), None)


def test_a_prompt_is_encoded_once_per_step_not_once_per_sample(tmp_path):
    """Through the rollout engine: 2 prompts × 4 samples each call each text encoder twice (the adapter's
    prompt cache), and a second step of the same prompts not at all."""
    from tests.models.test_diffusers import RES, _sd3_pipeline

    from omnirl.models.registry import load_adapter
    from omnirl.rollout.engine import RolloutEngine
    from omnirl.rollout.types import SampleRequest

    torch.set_num_threads(1)
    _sd3_pipeline().save_pretrained(tmp_path / "sd3")
    adapter = load_adapter("sd3", str(tmp_path / "sd3"), "cpu", "float32", resolution=RES, guidance_scale=1.0,
                           max_sequence_length=16)
    calls = [0, 0, 0]
    for i, encoder in enumerate(adapter.text_encoders):
        forward = encoder.forward

        def counted(*args, _i=i, _forward=forward, **kwargs):
            calls[_i] += 1
            return _forward(*args, **kwargs)
        encoder.forward = counted
    engine = RolloutEngine(adapter, max_batch_size=8)

    def step(n: int) -> int:
        for p, text in enumerate(["a red sign", "a blue sign"]):
            ids = tuple(adapter.tokenize(text))
            for g in range(4):
                engine.submit(SampleRequest(sample_id=f"{n}:{p}:{g}", prompt=text, prompt_ids=ids, seed=p * 10 + g,
                                            num_steps=2))
        done = []
        while engine.has_work():
            done += engine.step()
        return len(done)

    assert step(0) == 8 and calls == [2, 2, 2]  # CLIP-L, CLIP-G, T5: one call per prompt, not per sample
    assert step(1) == 8 and calls == [2, 2, 2]  # the next step's same prompts come from the cache

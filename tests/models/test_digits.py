"""Tests of the built-in digits model: tokenizer, prompt rule, renderer, network, adapter, checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from omnirl.api.prompts import target_text
from omnirl.models.digits.adapter import (
    BUILTIN_DIR,
    DigitsAdapter,
    load_digits_adapter,
    save_digits_checkpoint,
)
from omnirl.models.digits.model import DigitsConfig, DigitsDiT, column_char_ids
from omnirl.models.digits.pretrain import flow_matching_loss, pretrain, sample_batch
from omnirl.models.digits.prompts import make_prompt_sets, make_train_pool
from omnirl.models.digits.render import render_text, slots_for
from omnirl.models.protocol import ModelAdapter
from omnirl.models.tokenizer import CharTokenizer

torch.set_num_threads(1)
SMALL = DigitsConfig(d_model=32, depth=2, heads=2)


def test_tokenizer_round_trip_and_ids():
    tok = CharTokenizer()
    assert tok.encode("2048") == [3, 1, 5, 9]
    assert tok.decode([3, 1, 5, 9, 0, 0]) == "2048"
    assert tok.vocab_size == 11
    for text in ["0", "9876543", "12345678"]:
        assert tok.decode(tok.encode(text)) == text


@pytest.mark.parametrize("text, match", [("20a8", "'a'.*0123456789"), ("123456789", "at most 8"), ("", "empty")])
def test_tokenizer_errors(text, match):
    with pytest.raises(ValueError, match=match):
        CharTokenizer().encode(text)


def test_tokenizer_decode_rejects_unknown_id():
    with pytest.raises(ValueError, match="11"):
        CharTokenizer().decode([11])


@pytest.mark.parametrize(
    "line, expected",
    [
        ('A sign that says "2048"', "2048"),
        ('"12" and "34"', "12"),
        ("  2048 \n", "2048"),
        ('A sign that says " 7 "', " 7 "),
    ],
)
def test_target_text(line, expected):
    assert target_text(line) == expected


def test_target_text_unbalanced_quote():
    with pytest.raises(ValueError, match="one double quote"):
        target_text('A sign that says "2048')


def test_render_shapes_layout_and_determinism():
    assert [slots_for(t) for t in ("1", "1234", "12345", "12345678")] == [4, 4, 8, 8]
    a = render_text("2048", 4, np.random.default_rng(3))
    b = render_text("2048", 4, np.random.default_rng(3))
    assert a.shape == (32, 64) and a.dtype == np.uint8 and np.array_equal(a, b)
    wide = render_text("123", 8, np.random.default_rng(0))
    assert wide.shape == (32, 128)
    ink_cols = np.flatnonzero((wide < 128).any(axis=0))
    # centred: 3 characters in 8 slots start in slot (8 - 3)//2 = 2 and end in slot 4 (± 2 px jitter).
    assert 2 * 16 - 2 <= ink_cols.min() and ink_cols.max() < 5 * 16 + 2
    assert wide[0].min() > 200 and wide[:, :28].min() == 255  # white paper, empty left slots


def test_column_char_ids_centred_layout():
    ids = torch.tensor([[1, 2, 3, 0, 0, 0, 0, 0], [4, 5, 6, 7, 8, 0, 0, 0]])
    cols = column_char_ids(ids, num_slots=8, cols_per_slot=2)
    assert cols[0].tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 0, 0, 0, 0]
    assert cols[1].tolist() == [0, 0, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="does not fit"):
        column_char_ids(ids, num_slots=4, cols_per_slot=2)


def test_adapter_shapes_both_widths_and_cond_concat():
    adapter = DigitsAdapter(DigitsDiT(SMALL))
    assert isinstance(adapter, ModelAdapter)
    short, long_ = adapter.tokenize('A sign that says "204"'), adapter.tokenize('say "98765"')
    assert adapter.latent_shape(short) == (1, 32, 64) and adapter.latent_shape(long_) == (1, 32, 128)
    for width, ids in ((64, [short, adapter.tokenize('"7"'), short]), (128, [long_, adapter.tokenize('"12345678"'), long_])):
        # conditionings of separately encoded requests of one latent shape concatenate along the batch
        c1, c2 = adapter.encode(ids[:1]), adapter.encode(ids[1:])
        cond = {k: torch.cat([c1[k], c2[k]]) for k in c1}
        assert cond["prompt_ids"].shape == (3, 8) and cond["prompt_ids"].dtype == torch.int64
        assert torch.equal(cond["prompt_ids"], adapter.encode(ids)["prompt_ids"])
        x = torch.randn(3, 1, 32, width)
        v = adapter.velocity(x, torch.rand(3), cond)
        assert v.shape == x.shape and v.dtype == torch.float32
        images = adapter.decode(x)
        assert images.shape == (3, 32, width, 3) and images.dtype == torch.uint8
    with pytest.raises(ValueError, match="does not fit"):
        adapter.velocity(torch.randn(1, 1, 32, 64), torch.rand(1), adapter.encode([long_]))
    with pytest.raises(ValueError, match="pad 0 not allowed"):
        adapter.encode([[1, 0, 2]])


def test_decode_maps_white_and_black():
    adapter = DigitsAdapter(DigitsDiT(SMALL))
    x = torch.tensor([1.0, -1.0, 5.0, 0.0]).reshape(1, 1, 1, 4).expand(1, 1, 32, 4)
    assert adapter.decode(x)[0, 0, :, 0].tolist() == [255, 0, 255, 128]


def test_checkpoint_round_trip_bit_exact(tmp_path):
    torch.manual_seed(1)
    module = DigitsDiT(SMALL)
    for p in module.parameters():  # zero-initialised layers too
        p.data.normal_()
    save_digits_checkpoint(module, SMALL, tmp_path, {"seed": 1})
    loaded = load_digits_adapter(tmp_path)
    assert loaded.config == SMALL and loaded.provenance == {"seed": 1}
    for (name, a), (_, b) in zip(module.state_dict().items(), loaded.module.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_load_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_digits_adapter(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_digits_adapter(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="not a digits checkpoint"):
        load_digits_adapter(tmp_path)
    save_digits_checkpoint(DigitsDiT(SMALL), SMALL, tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="model.safetensors"):
        load_digits_adapter(tmp_path)


def test_a_truncated_weights_file_is_named_unreadable_not_a_config_mismatch(tmp_path):
    """A copy cut short (a full disk, an interrupted scp) says the file is unreadable; only tensors
    that load but do not fit the config say "does not match the config"."""
    import os
    import re

    save_digits_checkpoint(DigitsDiT(SMALL), SMALL, tmp_path)
    weights = tmp_path / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    with pytest.raises(ValueError) as err:
        load_digits_adapter(tmp_path)
    assert str(err.value).startswith(f"{weights} is unreadable (truncated or not a safetensors file: ")
    assert "does not match" not in str(err.value)
    save_digits_checkpoint(DigitsDiT(DigitsConfig(d_model=64, depth=2, heads=2)), SMALL, tmp_path)  # wrong widths
    with pytest.raises(ValueError, match=re.escape(f"{weights} does not match the config in {tmp_path / 'config.json'}")):
        load_digits_adapter(tmp_path)


def test_pretrain_is_deterministic_and_saves(tmp_path):
    config = DigitsConfig(d_model=32, depth=1, heads=2)
    reports = [pretrain(tmp_path / name, steps=2, batch_size=4, log_every=0, config=config) for name in "ab"]
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    # a longer run's step-N snapshot is the --steps N checkpoint (constant lr after warm-up)
    pretrain(tmp_path / "c", steps=3, batch_size=4, log_every=0, snapshot_every=2, config=config)
    assert (tmp_path / "c" / "step-2" / "model.safetensors").read_bytes() == (tmp_path / "a" / "model.safetensors").read_bytes()
    provenance = json.loads((tmp_path / "a" / "config.json").read_text())["provenance"]
    assert provenance["steps"] == 2 and provenance["seed"] == 0
    assert provenance["final_loss"] == pytest.approx(reports[0].final_loss, abs=1e-5)


def test_builtin_checkpoint_beats_random_init_on_flow_matching_loss():
    trained = load_digits_adapter("builtin")
    torch.manual_seed(0)
    fresh = DigitsDiT(trained.config)
    for layer in (fresh.out_proj, fresh.modulation_out):  # give the fresh net a non-zero output
        torch.nn.init.normal_(layer.weight, std=0.02)
    images, texts = sample_batch(np.random.default_rng(0), 16, "0123456789")
    x0 = torch.from_numpy(images).float().div(127.5).sub(1.0)[:, None]
    ids = trained.encode([trained.tokenizer.encode(t) for t in texts])["prompt_ids"]
    with torch.no_grad():
        losses = [float(flow_matching_loss(m, x0, ids, torch.Generator().manual_seed(0))) for m in (trained.module, fresh)]
    assert losses[0] < 0.6 * losses[1]
    assert (BUILTIN_DIR / "config.json").is_file()


def test_prompt_sets_deterministic_disjoint_and_shipped():
    train, heldout = make_prompt_sets(0)
    assert (train, heldout) == make_prompt_sets(0)
    assert len(train) == 64 and len(heldout) == 256
    numbers = [target_text(p) for p in train + heldout]
    assert len(set(numbers)) == 320 and all(3 <= len(n) <= 5 and n[0] != "0" for n in numbers)
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "examples" / "prompts"
    assert (root / "ocr-train.txt").read_text().splitlines() == train
    assert (root / "ocr-heldout.txt").read_text().splitlines() == heldout


def test_train_pool_is_large_deterministic_shipped_and_never_held_out():
    from pathlib import Path

    pool = make_train_pool()
    assert pool == make_train_pool() and len(pool) == len(set(pool)) == 1024
    heldout = {target_text(p) for p in make_prompt_sets(0)[1]}
    numbers = [target_text(p) for p in pool]
    assert not heldout & set(numbers)  # held-out prompts are never trained on
    assert all(3 <= len(n) <= 5 and n[0] != "0" for n in numbers)
    root = Path(__file__).resolve().parents[2] / "examples" / "prompts"
    assert (root / "ocr-train-pool.txt").read_text().splitlines() == pool
    with pytest.raises(ValueError, match="size"):
        make_train_pool(0)


@pytest.mark.parametrize("targets,message", [
    (["nope"], "['nope'] match no layer of the model, so LoRA would train nothing"),
    (["norm1"], "'norm1' names blocks.0.norm1, a LayerNorm, which LoRA cannot adapt"),
    (["attn.qkv", "blocks"], "'blocks' names blocks, a ModuleList, which LoRA cannot adapt"),
])
def test_lora_targets_that_name_no_linear_layer_are_a_config_error(targets, message):
    # each passed `omnirl validate` and crashed every role that injects LoRA with peft's traceback,
    # restarted until maxRestarts; a ConfigError stops the job at once with one line
    from tests.helpers import tiny_adapter

    from omnirl.api.errors import ConfigError
    from omnirl.api.spec import LoRASpec
    from omnirl.models.lora import prepare_rollout_module

    adapter = tiny_adapter()
    with pytest.raises(ConfigError) as info:
        prepare_rollout_module(adapter, LoRASpec(enabled=True, targetModules=targets))
    assert str(info.value) == (
        f"spec.model.lora.targetModules: {message}; list linear layers of DigitsDiT: attn.proj, attn.qkv, mlp.fc1, "
        "mlp.fc2, modulation, modulation_out, out_proj, patch_embed, sigma_mlp.0, sigma_mlp.2 (empty: the model's "
        "defaults)")
    adapter = tiny_adapter()
    prepare_rollout_module(adapter, LoRASpec(enabled=True, targetModules=["qkv", "nope"]))  # one match is enough
    assert sum(".lora_A.default." in name for name, _ in adapter.module.named_parameters()) == 2  # depth 2
    # the actor's second adapter (the old policy) goes into layers that hold one already
    from omnirl.models.lora import inject_lora

    inject_lora(adapter.module, LoRASpec(enabled=True), ["qkv"], adapter_name="old")
    assert sum(".lora_A.old." in name for name, _ in adapter.module.named_parameters()) == 2
    with pytest.raises(ConfigError) as info:
        inject_lora(adapter.module, LoRASpec(enabled=True), ["nope"], adapter_name="old2")
    assert info.value.args[0].endswith("list linear layers of DigitsDiT: attn.proj, attn.qkv, mlp.fc1, mlp.fc2, "
                                       "modulation, modulation_out, out_proj, patch_embed, sigma_mlp.0, sigma_mlp.2 "
                                       "(empty: the model's defaults)")

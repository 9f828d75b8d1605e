"""`omnirl export` of video families' checkpoints in the form their diffusers pipelines load: the LoRA file
`WanPipeline` / `LTX2Pipeline` / `MiniMaxH3ModularPipeline.load_lora_weights` take, and full weights in the
transformer's `save_pretrained` layout; each loaded back gives the trained adapter's velocity."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from tests.models.test_export import checkpoint

from omnirl.api.loader import job_from_dict
from omnirl.api.spec import LoRASpec
from omnirl.models.export import export_checkpoint
from omnirl.models.lora import inject_lora, lora_tensors
from omnirl.models.registry import load_adapter

pytest.importorskip("diffusers")

LORA = {"enabled": True, "rank": 4, "alpha": 8.0}
CLIPS = {"wan": {"frames": 9, "height": 16, "width": 16, "fps": 8.0},
         "ltx2": {"frames": 9, "height": 32, "width": 32, "fps": 25.0},
         "minimax-h3": {"frames": 124, "height": 32, "width": 32, "fps": 24.0}}


def _job(family: str, path: str, lora: dict | None = None):
    guidance = 1.0 if family == "minimax-h3" else 2.0
    return job_from_dict({"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "exp"},
                          "spec": {"model": {"family": family, "path": path, "video": CLIPS[family],
                                             "lora": lora or {"enabled": False}},
                                   "algorithm": {"sampling": {"guidanceScale": guidance}},
                                   "data": {"trainPrompts": "p.txt"},
                                   "reward": [{"name": "smooth", "kind": "temporal-consistency"}]}})


@pytest.fixture(scope="module", params=["wan", "ltx2", "minimax-h3"])
def family(request, tmp_path_factory):
    from tests.video_models import save_tiny

    torch.set_num_threads(1)
    path = save_tiny(request.param, tmp_path_factory.mktemp(request.param.replace("-", "_")))
    from omnirl.models.registry import adapter_options

    adapter = load_adapter(request.param, str(path), "cpu", "float32", **adapter_options(_job(request.param, str(path)).spec))
    return request.param, path, adapter


def _pipeline(family: str, path):
    if family == "minimax-h3":
        from diffusers.modular_pipelines import MiniMaxH3ModularPipeline

        pipe = MiniMaxH3ModularPipeline.from_pretrained(str(path))
        pipe.load_components(names=["transformer"], torch_dtype=torch.float32)
        return pipe
    import diffusers

    return getattr(diffusers, {"wan": "WanPipeline", "ltx2": "LTX2Pipeline"}[family]).from_pretrained(
        path, local_files_only=True)


def _velocity(adapter, module):
    kept, adapter.module = adapter.module, module
    try:
        cond = adapter.encode([adapter.tokenize('a sign that says "hi"')])
        x = torch.randn(1, adapter.numel, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            return adapter.velocity(x, torch.tensor([0.6]), cond)
    finally:
        adapter.module = kept


def test_lora_export_loads_in_the_familys_pipeline(family, tmp_path):
    name, path, adapter = family
    module = copy.deepcopy(adapter.module)
    inject_lora(module, LoRASpec(**LORA), adapter.lora_target_modules)
    with torch.no_grad():
        for n, p in module.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    policy = {k: v.detach().clone() for k, v in lora_tensors(module).items()}
    ckpt = checkpoint(tmp_path / "run", policy, lora=True, family=name)
    out = export_checkpoint(_job(name, str(path), LORA), ckpt, tmp_path / "export", run_dir=tmp_path / "run")
    assert json.loads((out / "export.json").read_text())["weights"] == "lora"
    pipe = _pipeline(name, path)
    pipe.load_lora_weights(str(out))
    loaded = {n.replace(".default_0.", "."): p for n, p in pipe.transformer.named_parameters() if "lora_" in n}
    assert loaded.keys() == {n.replace(".default.", "."): t for n, t in policy.items()}.keys()
    ours, theirs = _velocity(adapter, module), _velocity(adapter, pipe.transformer)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)
    assert (ours - _velocity(adapter, adapter.module)).abs().max() > 1e-4


def test_full_weights_export_is_the_transformers_save_pretrained_layout(family, tmp_path):
    name, path, adapter = family
    policy = {k: v.detach().clone() + 0.01 for k, v in adapter.module.state_dict().items()}
    ckpt = checkpoint(tmp_path / "run", policy, lora=False, family=name)
    out = export_checkpoint(_job(name, str(path)), ckpt, tmp_path / "export", run_dir=tmp_path / "run")
    loaded = type(adapter).transformer_class().from_pretrained(out / "transformer", local_files_only=True)
    state = loaded.state_dict()
    assert state.keys() == policy.keys() and all(torch.equal(state[k], policy[k]) for k in policy)

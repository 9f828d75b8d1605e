"""The extension axes: model families and reward kinds registered by their own modules, read by the spec through
the generated table `omnirl/api/extensions_generated.py` (docs/extending.md)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError

from omnirl.api import extensions
from omnirl.api.problems import problem_lines
from omnirl.api.spec import RLJob
from omnirl.extensions import TABLE, registering_modules, render_table

JOB: dict[str, Any] = {
    "apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "j"},
    "spec": {"data": {"trainPrompts": "p.txt"}, "reward": [{"name": "ocr", "kind": "ocr"}]},
}
# what the operator's image lacks (operator/Dockerfile installs pydantic, pyyaml, redis, kopf, kubernetes only)
HEAVY = ("numpy", "torch", "PIL", "onnxruntime", "openai", "grpc", "diffusers", "transformers", "safetensors")


def test_the_table_is_what_the_registering_modules_say() -> None:
    # stale: a family or kind was added, renamed or given other capabilities without `python -m omnirl.extensions
    # --write` (make crd); the spec would not know it
    assert TABLE.read_text(encoding="utf-8") == render_table(), \
        "omnirl/api/extensions_generated.py is stale: run python -m omnirl.extensions --write (make crd)"


def test_every_family_and_kind_module_registers_what_the_table_names() -> None:
    from omnirl.models.families import get_family
    from omnirl.scorers.kinds import get_kind

    modules = set(registering_modules())
    for name, info in extensions.FAMILIES.items():
        assert info.module in modules and get_family(name).info == info, name
    for name, info in extensions.REWARD_KINDS.items():
        assert info.module in modules and get_kind(name).info() == info, name
        assert extensions.params_model(name) is get_kind(name).params


def test_the_spec_and_every_kind_module_import_without_numpy_or_torch() -> None:
    # the operator validates manifests (each reward's params against its kind's class) in an image without them
    code = f"""
import sys
for name in {HEAVY!r}:
    sys.modules[name] = None  # `import numpy` now raises ImportError
from omnirl.api.extensions import FAMILIES, REWARD_KINDS, params_model
from omnirl.api.spec import RLJob
REQUIRED = {{"vlm": {{"model": "m", "template": "rate"}}, "python": {{"function": "m:f"}},
            "frames": {{"kind": "jpeg", "frameStride": 4}}, "clap": {{"path": "clap"}},
            "audio-signal": {{"measure": "clipping"}}}}  # the kinds' required params
reward = [{{"name": k.replace("-", "_"), "kind": k, **({{"url": "http://x:1/v1"}} if i.endpoint in ("http", "openai")
          else {{"url": "x:1"}} if i.endpoint == "grpc" else {{}}),
          "params": REQUIRED.get(k, {{}})}} for k, i in REWARD_KINDS.items()]
media = {{"video", "audio"}}  # kinds of video/audio are validated on the built-in audio+video family
for family, rewards in (("ocr-digits", [r for r in reward if not media & set(REWARD_KINDS[r["kind"]].modalities)]),
                        ("av-digits", [r for r in reward if media & set(REWARD_KINDS[r["kind"]].modalities)])):
    RLJob.model_validate({{"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {{"name": "j"}},
                          "spec": {{"model": {{"family": family}}, "data": {{"trainPrompts": "p.txt"}},
                                   "reward": rewards}}}})
print(sorted(REWARD_KINDS))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sorted(extensions.REWARD_KINDS))


def test_packed_families_are_the_adapters_with_a_packed_forward() -> None:
    pytest.importorskip("diffusers")
    from omnirl.models.families import get_family

    for name, info in extensions.FAMILIES.items():
        assert info.packed == hasattr(get_family(name), "velocity_packed"), name


def test_a_reward_kind_that_scores_nothing_the_family_produces_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # a video family (none is built in yet) with the image OCR reward: one line naming the reward's kind
    video = dataclasses.replace(extensions.FAMILIES["ocr-digits"], modalities=("video",))
    monkeypatch.setitem(extensions.FAMILIES, "ocr-digits", video)
    with pytest.raises(ValidationError) as info:
        RLJob.model_validate(JOB)
    assert [text for _, text in problem_lines(RLJob, info.value)] == [
        'spec.reward[0].kind: "ocr" is invalid: scores image, and model.family ocr-digits produces video: choose a '
        "reward kind that scores what the model produces"]
    monkeypatch.undo()
    assert RLJob.model_validate(JOB).spec.reward[0].kind == "ocr"


def test_capabilities_come_from_the_registrations() -> None:
    from omnirl.api import spec

    assert spec.PACKED_FAMILIES == tuple(n for n, f in extensions.FAMILIES.items() if f.packed)
    assert spec.CUDNN_FAMILIES == tuple(n for n, f in extensions.FAMILIES.items() if "cudnn" in f.attention)
    assert spec.GROUP_KINDS == tuple(n for n, k in extensions.REWARD_KINDS.items() if k.runs == "group")
    assert spec.REMOTE_KINDS == tuple(n for n, k in extensions.REWARD_KINDS.items() if k.runs == "remote")
    assert set(spec.RewardSpec.model_fields["kind"].annotation.__args__) == set(extensions.REWARD_KINDS)
    assert set(spec.ModelSpec.model_fields["family"].annotation.__args__) == set(extensions.FAMILIES)

"""The multi-modal manifest fields (docs/omni.md, "Manifest fields"): `spec.model.video`, `spec.model.audio`,
`spec.model.modalities`, and the reward kinds that score video and audio. Each bad value is one line naming the
field (`omnirl validate` exits 2); the adapter options carry each modality's train, weight and guidance."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from omnirl.api.loader import job_from_dict
from omnirl.api.problems import problem_lines
from omnirl.api.spec import RLJob
from omnirl.models.registry import adapter_options

AV_REWARDS = [{"name": "sync", "kind": "avdigits-sync"}, {"name": "pitch", "kind": "avdigits-pitch"}]


def _job(model: dict, reward: list[dict] | None = None, **algorithm):
    return job_from_dict({"apiVersion": "omnirl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "j"},
                          "spec": {"model": model, "data": {"trainPrompts": "p.txt"},
                                   "reward": reward or AV_REWARDS, **({"algorithm": algorithm} if algorithm else {})}})


@pytest.mark.parametrize("model, reward, field", [
    ({"family": "av-digits", "modalities": {"audio": {"train": True, "weight": 0.0}}}, None,
     "spec.model.modalities.audio.weight"),
    ({"family": "av-digits", "modalities": {"video": {"train": False}, "audio": {"train": False}}}, None,
     "spec.model.modalities"),
    ({"family": "ocr-digits", "video": {"frames": 8, "height": 32, "width": 64, "fps": 8}},
     [{"name": "ocr", "kind": "ocr"}], "spec.model.video"),
    ({"family": "ocr-digits", "modalities": {"audio": {"weight": 1.0}}}, [{"name": "ocr", "kind": "ocr"}],
     "spec.model.modalities.audio"),
    ({"family": "ocr-digits"}, [{"name": "sync", "kind": "avdigits-sync"}], "spec.reward[0].kind"),
    ({"family": "av-digits"}, [{"name": "ocr", "kind": "ocr"}], "spec.reward[0].kind"),
])
def test_a_bad_multi_modal_field_is_refused_naming_it(model: dict, reward: list | None, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        _job(model, reward)
    lines = [text for _, text in problem_lines(RLJob, err.value)]
    assert len(lines) == 1 and lines[0].startswith(f"{field}:"), lines


def test_adapter_options_carry_each_modalitys_train_weight_and_guidance() -> None:
    job = _job({"family": "av-digits", "modalities": {"video": {"weight": 3.0, "guidanceScale": 4.0},
                                                      "audio": {"train": False}}},
               sampling={"guidanceScale": 2.0})
    assert adapter_options(job.spec) == {"modalities": {
        "video": {"train": True, "weight": 3.0, "guidance_scale": 4.0},
        "audio": {"train": False, "weight": 1.0, "guidance_scale": 2.0}}}  # null guidanceScale: the job's


@pytest.mark.parametrize("model, field, fix", [
    ({"video": {"frames": 16, "height": 32, "width": 64, "fps": 8}}, "spec.model.video.frames: 16", "frames: 8"),
    ({"video": {"frames": 8, "height": 32, "width": 64, "fps": 24}}, "spec.model.video.fps: 24.0", "fps: 8"),
    ({"audio": {"seconds": 2.0, "sampleRate": 8000}}, "spec.model.audio.seconds: 2.0", "seconds: 1"),
    ({"audio": {"seconds": 1.0, "sampleRate": 16000}}, "spec.model.audio.sampleRate: 16000", "sampleRate: 8000"),
])
def test_av_digits_refuses_a_size_its_model_was_not_built_for(model: dict, field: str, fix: str) -> None:
    """The family registers its model's sizes (`FamilyInfo.media`); the spec refuses any other, one line per wrong
    field, naming it and the value to write."""
    with pytest.raises(ValidationError) as err:
        _job({"family": "av-digits", **model})
    lines = [text for _, text in problem_lines(RLJob, err.value)]
    assert len(lines) == 1 and lines[0].startswith(f"{field} is invalid: model.family av-digits makes only "), lines
    assert f"write {fix}, or remove" in lines[0], lines


def test_av_digits_takes_its_own_sizes() -> None:
    fine = _job({"family": "av-digits", "video": {"frames": 8, "height": 32, "width": 64, "fps": 8},
                 "audio": {"seconds": 1.0, "sampleRate": 8000}})
    assert set(adapter_options(fine.spec)["modalities"]) == {"video", "audio"}

"""`omnirl validate` of video jobs: the example manifests (flow_grpo's Wan2.1 video OCR, VeRL-Omni's LTX-2.3
audio+video) are valid, and a clip the VAE cannot take is refused naming the field and the nearest valid values —
with the released checkpoints' factors when the model is not on this machine, with the model's own configs when it
is (a tiny LTX-2 whose VAE compresses time by 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from omnirl.cli import main

ROOT = Path(__file__).resolve().parents[2]
WAN, LTX2 = ROOT / "examples" / "gpu-wan-video-ocr.yaml", ROOT / "examples" / "gpu-ltx2-audio-video.yaml"
AV_DIGITS = ROOT / "examples" / "avdigits-awm.yaml"  # make demo-omni's manifest


def _validate(capsys, *paths: Path) -> tuple[int, str]:
    code = main(["validate", *map(str, paths)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _variant(tmp_path: Path, base: Path, name: str, **model) -> Path:
    doc = yaml.safe_load(base.read_text())
    doc["spec"]["model"].update(model)
    doc["spec"]["data"] = {k: str(base.parent / v) for k, v in doc["spec"]["data"].items()}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_video_examples_validate(capsys):
    code, out = _validate(capsys, WAN, LTX2)
    assert code == 0, out
    assert "wan clip: 33 frames of 240x416 at 16 fps (frames = 4k+1, sizes multiples of 16" in out
    assert "ltx2 clip: 81 frames of 256x384 at 24 fps (frames = 8k+1, sizes multiples of 32" in out


@pytest.mark.parametrize("video, message", [
    ({"frames": 32, "height": 240, "width": 416, "fps": 16},
     r"spec.model.video.frames: 32 does not fit the VAE (frames = 4k+1); nearest valid: 29 or 33"),
    ({"frames": 33, "height": 250, "width": 416, "fps": 16},
     r"spec.model.video.height: 250 is not a multiple of 16 (VAE spatial factor x patch size); nearest valid: 240 or 256"),
])
def test_a_wan_clip_the_vae_cannot_take_names_the_nearest_valid_values(tmp_path, capsys, video, message):
    code, out = _validate(capsys, _variant(tmp_path, WAN, "bad", video=video))
    assert code == 2 and message in out, out


def test_minimax_h3_frames_and_duration_are_checked(tmp_path, capsys):
    doc = yaml.safe_load(LTX2.read_text())
    doc["spec"]["model"] = {"family": "minimax-h3", "path": "/models/MiniMax-H3", "dtype": "bfloat16",
                            "video": {"frames": 121, "height": 256, "width": 384, "fps": 24}}
    doc["spec"]["algorithm"]["sampling"]["guidanceScale"] = 1.0
    doc["spec"]["data"] = {k: str(LTX2.parent / v) for k, v in doc["spec"]["data"].items()}
    path = tmp_path / "h3.yaml"
    path.write_text(yaml.safe_dump(doc))
    code, out = _validate(capsys, path)
    assert code == 2 and "spec.model.video.frames: 121 does not fit the VAE (frames = 17k+5); nearest valid: 107 or 124" \
        in out, out


def test_a_local_model_is_checked_with_its_own_configs(tmp_path, capsys):
    pytest.importorskip("diffusers")
    from tests.video_models import save_tiny

    model = save_tiny("ltx2", tmp_path / "tiny-ltx2")  # its VAE: temporal 2, spatial 2 (patch 1)
    good = _variant(tmp_path, LTX2, "good", path=str(model), video={"frames": 9, "height": 32, "width": 32, "fps": 25})
    bad = _variant(tmp_path, LTX2, "bad", path=str(model), video={"frames": 10, "height": 32, "width": 33, "fps": 25})
    audio = _variant(tmp_path, LTX2, "audio", path=str(model), video={"frames": 9, "height": 32, "width": 32, "fps": 25},
                     audio={"seconds": 0.36, "sampleRate": 24000})
    code, out = _validate(capsys, good)
    assert code == 0 and f"(frames = 2k+1, sizes multiples of 2: from {model})" in out, out
    code, out = _validate(capsys, bad)
    assert code == 2 and "spec.model.video.frames: 10 does not fit the VAE (frames = 2k+1); nearest valid: 9 or 11" in out
    code, out = _validate(capsys, audio)
    assert code == 2 and "spec.model.audio.sampleRate: 24000 Hz, but the model in" in out and "write 16000" in out, out


def test_a_remote_scorer_or_judge_of_a_video_job_is_sent_what_its_params_say(tmp_path, capsys):
    """http/grpc/vlm score images unless their params send video frames or sound (`reads()`): on a video family an
    entry without them is refused (it would score nothing the model makes), one with them validates."""
    doc = yaml.safe_load(WAN.read_text())
    doc["spec"]["data"] = {k: str(WAN.parent / v) for k, v in doc["spec"]["data"].items()}
    cases = {"vlm-frames": ({"name": "judge", "kind": "vlm", "url": "http://judge:8000/v1",
                             "params": {"model": "m", "template": "rate", "frames": 4}}, 0),
             "grpc-frames": ({"name": "s", "kind": "grpc", "url": "scorer:50051", "params": {"frameStride": 1}}, 0),
             "vlm-image": ({"name": "judge", "kind": "vlm", "url": "http://judge:8000/v1",
                            "params": {"model": "m", "template": "rate"}}, 2),
             "http-audio": ({"name": "s", "kind": "http", "url": "http://s:8000/v1/score", "params": {"audio": True}},
                            2)}
    for name, (reward, expected) in cases.items():
        doc["spec"]["reward"] = [reward]
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(doc))
        code, out = _validate(capsys, path)
        assert code == expected, (name, out)
        if expected:
            assert "and model.family wan produces video: choose a reward kind that scores what the model produces" \
                in out, out


def test_av_digits_geometry_other_than_its_models_is_refused(tmp_path, capsys):
    """`make demo-omni`'s manifest validates; the same with 9 frames (or 16 kHz audio) exits 2 naming the field and
    the only value the shipped base model was built for (the family's registered `media`)."""
    code, out = _validate(capsys, AV_DIGITS)
    assert code == 0 and "av-digits media: the model's own sizes (video frames 8, height 32, width 64, fps 8; " \
        "audio seconds 1, sampleRate 8000)" in out, out
    frames = _variant(tmp_path, AV_DIGITS, "frames", video={"frames": 9, "height": 32, "width": 64, "fps": 8})
    code, out = _validate(capsys, frames)
    assert code == 2 and "spec.model.video.frames: 9 is invalid: model.family av-digits makes only 8" in out, out
    assert "write frames: 8, or remove video" in out, out
    rate = _variant(tmp_path, AV_DIGITS, "rate", audio={"seconds": 1.0, "sampleRate": 16000})
    code, out = _validate(capsys, rate)
    assert code == 2 and "spec.model.audio.sampleRate: 16000 is invalid: model.family av-digits makes only 8000" \
        in out, out

"""MP4s with sound and contact sheets (`omnirl.controller.media_files`): the file holds an H.264 video stream and an
AAC audio stream (what browsers play), its decoded audio has the beeps where the sample has them, and its frames
are the sample's."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import torch
from PIL import Image

from omnirl.controller.media_files import SCALE, STRIP_HEIGHT, ffmpeg_exe, write_media, write_mp4
from omnirl.models.avdigits.media import Sign, decode_media, render_sign, sign_latents


def _sample(sign: Sign) -> dict[str, torch.Tensor]:
    video, audio = sign_latents(sign, render_sign(sign.number))
    return {k: v[0] for k, v in decode_media(torch.from_numpy(video)[None], torch.from_numpy(audio)[None]).items()}


def probe(path) -> str:
    """ffmpeg's description of the file's streams (the bundled wheel has no ffprobe)."""
    done = subprocess.run([ffmpeg_exe(), "-hide_banner", "-i", str(path)], capture_output=True, text=True)
    return done.stderr


def decoded_audio(path, rate: int = 8000) -> np.ndarray:
    raw = subprocess.run([ffmpeg_exe(), "-loglevel", "error", "-i", str(path), "-vn", "-f", "s16le", "-ac", "1", "-ar",
                          str(rate), "-"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32767.0


def decoded_frames(path, width: int, height: int) -> np.ndarray:
    raw = subprocess.run([ffmpeg_exe(), "-loglevel", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "gray",
                          "-"], capture_output=True, check=True).stdout
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, height, width)


def test_an_mp4_has_h264_video_and_aac_audio_with_the_beeps_where_the_sample_has_them(tmp_path) -> None:
    sample = _sample(Sign("42", 2, 3))  # beeps in frames 3 and 4: 0.375–0.4375 s and 0.5–0.5625 s
    path = write_mp4(sample, tmp_path / "s.mp4")
    streams = probe(path)
    assert re.search(r"Stream #0:\d.*Video: h264.*yuv420p.*256x128", streams), streams
    assert re.search(r"Stream #0:\d.*Audio: aac.*44100 Hz, mono", streams), streams
    audio = decoded_audio(path)
    rms = lambda a, b: float(np.sqrt((audio[int(a * 8000):int(b * 8000)] ** 2).mean()))  # noqa: E731
    assert rms(0.385, 0.43) > 0.25 and rms(0.51, 0.555) > 0.25  # the two beeps (a full tone's RMS is 0.35)
    assert rms(0.05, 0.3) < 0.01 and rms(0.65, 0.95) < 0.01  # silence elsewhere
    frames = decoded_frames(path, 64 * SCALE, 32 * SCALE)
    assert len(frames) == 8
    dark = (frames < 128).mean(axis=(1, 2))
    assert (dark[[3, 4]] > 0.03).all() and (dark[[0, 1, 2, 5, 6, 7]] < 0.005).all()  # ink on frames 3 and 4


def test_a_contact_sheet_shows_each_samples_frames_over_its_loudness(tmp_path) -> None:
    samples = [_sample(Sign("42", 2, 3)), _sample(Sign("9071", 4, 0))]
    out = write_media(samples, tmp_path / "sheet.png", tmp_path / "videos", ["0.99 a", "0.50 b"])
    assert [p.rsplit("/", 1)[1] for p in out["videos"]] == ["00.mp4", "01.mp4"]
    sheet = np.asarray(Image.open(out["sheet"]).convert("L"))
    row_height = 32 + STRIP_HEIGHT + 12  # frames, loudness strip, caption
    assert sheet.shape[1] >= 8 * 64 and sheet.shape[0] >= 2 * row_height
    strip = sheet[2 + 32: 2 + 32 + STRIP_HEIGHT, 2: 2 + 8 * 64]  # the first sample's loudness under its frames
    loud = (strip < 128).any(axis=0)
    hop = 6  # a 10 ms bar is 5.12 px wide and need not start on a frame's first pixel
    assert loud[3 * 64 + hop: 3 * 64 + 32].all() and loud[4 * 64 + hop: 4 * 64 + 32].all()  # the beeps of frames 3, 4
    assert not loud[3 * 64 + 32 + hop: 4 * 64 - hop].any()  # the gap between them
    assert not loud[: 3 * 64 - hop].any() and not loud[5 * 64 + 32:].any()  # silence before and after

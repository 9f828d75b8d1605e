"""What a person looks at and listens to: a multi-modal sample as an MP4 with sound, and a contact sheet.

- MP4: H.264 video (yuv420p, frames enlarged `SCALE`× with nearest-neighbour so a 32×64 frame is visible)
  and AAC audio (resampled to 44.1 kHz, which every browser plays), `+faststart`, encoded by the ffmpeg
  binary of the `imageio-ffmpeg` wheel (a PyPI dependency; it carries libx264 and the native AAC encoder,
  so nothing is downloaded or installed apart from the wheel).
- Contact sheet (PNG): one row per sample: its frames side by side, under them the audio's loudness per
  10 ms (a bar per hop, the width of the frames = the audio's length, so a beep sits under its frame), and
  the caption (its reward).

Validation writes both for its first held-out samples (`OUT/samples/step-NNNNN.png`,
`OUT/samples/step-NNNNN/NN.mp4`): step 0 is the base model, the last one the trained model. `omnirl eval`
writes the same into its `--out`.
"""

from __future__ import annotations

import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np

from omnirl.controller.grid import save_image_grid

SCALE = 4
AUDIO_OUT_HZ = 44100
STRIP_HEIGHT = 16
HOP_S = 0.01
MP4_SAMPLES = 8
SHEET_SAMPLES = 16

Media = dict[str, np.ndarray]


def ffmpeg_exe() -> str:
    """The ffmpeg binary shipped in the `imageio-ffmpeg` wheel.

    Raises:
        FileNotFoundError: the package is not installed (`pip install imageio-ffmpeg`).
    """
    try:
        import imageio_ffmpeg
    except ImportError as err:
        raise FileNotFoundError("imageio-ffmpeg is not installed (it ships the ffmpeg that writes the MP4s); "
                                "pip install imageio-ffmpeg") from err
    return imageio_ffmpeg.get_ffmpeg_exe()


def _numpy(media: dict) -> Media:
    return {k: (v.numpy() if hasattr(v, "numpy") else np.asarray(v)) for k, v in media.items()}


def write_mp4(media: dict, path: str | Path) -> Path:
    """One sample's `video` (uint8 `[T, H, W, 3]`, at its `fps`) and `audio` (float32 `[L]` at its
    `audio_sample_rate`, optional) as an H.264 + AAC MP4 at `path`.

    Raises:
        ValueError: no video in `media`.
        RuntimeError: ffmpeg failed (its last error lines are in the message).
    """
    media = _numpy(media)
    if "video" not in media:
        raise ValueError(f"write_mp4 needs a video; media has {sorted(media)}")
    video = np.ascontiguousarray(media["video"][..., :3], dtype=np.uint8)
    t, h, w, _ = video.shape
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [ffmpeg_exe(), "-y", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{w}x{h}",
               "-r", f"{float(media['fps']):g}", "-i", "pipe:0"]
        if "audio" in media:
            wav = Path(tmp) / "audio.wav"
            _write_wav(media["audio"], int(media["audio_sample_rate"]), wav)
            cmd += ["-i", str(wav), "-c:a", "aac", "-b:a", "96k", "-ar", str(AUDIO_OUT_HZ)]
        cmd += ["-vf", f"scale={w * SCALE}:{h * SCALE}:flags=neighbor", "-c:v", "libx264", "-pix_fmt", "yuv420p",
                "-movflags", "+faststart", str(out)]
        done = subprocess.run(cmd, input=video.tobytes(), capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ffmpeg could not write {out} (exit {done.returncode}): "
                           f"{done.stderr.decode(errors='replace').strip()[-500:]}")
    return out


def _write_wav(audio: np.ndarray, sample_rate: int, path: Path) -> None:
    pcm = (np.clip(audio.astype(np.float64), -1.0, 1.0) * 32767.0).round().astype("<i2")
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes(pcm.tobytes())


def loudness_strip(audio: np.ndarray, sample_rate: int, width: int) -> np.ndarray:
    """`[STRIP_HEIGHT, width, 3]` uint8: the RMS of each 10 ms hop as a dark bar (full height = RMS 0.5) on white,
    the hops spread over `width` pixels."""
    hop = max(1, round(sample_rate * HOP_S))
    if len(audio) < hop:  # a clip shorter than one hop (a tiny model's) is one bar
        audio = np.pad(audio, (0, hop - len(audio)))
    n = max(1, len(audio) // hop)
    rms = np.sqrt((audio[: n * hop].astype(np.float64).reshape(n, hop) ** 2).mean(axis=1))
    heights = np.clip(rms / 0.5, 0.0, 1.0)[np.minimum((np.arange(width) * n) // width, n - 1)]
    rows = np.arange(STRIP_HEIGHT)[:, None]
    bar = rows >= (STRIP_HEIGHT * (1.0 - heights))[None, :]
    strip = np.where(bar, 40, 255).astype(np.uint8)
    return np.repeat(strip[..., None], 3, axis=2)


def sample_picture(media: dict) -> np.ndarray:
    """One contact-sheet row: the frames side by side (an `image` as it is) over the audio's `loudness_strip`."""
    media = _numpy(media)
    if "video" in media:
        video = media["video"][..., :3]
        picture = np.concatenate(list(video), axis=1)
    else:
        picture = media["image"][..., :3]
    if "audio" in media:
        strip = loudness_strip(media["audio"], int(media["audio_sample_rate"]), picture.shape[1])
        picture = np.concatenate([picture, strip], axis=0)
    return np.ascontiguousarray(picture, dtype=np.uint8)


def write_media(media: list[dict], sheet: str | Path, video_dir: str | Path, captions: list[str]) -> dict[str, object]:
    """The contact sheet `sheet` (PNG) of the first `SHEET_SAMPLES` samples and the MP4s `video_dir/NN.mp4` of the
    first `MP4_SAMPLES` (those with a video).

    Returns:
        {"sheet": path, "videos": [paths]} as strings.
    Raises:
        ValueError: no media or a caption count mismatch. RuntimeError: ffmpeg failed.
    """
    if not media or len(captions) != len(media):
        raise ValueError(f"write_media needs media and one caption each; got {len(media)} and {len(captions)}")
    written = save_image_grid([sample_picture(m) for m in media[:SHEET_SAMPLES]], sheet, ncols=1,
                              captions=captions[:SHEET_SAMPLES])
    videos = [str(write_mp4(m, Path(video_dir) / f"{i:02d}.mp4")) for i, m in enumerate(media[:MP4_SAMPLES])
              if "video" in m]
    return {"sheet": str(written), "videos": videos}

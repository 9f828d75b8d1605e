"""The four rewards of the built-in audio+video digits task (docs/omni.md, "The built-in audio+video task").

Prompt `A sign that says "<number>" with <k> beeps`. A right sample draws the number on exactly k
frames (blank otherwise), sounds a beep on each of those frames and only there, at 300 + 100·d Hz for
the number's first digit d. Each term is in [0, 1] and needs no model weights but the OCR recogniser
shipped in `rapidocr-onnxruntime`:

- `avdigits-ocr`: Flow-GRPO's OCR reward (`text.ocr_reward`) of each inked frame (the first `MAX_READ` of
  them), averaged, times min(n_ink, k)/max(n_ink, k): the number on exactly k frames.
- `avdigits-beeps`: 2^−|n − k|, n the beeps counted by energy onsets: each run of sound counts as
  max(1, round(duration / 62.5 ms)) beeps (the synthesizer's beep is 62.5 ms), so a held tone is not one beep.
- `avdigits-pitch`: exp(−½·(Δ/50 Hz)²), Δ between the dominant frequency of the sounding parts and
  300 + 100·d Hz; 0 with no sound.
- `avdigits-sync`: |I ∩ B| / |I ∪ B| of the inked frames I and the frames B where a beep starts (`onset_frames`;
  0 when both are empty): beeps on the frames with ink and only there; the audio shifted by one frame lowers it.

"Ink on every frame, beep all the time" scores low: the OCR term's frame count, the count term (a held
tone is many beeps) and the sync term (one onset) see to it (tests/models/test_avdigits.py).

Signal rules (`inked_frames`, `sound_runs`, `dominant_hz`): a frame has ink when more than 2% of its pixels
are darker than 128; sound is a 10 ms hop whose RMS exceeds 0.1 (a full beep's is 0.35).
"""

from __future__ import annotations

import math

import numpy as np

from omnirl.api.prompts import beep_count, target_text
from omnirl.scorers.base import ScorerError, check_rewards
from omnirl.scorers.text import ocr_reward

INK_LEVEL = 128
INK_FRACTION = 0.02
HOP_S = 0.01
SOUND_RMS = 0.1
BEEP_S = 0.0625
PITCH_SIGMA_HZ = 50.0
MAX_READ = 4
"""Inked frames read per sample at most (the OCR is the reward's cost; more than 4 inked frames is wrong anyway)."""

Media = dict[str, np.ndarray]


def pitch_target_hz(prompt: str) -> float:
    """300 + 100·d Hz, d the first digit of the prompt's quoted number."""
    return 300.0 + 100.0 * int(target_text(prompt)[0])


def inked_frames(video: np.ndarray) -> np.ndarray:
    """`[T, H, W, 3]` uint8 → `[T]` bool: more than `INK_FRACTION` of the frame's pixels darker than `INK_LEVEL`."""
    grey = video.astype(np.float32).mean(axis=-1)
    return (grey < INK_LEVEL).mean(axis=(1, 2)) > INK_FRACTION


def sound_runs(audio: np.ndarray, sample_rate: int) -> list[tuple[float, float]]:
    """(start, stop) in seconds of each run of 10 ms hops whose RMS exceeds `SOUND_RMS`."""
    hop = max(1, round(sample_rate * HOP_S))
    n = len(audio) // hop
    rms = np.sqrt((audio[: n * hop].astype(np.float64).reshape(n, hop) ** 2).mean(axis=1))
    on = np.concatenate([[False], rms > SOUND_RMS, [False]])
    edges = np.flatnonzero(on[1:] != on[:-1])
    return [(a * hop / sample_rate, b * hop / sample_rate) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def count_beeps(runs: list[tuple[float, float]]) -> int:
    """Beeps in `runs`: each run counts max(1, round(duration / `BEEP_S`))."""
    return sum(max(1, round((b - a) / BEEP_S)) for a, b in runs)


def onset_frames(runs: list[tuple[float, float]], fps: float, frames: int) -> np.ndarray:
    """`[frames]` bool: True for each frame in which a run of sound starts, placed by the middle of its first
    beep (start + `BEEP_S`/2), so a 10 ms hop that begins just before a frame's first sample does not move the
    beep into the frame before."""
    out = np.zeros(frames, dtype=bool)
    for start, _ in runs:
        f = int(math.floor((start + BEEP_S / 2) * fps))
        if 0 <= f < frames:
            out[f] = True
    return out


def dominant_hz(audio: np.ndarray, sample_rate: int, runs: list[tuple[float, float]]) -> float | None:
    """The frequency (Hz) of the largest magnitude of the spectrum of the sounding parts (silence zeroed),
    above 50 Hz; None without sound."""
    if not runs:
        return None
    keep = np.zeros(len(audio), dtype=np.float64)
    for a, b in runs:
        keep[int(a * sample_rate):int(b * sample_rate)] = 1.0
    spectrum = np.abs(np.fft.rfft(audio.astype(np.float64) * keep))
    freqs = np.fft.rfftfreq(len(audio), 1.0 / sample_rate)
    spectrum[freqs < 50.0] = 0.0
    return float(freqs[int(spectrum.argmax())])


def _sample(media: Media, sample_id: str, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in media]
    if missing:
        raise ScorerError(sample_id, f"media lacks {missing} (has {sorted(media)}): this reward scores an "
                          "audio+video sample (model.family av-digits)")
    if "video" in keys and (media["video"].ndim != 4 or media["video"].dtype != np.uint8):
        raise ScorerError(sample_id, f"video must be uint8 [T, H, W, 3], got {media['video'].dtype} "
                          f"{list(media['video'].shape)}")
    if "audio" in keys and media["audio"].ndim != 1:
        raise ScorerError(sample_id, f"audio must be a mono waveform [L], got {list(media['audio'].shape)}")


def _prompt(prompt: str, sample_id: str) -> tuple[str, int]:
    try:
        number, k = target_text(prompt), beep_count(prompt)
    except (TypeError, ValueError) as err:
        raise ScorerError(sample_id, f"bad prompt: {err}") from err
    if not number.isdigit():
        raise ScorerError(sample_id, f"prompt {prompt!r}: the quoted text must be a number")
    return number, k


class _MediaScorer:
    """Base of the task's scorers: `score_media` per sample through `_one`; `score` (images) refuses."""

    name = ""
    modalities: frozenset[str] = frozenset()

    def score(self, images: np.ndarray, prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """Images alone cannot be scored: raises ScorerError (the reward role hands these scorers media)."""
        raise ScorerError(sample_ids[0] if sample_ids else "", f"{self.name} scores {sorted(self.modalities)}, not "
                          "images: use it with an audio+video model (model.family av-digits)")

    def score_media(self, media: list[Media], prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """Rewards `[B]` float32 in [0, 1] of B media dicts (numpy: `video` uint8 `[T, H, W, 3]`, `audio` float32
        `[L]`, `audio_sample_rate`, `fps`).

        Raises:
            ScorerError: a sample without the media this reward needs, or a prompt of another task.
        """
        if not len(media) == len(prompts) == len(sample_ids):
            raise ScorerError("", f"got {len(media)} samples, {len(prompts)} prompts and {len(sample_ids)} ids")
        values = [self._one(m, p, i) for m, p, i in zip(media, prompts, sample_ids, strict=True)]
        return check_rewards(np.array(values, dtype=np.float32), sample_ids)

    def _one(self, media: Media, prompt: str, sample_id: str) -> float:
        raise NotImplementedError


def _runs(media: Media) -> list[tuple[float, float]]:
    return sound_runs(media["audio"], int(media["audio_sample_rate"]))


class BeepCountScorer(_MediaScorer):
    """`avdigits-beeps`: 2^−|n − k| (module docstring)."""

    name = "avdigits-beeps"
    modalities = frozenset({"audio"})

    def _one(self, media: Media, prompt: str, sample_id: str) -> float:
        _sample(media, sample_id, ("audio", "audio_sample_rate"))
        _, k = _prompt(prompt, sample_id)
        return 2.0 ** -abs(count_beeps(_runs(media)) - k)


class PitchScorer(_MediaScorer):
    """`avdigits-pitch`: exp(−½·(Δ/50 Hz)²) against 300 + 100·d Hz (module docstring)."""

    name = "avdigits-pitch"
    modalities = frozenset({"audio"})

    def _one(self, media: Media, prompt: str, sample_id: str) -> float:
        _sample(media, sample_id, ("audio", "audio_sample_rate"))
        _prompt(prompt, sample_id)
        found = dominant_hz(media["audio"], int(media["audio_sample_rate"]), _runs(media))
        if found is None:
            return 0.0
        return math.exp(-0.5 * ((found - pitch_target_hz(prompt)) / PITCH_SIGMA_HZ) ** 2)


class SyncScorer(_MediaScorer):
    """`avdigits-sync`: |I ∩ B| / |I ∪ B| of inked frames and beep-onset frames (module docstring)."""

    name = "avdigits-sync"
    modalities = frozenset({"video", "audio"})

    def _one(self, media: Media, prompt: str, sample_id: str) -> float:
        _sample(media, sample_id, ("video", "audio", "audio_sample_rate", "fps"))
        ink = inked_frames(media["video"])
        beeps = onset_frames(_runs(media), float(media["fps"]), len(ink))
        union = int((ink | beeps).sum())
        return int((ink & beeps).sum()) / union if union else 0.0


class FrameOCRScorer(_MediaScorer):
    """`avdigits-ocr`: OCR of the inked frames × the frame-count factor (module docstring).

    Args:
        threads, batch_size: the OCR recogniser's (`reward.ocr.OCRScorer`).
    """

    name = "avdigits-ocr"
    modalities = frozenset({"video"})

    def __init__(self, threads: int = 1, batch_size: int = 64) -> None:
        from omnirl.reward.ocr import OCRScorer

        self.ocr = OCRScorer(alphabet="0123456789", threads=threads, batch_size=batch_size)

    def score_media(self, media: list[Media], prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """As `_MediaScorer.score_media`, with every sample's inked frames read in one batched OCR call."""
        if not len(media) == len(prompts) == len(sample_ids):
            raise ScorerError("", f"got {len(media)} samples, {len(prompts)} prompts and {len(sample_ids)} ids")
        reads: list[tuple[int, np.ndarray]] = []
        plan = []
        for i, (m, p, sid) in enumerate(zip(media, prompts, sample_ids, strict=True)):
            _sample(m, sid, ("video",))
            number, k = _prompt(p, sid)
            ink = np.flatnonzero(inked_frames(m["video"]))
            plan.append((number, k, len(ink)))
            reads.extend((i, m["video"][f, ..., :3]) for f in ink[:MAX_READ])
        texts: list[str] = []
        if reads:
            frames = np.stack([frame for _, frame in reads])
            try:
                texts = self.ocr.read(np.ascontiguousarray(frames))
            except Exception as err:  # onnxruntime raises its own exception types
                raise ScorerError(sample_ids[reads[0][0]], f"OCR recogniser failed: {err}") from err
        per_sample: dict[int, list[float]] = {}
        for (i, _), text in zip(reads, texts, strict=True):
            per_sample.setdefault(i, []).append(ocr_reward(plan[i][0], text))
        values = []
        for i, (_, k, n_ink) in enumerate(plan):
            if not n_ink:
                values.append(0.0)
                continue
            values.append(float(np.mean(per_sample[i])) * min(n_ink, k) / max(n_ink, k))
        return check_rewards(np.array(values, dtype=np.float32), sample_ids)


SCORERS = {"avdigits-ocr": FrameOCRScorer, "avdigits-beeps": BeepCountScorer, "avdigits-pitch": PitchScorer,
           "avdigits-sync": SyncScorer}
"""Reward kind → scorer class."""

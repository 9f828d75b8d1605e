"""CLAP audio↔text reward: the cosine similarity of the waveform's and the prompt's CLAP embeddings, through
`transformers`' `ClapModel` and `ClapProcessor` loaded from a local directory (`laion/larger_clap_general` saved
with `save_pretrained`, as VeRL-Omni's LTX-2 recipe uses; nothing is downloaded).

reward = ⟨a, t⟩ / (‖a‖·‖t‖) ∈ [−1, 1], a = `get_audio_features` of the waveform, t = `get_text_features` of the
prompt line (or `template` with `{prompt}` filled in). The waveform (mono float32, any rate) is first resampled to
the feature extractor's `sampling_rate` (48 kHz for the released CLAP) by band-limited Fourier resampling (`resample`)
and cut to the extractor's `max_length_s` from its start (deterministic: the extractor would crop a longer clip at
a random place).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from omnirl.reward.frames import Media, media_of
from omnirl.scorers.base import ScorerError, check_rewards


def resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """`x` float32 `[L]` at `rate` Hz → float32 at `target` Hz, round(L·target/rate) samples, by zero-padding or
    truncating its real FFT (band-limited: a tone below both Nyquist frequencies keeps its frequency and amplitude;
    the clip is treated as periodic, so its two ends may ring slightly)."""
    if rate == target or x.size == 0:
        return x.astype(np.float32, copy=True)
    n_out = max(1, int(round(x.size * target / rate)))
    spectrum = np.fft.rfft(x.astype(np.float64))
    out = np.fft.irfft(spectrum, n=n_out) * (n_out / x.size)
    return out.astype(np.float32)


class ClapScorer:
    """CLAP audio↔text similarity (module docstring).

    Args:
        path: local directory holding the CLAP model and its processor (`save_pretrained` of both).
        device: where the model runs ("cpu", "cuda").
        template: the text compared with the audio; `{prompt}` is replaced by the prompt line.
        batch_size: clips per model call.
    Attributes:
        name: "clap". modalities: {"audio"}.
    Raises:
        FileNotFoundError / OSError: the directory does not hold a CLAP model and processor (naming it).
    """

    name = "clap"
    modalities = frozenset({"audio"})

    def __init__(self, path: str | Path, *, device: str = "cpu", template: str = "{prompt}", batch_size: int = 16) -> None:
        import torch
        from transformers import ClapModel, ClapProcessor

        root = Path(path)
        if not (root / "config.json").is_file():
            raise FileNotFoundError(f"{root}/config.json not found: the CLAP reward needs a local directory holding "
                                    "ClapModel and ClapProcessor as save_pretrained writes them")
        try:
            self.processor = ClapProcessor.from_pretrained(str(root), local_files_only=True)
            self.model = ClapModel.from_pretrained(str(root), local_files_only=True).to(device).eval()
        except (OSError, ValueError) as err:
            raise OSError(f"cannot load CLAP from {root} (local files only): {err}") from err
        self.torch, self.device, self.template, self.batch_size = torch, device, template, batch_size
        extractor = self.processor.feature_extractor
        self.sample_rate = int(extractor.sampling_rate)
        self.max_samples = int(extractor.sampling_rate * extractor.max_length_s)

    def embed(self, waves: Sequence[np.ndarray], texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Unit-norm CLAP embeddings `[B, P]` of waveforms (at `sample_rate`, ≤ `max_samples`) and texts."""
        torch = self.torch
        inputs = self.processor(text=list(texts), audio=list(waves), sampling_rate=self.sample_rate,
                                return_tensors="pt", padding=True)
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        with torch.no_grad():
            audio = self.model.get_audio_features(input_features=inputs["input_features"],
                                                  is_longer=inputs.get("is_longer"))
            text = self.model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        audio, text = (getattr(t, "pooler_output", t) for t in (audio, text))  # transformers 5 returns outputs
        audio, text = (torch.nn.functional.normalize(t.float(), dim=-1).cpu().numpy() for t in (audio, text))
        return audio, text

    def score_media(self, media: Sequence[Media], prompts: list[str], sample_ids: list[str]) -> np.ndarray:
        """`[B]` float32 cosine similarities in [−1, 1].

        Raises:
            ScorerError: malformed media, or a model failure (naming the first sample of the batch).
        """
        media_of(media, prompts, sample_ids, {"audio"})
        waves = [resample(np.asarray(m["audio"], np.float32), int(np.asarray(m["audio_sample_rate"])),
                          self.sample_rate)[: self.max_samples] for m in media]
        texts = [self.template.replace("{prompt}", p) for p in prompts]
        rewards = np.zeros(len(sample_ids), dtype=np.float32)
        for start in range(0, len(sample_ids), self.batch_size):
            stop = start + self.batch_size
            try:
                audio, text = self.embed(waves[start:stop], texts[start:stop])
            except Exception as err:  # the model's own errors (shapes, devices)
                raise ScorerError(sample_ids[start], f"CLAP failed: {type(err).__name__}: {err}") from err
            rewards[start:stop] = (audio * text).sum(axis=1)
        return check_rewards(rewards, sample_ids)

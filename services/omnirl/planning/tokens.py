"""Tokens of one sample of a job, per stream the transformer's layers process, from the job's video and audio sizes
and the model's configs (the families' own rules: `models/diffusers/{wan,ltx2,minimax_h3}.py`).

- wan: video latent frames (frames − 1)/t + 1 (t = `vae.scale_factor_temporal`, 4), latent size /8
  (`scale_factor_spatial`), patches (1, 2, 2): T'·(H/16)·(W/16) tokens; text: 512 keys.
- ltx2: latent frames (frames − 1)/8 + 1, size /32 (`transformer.vae_scale_factors`), patch 1; audio rows
  frames/fps · sample_rate/hop/4 (`audio_vae`: 16000 / 160 / 4 = 25 per second); text: 1024 keys.
- minimax-h3: latent frames from 17-frame clips of 5 latents (`vae`: clip_length, tokens_chunk_size, token_drop),
  size /16, patches (1, 2, 2); audio 40 latents per second at 24 fps; 512 text rows. All rows are one packed
  sequence ("video" here holds every row: text, audio and video go through every block).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SampleTokens:
    """Tokens of one sample the transformer's layers run over.

    Attributes:
        video: rows of the main stream (MiniMax-H3: every packed row).
        audio: rows of a separate audio stream (LTX-2), else 0.
        text: text tokens the layers attend to as keys (not rows of the stream, MiniMax-H3 excepted: counted in
            `video` there).
        latent_elements: elements of the sample's flat latent (its trajectory's size per step, float32).
        grid: (latent frames, token rows, token columns) of the video (`activations.forward_inputs`'s grid).
        audio_rows: the audio rows alone (MiniMax-H3's are inside `video`; LTX-2's are `audio`).
    """

    video: int
    audio: int
    text: int
    latent_elements: int
    grid: tuple[int, int, int] = (0, 0, 0)
    audio_rows: int = 0


H3_FPS = 24.0
H3_AUDIO_LATENTS_PER_SECOND = 40  # diffusers.modular_pipelines.minimax_h3.MINIMAX_H3_AUDIO_LATENTS_PER_SECOND


def read_configs(root) -> dict[str, dict]:
    """Subfolder → its `config.json` of the model directory `root` (JSON only)."""
    import json
    from pathlib import Path

    return {p.parent.name: json.loads(p.read_text()) for p in sorted(Path(root).glob("*/config.json"))}


def sample_tokens(family: str, configs: dict, frames: int, height: int, width: int, fps: float) -> SampleTokens:
    """The tokens of one sample of `frames` × `height` × `width` at `fps` (module docstring).

    Args:
        configs: subfolder → config of the model directory (`read_configs`): VAE factors, patch sizes, channels.
    Raises:
        ValueError: a family this plan has no token rule for, or frames/size the family's VAE cannot take.
    """
    t = configs["transformer"]

    def vae(key: str, default):
        return configs.get("vae", {}).get(key, default)

    if family == "wan":
        ft, fs = int(vae("scale_factor_temporal", 4)), int(vae("scale_factor_spatial", 8))
        p = t.get("patch_size", (1, 2, 2))
        if (frames - 1) % ft or height % (fs * p[1]) or width % (fs * p[2]):
            raise ValueError(f"wan takes frames = {ft}k+1 and sizes that are multiples of {fs * p[1]}; got {frames} × "
                             f"{height}x{width}")
        lt, lh, lw = (frames - 1) // ft + 1, height // fs, width // fs
        return SampleTokens(lt // p[0] * (lh // p[1]) * (lw // p[2]), 0, 512, t.get("in_channels", 16) * lt * lh * lw,
                            (lt // p[0], lh // p[1], lw // p[2]))
    if family == "ltx2":
        ft, fh, fw = t.get("vae_scale_factors", (8, 32, 32))
        if (frames - 1) % ft or height % fh or width % fw:
            raise ValueError(f"ltx2 takes frames = {ft}k+1 and sizes that are multiples of {fh}; got {frames} × "
                             f"{height}x{width}")
        lt, lh, lw = (frames - 1) // ft + 1, height // fh, width // fw
        a = configs.get("audio_vae", {})
        rate, hop = a.get("sample_rate", 16000), a.get("mel_hop_length", 160)
        audio = round(frames / fps * rate / hop / 4)
        mel = a.get("mel_bins", 64) // 4
        return SampleTokens(lt * lh * lw, audio, 1024, t.get("in_channels", 128) * lt * lh * lw
                            + a.get("latent_channels", 8) * audio * mel, (lt, lh, lw), audio)
    if family == "minimax-h3":
        clip, chunk, drop = int(vae("clip_length", 17)), int(vae("tokens_chunk_size", 5)), int(vae("token_drop", 3))
        spatial = 16
        p = t.get("patch_size", (1, 2, 2))
        if frames < chunk or (frames - chunk) % clip or height % (spatial * p[1]) or width % (spatial * p[2]):
            raise ValueError(f"minimax-h3 takes frames = {clip}k+{chunk} and sizes that are multiples of "
                             f"{spatial * p[1]}; got {frames} × {height}x{width}")
        lt = chunk - drop + (frames - chunk) // clip * chunk
        video = lt * (height // spatial // p[1]) * (width // spatial // p[2])
        audio = round(frames / H3_FPS * H3_AUDIO_LATENTS_PER_SECOND)
        channels = t.get("in_channels", 24)
        return SampleTokens(512 + audio + video, 0, 0, channels * lt * (height // spatial) * (width // spatial)
                            + t.get("audio_in_channels", 32) * audio,
                            (lt, height // spatial // p[1], width // spatial // p[2]), audio)
    raise ValueError(f"no token rule for family {family!r} (the plan knows wan, ltx2, minimax-h3)")

"""Tiny random diffusers transformers of the video families (Wan, LTX-2, MiniMax-H3) and one input batch each,
for the parallel tests: built from a config in memory (nothing downloaded), seeded, float32.

`build(family, seed)` → (model, inputs); `velocity(model, inputs)` → the tensors a loss reads (video and, for the
audio+video families, audio), each `[B, tokens, channels]`. Token counts are chosen so that they do NOT divide
by 2 or 4 (the uneven path: Ulysses-Anything with its backward), unless `even=True`.
"""

from __future__ import annotations

import torch

FAMILIES = ("wan", "ltx2", "minimax-h3")


def build(family: str, seed: int = 0, *, even: bool = False, batch: int = 2) -> tuple[torch.nn.Module, dict]:
    """A tiny `family` transformer (fp32, eval mode, deterministic init from `seed`) and a batch for it."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    if family == "wan":
        from diffusers import WanTransformer3DModel

        model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=8,
                                      in_channels=4, out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32,
                                      num_layers=2, rope_max_seq_len=32)
        frames, width = (4, 4) if even else (5, 2)  # tokens: frames × 3 × width/2 = 24 (divides by 2, 4) or 15
        inputs = {"hidden_states": torch.randn(batch, 4, frames, 6, width, generator=g),
                  "timestep": torch.tensor([500.0, 250.0])[:batch],
                  "encoder_hidden_states": torch.randn(batch, 7, 16, generator=g)}
    elif family == "ltx2":
        from diffusers import LTX2VideoTransformer3DModel

        model = LTX2VideoTransformer3DModel(
            in_channels=8, out_channels=8, num_attention_heads=4, attention_head_dim=8, cross_attention_dim=32,
            audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=4, audio_attention_head_dim=4,
            audio_cross_attention_dim=16, num_layers=2, caption_channels=16, vae_scale_factors=(8, 32, 32),
            base_height=64, base_width=64)
        frames, h, w = (2, 2, 2) if even else (5, 1, 1)  # video tokens 8 or 5
        audio = 8 if even else 5
        text = 8 if even else 7
        inputs = {"hidden_states": torch.randn(batch, frames * h * w, 8, generator=g),
                  "audio_hidden_states": torch.randn(batch, audio, 4, generator=g),
                  "encoder_hidden_states": torch.randn(batch, text, 16, generator=g),
                  "audio_encoder_hidden_states": torch.randn(batch, text, 16, generator=g),
                  "encoder_attention_mask": (torch.arange(text) < text - 1).float().expand(batch, text),
                  "timestep": torch.tensor([500.0, 250.0])[:batch],
                  "num_frames": frames, "height": h, "width": w, "audio_num_frames": audio}
    elif family == "minimax-h3":
        from diffusers import MiniMaxH3Transformer3DModel

        model = MiniMaxH3Transformer3DModel(num_attention_heads=4, attention_head_dim=16, hidden_size=24,
                                            num_layers=2, num_refiner_layers=1, ffn_dim=32, in_channels=4,
                                            audio_in_channels=4, patch_size=(1, 2, 2), text_dim=16, freq_dim=16,
                                            time_embed_hidden_dim=24, time_embed_dim=12, rope_freq_dim=2)
        n_text, n_audio, n_video = (3, 3, 6) if even else (3, 4, 6)  # packed rows 12 or 13 (divides by neither)
        seq = n_text + n_audio + n_video
        order = torch.randperm(seq, generator=g)
        text_idx, audio_idx, video_idx = order[:n_text], order[n_text:n_text + n_audio], order[n_text + n_audio:]
        tags = torch.zeros(seq, dtype=torch.long)
        tags[text_idx], tags[audio_idx] = 1, 2
        inputs = {"hidden_states": torch.randn(batch, n_video, 16, generator=g),
                  "audio_hidden_states": torch.randn(batch, n_audio, 4, generator=g),
                  "encoder_hidden_states": torch.randn(batch, n_text, 16, generator=g),
                  "timestep": torch.tensor([0.7, 0.0]), "timestep_indices": (tags == 1).long(),
                  "token_tags": tags, "position_ids": torch.randint(0, 4, (seq, 3), generator=g),
                  "video_indices": video_idx, "audio_indices": audio_idx, "text_indices": text_idx}
    else:
        raise ValueError(f"unknown family {family!r}; one of {FAMILIES}")
    return model.float().eval(), inputs


def velocity(model: torch.nn.Module, inputs: dict) -> list[torch.Tensor]:
    """The model's outputs a loss reads: `[video]` or `[video, audio]`, each `[B, tokens, channels]`."""
    out = model(**inputs, return_dict=False)
    return [out[0].flatten(2).transpose(1, 2) if out[0].dim() == 5 else out[0], *[t for t in out[1:2]]] \
        if isinstance(out, tuple) else [out]


def loss(outputs: list[torch.Tensor], seed: int = 7) -> torch.Tensor:
    """A fixed random projection of the outputs (every element weighs differently)."""
    g = torch.Generator().manual_seed(seed)
    return sum((o * torch.randn(o.shape, generator=g)).sum() for o in outputs)

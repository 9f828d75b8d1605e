"""The audio+video digits network: a toy joint DiT after MiniMax-H3's design.

MiniMax-H3 (diffusers `MiniMaxH3Transformer3DModel`) puts text, audio and video rows in ONE packed
sequence with full self-attention (no cross-attention) and tells the rows apart by a per-row modality
tag in the AdaLN. This model does the same at toy scale:

- text rows (5): the number's digits left-packed (4 rows, pad 0) and the beep count k (1 row);
- video rows (12): the sign's 4 character slots (a 16×8 patch of the half-resolution sign each, 128
  values), each with the digits model's layout embedding — the character drawn in its slot (the number
  centred in 4 slots), decisive for legibility in minutes (models/digits/model.py) — and one row per
  frame holding that frame's ink (1 value; `avdigits/media.py`);
- audio rows (9): one per frame holding its beep's loudness (1 value), and the pitch profile (16 values);
- a frame embedding shared by the ink row and the loudness row of one frame (their common clock: what the
  model must keep in sync), a row-kind embedding per modality, and the AdaLN modulation computed per
  modality tag from the σ embedding (adaLN-Zero, Peebles & Xie 2023);
- the velocity v = ε − x0 of the video and audio rows, flattened in the latent layout's order
  (video then audio); the text rows' outputs are dropped.

An all-zero prompt (digits and k all 0) is the unconditional input, trained with probability 0.1 in
pretraining, so classifier-free guidance works per modality (`models/layout.py::guided`).

The linear layers LoRA attaches to are named ``attn.qkv``, ``attn.proj``, ``mlp.fc1``, ``mlp.fc2``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from omnirl.models.avdigits.media import (
    AUDIO_BINS,
    FRAMES,
    LATENT_HEIGHT,
    LATENT_WIDTH,
    MAX_BEEPS,
    MAX_DIGITS,
    SIGN_NUMEL,
)
from omnirl.models.digits.model import Block, column_char_ids, sigma_embedding

LORA_TARGET_MODULES = ["attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"]
TEXT, VIDEO, AUDIO = 0, 1, 2
"""Row modality tags."""


@dataclass(frozen=True)
class AVDigitsConfig:
    """Hyperparameters of `AVDigitsDiT` (stored in the checkpoint's config.json under "model").

    Attributes:
        d_model, depth, heads, mlp_ratio: the transformer (128, 4, 4, 4: ~1.3 M parameters; a step of 64 samples
            is ~2/3 of the digits model's 6 blocks on the 2 shared cores).
        slots: character slots per frame (4: numbers of 2–4 digits).
    """

    d_model: int = 128
    depth: int = 4
    heads: int = 4
    mlp_ratio: int = 4
    slots: int = 4

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} must be divisible by heads {self.heads}")
        if LATENT_WIDTH % self.slots:
            raise ValueError(f"slots {self.slots} must divide the latent width {LATENT_WIDTH}")

    @property
    def slot_width(self) -> int:
        """Latent pixels per slot (8)."""
        return LATENT_WIDTH // self.slots

    def to_dict(self) -> dict:
        """JSON-ready dict of the fields."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> AVDigitsConfig:
        """Build from a dict; unknown keys raise ValueError naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown AVDigitsConfig keys {unknown}; expected a subset of {sorted(known)}")
        return cls(**data)


TEXT_ROWS = MAX_DIGITS + 1
PROMPT_VOCAB = 11  # 0 = pad, 1..10 = the digits 0..9
BEEP_VOCAB = MAX_BEEPS + 1  # 0 = unconditional, 1..4


class AVDigitsDiT(nn.Module):
    """Velocity network v_θ(x_σ, σ, prompt) ≈ ε − x0 on the flat latent `[B, D]` (video then audio)."""

    def __init__(self, config: AVDigitsConfig) -> None:
        super().__init__()
        self.config = config
        d, sw = config.d_model, config.slot_width
        self.video_patch = LATENT_HEIGHT * sw
        self.video_in = nn.Linear(self.video_patch, d)
        self.ink_in = nn.Linear(1, d)
        self.loud_in = nn.Linear(1, d)
        self.pitch_in = nn.Linear(AUDIO_BINS, d)
        self.char_embed = nn.Embedding(PROMPT_VOCAB, d)
        self.beep_embed = nn.Embedding(BEEP_VOCAB, d)
        self.text_pos = nn.Parameter(torch.randn(TEXT_ROWS, d) * 0.02)
        self.frame_embed = nn.Parameter(torch.randn(FRAMES, d) * 0.02)
        self.slot_embed = nn.Parameter(torch.randn(config.slots, d) * 0.02)
        self.ink_embed = nn.Parameter(torch.randn(d) * 0.02)
        self.pitch_embed = nn.Parameter(torch.randn(d) * 0.02)
        self.tag_embed = nn.Parameter(torch.randn(3, d) * 0.02)
        for emb in (self.char_embed, self.beep_embed):
            nn.init.normal_(emb.weight, std=0.02)
        self.sigma_mlp = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList(Block(d, config.heads, config.mlp_ratio) for _ in range(config.depth))
        self.norm_out = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.modulation_out = nn.Linear(d, 2 * d)
        self.video_out = nn.Linear(d, self.video_patch)
        self.ink_out = nn.Linear(d, 1)
        self.loud_out = nn.Linear(d, 1)
        self.pitch_out = nn.Linear(d, AUDIO_BINS)
        for layer in (self.modulation_out, self.video_out, self.ink_out, self.loud_out, self.pitch_out):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    @property
    def video_rows(self) -> int:
        """Video rows of the sequence: the sign's slots, then one ink row per frame (12)."""
        return self.config.slots + FRAMES

    def _layout(self, prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(row embeddings `[B, N, D]` re-added before every block, row tags `[N]` int64) for `[B, 5]` prompts."""
        cfg, b = self.config, prompt_ids.shape[0]
        digits, beeps = prompt_ids[:, :MAX_DIGITS], prompt_ids[:, MAX_DIGITS]
        text = torch.cat([self.char_embed(digits), self.beep_embed(beeps)[:, None]], dim=1) + self.text_pos[None]
        chars = column_char_ids(digits, cfg.slots, 1)  # [B, slots]: the digit drawn in each slot (0 = blank)
        slots = self.slot_embed[None] + self.char_embed(chars)
        frames = self.frame_embed[None].expand(b, -1, -1)
        video = torch.cat([slots, frames + self.ink_embed[None]], dim=1)
        audio = torch.cat([frames, self.pitch_embed[None, None].expand(b, 1, -1)], dim=1)
        rows = torch.cat([text + self.tag_embed[TEXT], video + self.tag_embed[VIDEO], audio + self.tag_embed[AUDIO]],
                         dim=1)
        tags = torch.tensor([TEXT] * TEXT_ROWS + [VIDEO] * self.video_rows + [AUDIO] * (FRAMES + 1), device=rows.device)
        return rows, tags

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, prompt_ids: torch.Tensor) -> torch.Tensor:
        """Predict v = ε − x0.

        Args:
            x: `[B, D]` flat latents, D = 16·32 + 8 + 8 + 16 = 544 (the sign, the ink per frame, the loudness per
                frame, the pitch profile).
            sigma: `[B]` noise level in [0, 1] (1 = pure noise).
            prompt_ids: `[B, 5]` int64: 4 left-packed digit ids (1..10 = '0'..'9', 0 = pad) and k (1..4; all 0 =
                the unconditional prompt).
        Returns:
            `[B, D]` velocity in x's dtype.
        Raises:
            ValueError: a latent of another size.
        """
        cfg, b = self.config, x.shape[0]
        n_video = SIGN_NUMEL + FRAMES
        if x.dim() != 2 or x.shape[1] != n_video + FRAMES + AUDIO_BINS:
            raise ValueError(f"latent shape {tuple(x.shape)} unsupported; expected [B, {n_video + FRAMES + AUDIO_BINS}]")
        sw = cfg.slot_width
        sign = x[:, :SIGN_NUMEL].reshape(b, LATENT_HEIGHT, cfg.slots, sw).permute(0, 2, 1, 3)
        ink = x[:, SIGN_NUMEL:n_video, None]
        loud, pitch = x[:, n_video:n_video + FRAMES, None], x[:, None, n_video + FRAMES:]
        layout, tags = self._layout(prompt_ids)
        tokens = torch.cat([torch.zeros(b, TEXT_ROWS, cfg.d_model, dtype=x.dtype, device=x.device),
                            self.video_in(sign.reshape(b, cfg.slots, self.video_patch)), self.ink_in(ink),
                            self.loud_in(loud), self.pitch_in(pitch)], dim=1)
        # AdaLN per modality tag: the σ embedding plus the tag's embedding, gathered to the rows
        cond = self.sigma_mlp(sigma_embedding(sigma, cfg.d_model).to(x.dtype))[:, None] + self.tag_embed[None]
        for block in self.blocks:
            tokens = _block(block, tokens + layout, cond, tags)
        shift, scale = self.modulation_out(F.silu(cond))[:, tags].chunk(2, dim=-1)
        out = self.norm_out(tokens) * (1 + scale) + shift
        first = TEXT_ROWS
        v_sign = self.video_out(out[:, first:first + cfg.slots])
        v_sign = v_sign.reshape(b, cfg.slots, LATENT_HEIGHT, sw).permute(0, 2, 1, 3).reshape(b, -1)
        v_ink = self.ink_out(out[:, first + cfg.slots:first + self.video_rows]).reshape(b, FRAMES)
        audio = out[:, first + self.video_rows:]
        v_loud = self.loud_out(audio[:, :FRAMES]).reshape(b, FRAMES)
        v_pitch = self.pitch_out(audio[:, FRAMES])
        return torch.cat([v_sign, v_ink, v_loud, v_pitch], dim=1)


def _block(block: Block, x: torch.Tensor, cond: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
    """`Block.forward` modulated per row: cond `[B, 3, D]` per modality tag, gathered to the rows by `tags` `[N]`
    (the modulation linear runs on 3 vectors per sample, not on every row)."""
    mod = block.modulation(F.silu(cond))[:, tags]  # [B, N, 6D]
    shift1, scale1, gate1, shift2, scale2, gate2 = mod.chunk(6, dim=-1)
    x = x + gate1 * block.attn(block.norm1(x) * (1 + scale1) + shift1)
    return x + gate2 * block.mlp(block.norm2(x) * (1 + scale2) + shift2)

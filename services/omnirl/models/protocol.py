"""The contract between the RL runtime and a generative model: `ModelAdapter`.

Everything the rollout engine and the actor know about a model goes through this protocol, so a
new model family is one new adapter and nothing else changes.

Time convention (docs/architecture.md §4): the runtime speaks σ, running from 1 (pure noise) to 0 (data),
x_σ = (1−σ)·x0 + σ·ε, and a velocity v = ε − x0. An adapter whose network was trained in
another convention declares it in `time_convention` and converts inside `velocity`, so callers
never see the native one:

- ``"sigma"``: the network takes σ (or σ·1000) and predicts ε − x0. No conversion.
- ``"data_progress"``: the network takes t = 1 − σ and predicts dx/dt = x0 − ε; the adapter feeds
  1 − σ and negates the output.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import torch
from torch import nn

Conditioning = dict[str, torch.Tensor]
"""Per-sample conditioning tensors, every value with the batch as its leading dimension.

Conditionings of different requests with the same latent shape can be concatenated key by key
(`torch.cat(dim=0)`), which the step-wise continuous-batching engine relies on.
"""

TimeConvention = Literal["sigma", "data_progress"]


@runtime_checkable
class ModelAdapter(Protocol):
    """A flow-matching model as the RL runtime sees it.

    Attributes:
        module: the trainable `nn.Module` (the actor optimises its parameters or LoRA on it;
            weight sync broadcasts its `state_dict` or adapter tensors).
        time_convention: the network's native time convention (see module docstring).
        lora_target_modules: names (suffixes) of the linear layers LoRA attaches to.
        latent_channels: C of the latent `[B, C, H, W]`.
    """

    module: nn.Module
    time_convention: TimeConvention
    lora_target_modules: list[str]
    latent_channels: int

    def tokenize(self, text: str) -> list[int]:
        """Prompt text → token ids. Called once, by the controller; ids then travel unchanged."""
        ...

    def latent_shape(self, prompt_ids: list[int]) -> tuple[int, ...]:
        """The latent shape `(C, H, W)` of one sample for this prompt (no batch dimension).

        The diffusers families also take `resolution=(height, width)` in pixels, a request's own
        size (`model.resolutions`); the engine passes it only for requests that carry one."""
        ...

    def sigma_grid(self, num_steps: int, latent_shape: tuple[int, ...], shift: float | None = None) -> torch.Tensor:
        """The σ grid `[num_steps + 1]` float32 (CPU), σ_0 = 1 down to σ_N = 0, that samples of this
        latent shape are denoised on: the one owner of the grid (rollout, validation, `omnirl eval`
        and the actor all ask here).

        `shift` None: the family's own grid (its scheduler's, for diffusers families). A number: the
        manifest's override `algorithm.sampling.shift`, `omnirl.algorithms.sigma_schedule(num_steps, shift)`.
        """
        ...

    def encode(self, prompt_ids: list[list[int]], device: torch.device | str = "cpu") -> Conditioning:
        """Token ids of B prompts → conditioning tensors with leading dimension B."""
        ...

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: Conditioning) -> torch.Tensor:
        """Predicted velocity v = ε − x0 in the σ convention.

        Args:
            x: latents `[B, C, H, W]`, float32.
            sigma: `[B]` float32 in [0, 1], 1 = noise.
            cond: conditioning with leading dimension B.
        Returns:
            `[B, C, H, W]` float32.
        """
        ...

    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Clean latents `[B, C, H, W]` → images `[B, H', W', 3]` uint8 (RGB)."""
        ...

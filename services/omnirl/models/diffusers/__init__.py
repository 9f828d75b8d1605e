"""Model adapters for diffusers model families (GPU path): SD3/SD3.5, FLUX.1 and Qwen-Image.

Importing this package does not import diffusers or transformers; they are imported when an
adapter is loaded (`SD3Adapter.load`, `FluxAdapter.load`, `QwenImageAdapter.load`) or a LoRA is saved.

Public API:
- `SD3Adapter`, `FluxAdapter`, `QwenImageAdapter`: `ModelAdapter` implementations (constructor from in-memory
  components; `load(path, device, dtype, **kwargs)` from a local diffusers pipeline directory).
- `save_lora(adapter, out_dir)`: LoRA in diffusers' format (`pipeline.load_lora_weights`).
- `pack_latents` / `unpack_latents`: the 2x2 latent packing of Qwen-Image and FLUX.
"""

from omnirl.models.diffusers.flux import FluxAdapter
from omnirl.models.diffusers.lora_io import diffusers_lora_state, save_lora
from omnirl.models.diffusers.qwen_image import QwenImageAdapter, pack_latents, unpack_latents
from omnirl.models.diffusers.sd3 import SD3Adapter

__all__ = ["FluxAdapter", "QwenImageAdapter", "SD3Adapter", "diffusers_lora_state", "pack_latents", "save_lora", "unpack_latents"]

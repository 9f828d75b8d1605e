"""The built-in OCR demo model: a small DiT that draws digit strings (1×32×64 or 1×32×128 pixels).

Modules: `render` (training images in the fixed slot layout), `model` (the network), `adapter`
(`DigitsAdapter`, `load_digits_adapter`, `save_digits_checkpoint`), `pretrain` (rectified-flow
pretraining, `omnirl pretrain`), `prompts` (the shipped prompt sets). `weights/` holds the shipped
checkpoint; PROVENANCE.md says how it was made and what it scores.
"""

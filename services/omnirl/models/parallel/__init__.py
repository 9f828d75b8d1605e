"""Models that do not fit one device: one replica's ranks working on one model (docs/parallel.md).

- `ulysses`: sequence (context) parallelism of a diffusers transformer through diffusers' own API
  (`ContextParallelConfig`, `enable_parallelism`), uneven token counts included, and the gradient
  reduction a trainer needs.
- `encoder_tp`: tensor parallelism of a transformers text encoder with DTensor plans, and
  `PromptEmbeddingCache` (a prompt encoded once per step).
- `layout`: a job's `parallel` degrees against the model's own config (heads divisible, an encoder
  architecture with a plan), read from the model directory alone (no torch).
- `mesh`: the device meshes of one replica's ranks.
"""

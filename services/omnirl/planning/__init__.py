"""`omnirl plan`: what each role of a job holds on one device under its `parallel` layout, against the device's
memory, and which layout would fit (docs/parallel.md, "Memory plan").

- `components`: parameter counts and bytes of a model directory's components, built from their configs on the
  meta device (exact counts, no weights read).
- `activations`: a transformer's activation bytes per token per layer, from its config (meta-device forward).
- `tokens`: tokens per sample of a job (frames × size, audio seconds, text) per family.
- `memory`: the per-device table of every role, the fit, the layouts that would fit.
- `cli`: the command.
"""

"""Ulysses sequence parallelism of a diffusers transformer, through diffusers' context-parallel API.

`enable_ulysses(transformer, mesh)` calls `ModelMixin.enable_parallelism(ContextParallelConfig(ulysses_degree=U,
mesh=...))`: diffusers' hooks split the model's token sequence over the U ranks of the mesh's `ulysses`
dimension where the model's `_cp_plan` says (its first block's input, its RoPE tables), the attention
processors exchange heads for tokens with an all-to-all around each attention (DeepSpeed-Ulysses,
arXiv 2309.14509), and the output projections gather the tokens back, so every rank returns the full
output. No all-to-all is written here: diffusers' own are used.

Three things diffusers 0.42.1 lacks, added here without touching its algorithm:

- **Uneven token counts.** A sequence whose length does not divide by U (a Wan video of 5 latent frames
  at 3×2 patches is 30 tokens; MiniMax-H3's packed rows are any length) takes diffusers' "Ulysses Anything"
  path (`ulysses_anything=True`: `tensor_split` shards, variable-size all-to-all), whose attention has no
  backward in 0.42.1. `UlyssesAnythingAttention` is that same forward, saving what the attention's backward
  needs, with the backward it lacks: the output's all-to-all reversed (the query/key/value exchange's), the
  backend's own `backward_op`, and the query/key/value exchange reversed (the output's). The class replaces
  diffusers' in `attention_dispatch` (where `_templated_context_parallel_attention` looks it up at each call).
- **gloo.** diffusers gathers the unequal shards of an uneven sequence with one `all_gather` of unequal
  tensors, which NCCL takes and gloo refuses; `_all_gather_uneven` pads, gathers and trims instead.
- **CPU.** `_resolve_parallel_config` takes the device index `rank % torch.accelerator.device_count()`, which
  divides by zero on a machine without an accelerator; `enable_ulysses` passes the mesh and answers 1 there
  for the duration of the call (gloo then runs every collective).
- **LTX-2's plan.** It splits the video tokens only: its audio stream runs whole on every rank (each rank's
  backward would hold the whole audio gradient, a sum over ranks counting it U times), and the RoPE tables of
  its audio↔video cross-attentions stay whole while the video queries are split (the forward fails).
  `_plan_overrides()` gives it a plan that also splits the audio tokens and those tables and gathers the audio
  output, so every output the loss reads comes through a gather. Its text attention mask, repeated per head,
  is cut to each rank's heads after the exchange.

Gradients (`reduce_gradients`): each rank back-propagates only its own tokens (diffusers' gather has the
split as its backward), so the full-sequence gradient is the SUM of the ranks' gradients over the Ulysses
group (measured: a tiny Wan's within 1.5e-8 of one process, docs/parallel.md). A trainer that averages over
every rank (FSDP2's reduce-scatter) must scale its loss by U instead (`loss_scale`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from omnirl.models.parallel._shims import an_accelerator_count

ULYSSES_DIMS = ("ring", "ulysses")
"""The mesh dimension names diffusers' `ContextParallelConfig` indexes (ring 1 here: Ring attention needs a
kernel that returns the log-sum-exp, which torch's SDPA on the CPU does not)."""


def _plan_overrides() -> dict[str, dict]:
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    return {
        # the model's own plan (video and text tokens split at the top, RoPE outputs split, video output gathered)
        # plus its audio stream (audio tokens split, audio RoPE split, audio output gathered) and the RoPE of the
        # audio<->video cross-attentions, whose per-token tables the model's plan leaves whole (a 2-rank replica
        # failed there: "size of tensor a (4) must match the size of tensor b (8)")
        "LTX2VideoTransformer3DModel": {
            "": {
                "hidden_states": ContextParallelInput(split_dim=1, expected_dims=3, split_output=False),
                "encoder_hidden_states": ContextParallelInput(split_dim=1, expected_dims=3, split_output=False),
                "encoder_attention_mask": ContextParallelInput(split_dim=1, expected_dims=2, split_output=False),
                "audio_hidden_states": ContextParallelInput(split_dim=1, expected_dims=3, split_output=False),
            },
            "rope": {
                0: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True),
                1: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True),
            },
            **{rope: {0: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True),
                      1: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)}
               for rope in ("audio_rope", "cross_attn_rope", "cross_attn_audio_rope")},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
            "audio_proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
        },
    }


def ulysses_mesh(degree: int, device_type: str, *, data_parallel: int = 1):
    """The `(dp, ring=1, ulysses=degree)` DeviceMesh over every rank of the default group, rank
    `d·degree + u` at `(d, 0, u)`: consecutive ranks share a sample (on one node, where the all-to-all is
    fastest). A collective: every rank calls it.

    Raises:
        ValueError: the default group's size is not `data_parallel × degree`.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if dist.get_world_size() != data_parallel * degree:
        raise ValueError(f"{data_parallel} data-parallel ranks × Ulysses {degree} need {data_parallel * degree} "
                         f"ranks, the process group has {dist.get_world_size()}")
    return init_device_mesh(device_type, (data_parallel, 1, degree), mesh_dim_names=("dp", *ULYSSES_DIMS))


def enable_ulysses(transformer: nn.Module, mesh) -> None:
    """Split `transformer`'s tokens over the mesh's `ulysses` dimension (diffusers' `enable_parallelism`).

    Args:
        transformer: a diffusers `ModelMixin` with a context-parallel plan (`_cp_plan`, or one of
            `_plan_overrides`), its attention on a backend that supports context parallelism (torch's SDPA,
            diffusers' default).
        mesh: a DeviceMesh with dimensions `("ring", "ulysses")` (`ulysses_mesh`), or one of several dimensions
            holding those two (an actor's data-parallel × Ulysses mesh).
    Raises:
        ValueError: the model has no plan, or its attention heads do not divide by the degree (Ulysses gives
            each rank heads / degree heads; `layout.check_layout` says so before any role starts).
        RuntimeError: torch.distributed not initialised, or parallelism already enabled on this model.
    """
    from diffusers.models._modeling_parallel import ContextParallelConfig

    degree = mesh["ulysses"].size()
    _check_heads(transformer, degree)
    _install_anything_backward()
    plan = _plan_overrides().get(type(transformer).__name__)
    if plan is None and getattr(transformer, "_cp_plan", None) is None:
        raise ValueError(f"{type(transformer).__name__} has no context-parallel plan (_cp_plan): Ulysses cannot "
                         "split its tokens")
    # the anything path is taken for every length: its shards are the even ones when the length divides
    config = ContextParallelConfig(ulysses_degree=degree, ulysses_anything=True, mesh=mesh)
    with an_accelerator_count():
        transformer.enable_parallelism(config=config, cp_plan=plan)


def _check_heads(transformer: nn.Module, degree: int) -> None:
    config = getattr(transformer, "config", {})
    for key, heads in sorted(dict(config).items()):
        if key.endswith("num_attention_heads") and isinstance(heads, int) and heads % degree:
            raise ValueError(f"{key} = {heads} does not divide by the Ulysses degree {degree}: each rank takes "
                             "heads / degree heads of every attention")


def reduce_gradients(module: nn.Module, group: dist.ProcessGroup | None = None) -> int:
    """Sum every parameter's gradient over the Ulysses `group` (a collective: every rank of it calls it).

    Each rank holds the gradient of its own tokens only; their sum is the full sequence's (module docstring).
    Returns:
        The number of gradients reduced.
    """
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if grads:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    return len(grads)


def loss_scale(degree: int) -> float:
    """The factor a loss takes when the gradients are AVERAGED over every rank (FSDP2's reduce-scatter) and
    `degree` ranks share each sample as Ulysses ranks: the mean over data-parallel ranks of the sum over
    Ulysses ranks is `degree` × the mean over all (gloo has no PREMUL_SUM for FSDP2's own divide factor)."""
    return float(degree)


_INSTALLED = False


def _install_anything_backward() -> None:
    """Replace diffusers' forward-only `TemplatedUlyssesAnythingAttention` by `UlyssesAnythingAttention` (once)."""
    global _INSTALLED
    if _INSTALLED:
        return
    from diffusers.hooks import context_parallel
    from diffusers.models import attention_dispatch

    attention_dispatch.TemplatedUlyssesAnythingAttention = _anything_attention_class()
    context_parallel._all_gather_anything = _all_gather_uneven
    _INSTALLED = True


def _all_gather_uneven(tensor: torch.Tensor, dim: int, group: dist.ProcessGroup) -> torch.Tensor:
    """Every rank's `tensor` concatenated along `dim` in rank order, sizes along `dim` may differ: padded to the
    longest, all-gathered, trimmed. diffusers' own gathers unequal tensors, which NCCL takes and gloo refuses
    ("invalid tensor size"); this one runs on both (what it returns is the same)."""
    from diffusers.models._modeling_parallel import gather_size_by_comm

    tensor = tensor.contiguous()
    sizes = gather_size_by_comm(tensor.shape[dim], group)
    longest = max(sizes)
    if tensor.shape[dim] < longest:
        pad = [0, 0] * (tensor.dim() - 1 - dim % tensor.dim()) + [0, longest - tensor.shape[dim]]
        tensor = torch.nn.functional.pad(tensor, pad).contiguous()
    parts = [torch.empty_like(tensor) for _ in sizes]
    dist.all_gather(parts, tensor, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes, strict=True)], dim=dim)


def _anything_attention_class() -> type:
    """`UlyssesAnythingAttention` (built on first use: diffusers is imported inside functions only)."""
    from diffusers.models.attention_dispatch import (
        all_to_all_single_any_o_async,
        all_to_all_single_any_qkv_async,
        ulysses_anything_metadata,
    )

    class UlyssesAnythingAttention(torch.autograd.Function):
        """diffusers' Ulysses-Anything attention (variable-size all-to-all) with a backward.

        Forward: query/key/value `[B, S_local, H, D]` → all-to-all → `[B, S, H/U, D]` (every rank's tokens,
        its heads) → the backend's `forward_op` (saving its inputs) → all-to-all → `[B, S_local, H, D]`.
        Backward: the gradient `[B, S_local, H, D]` takes the query/key/value exchange (it is the output
        exchange's reverse) → the backend's `backward_op` → the output exchange (the query/key/value
        exchange's reverse), giving each rank the gradients of its own tokens, all heads.
        A mask over the local keys is all-gathered over the ranks' keys, as diffusers' forward does, and a
        mask repeated per head (LTX-2's) keeps this rank's heads; `return_lse` is not supported (torch's SDPA
        does not return it).
        """

        @staticmethod
        def forward(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                    forward_op, backward_op, _parallel_config=None, **kwargs):
            if return_lse:
                raise ValueError("Ulysses attention of uneven lengths returns no log-sum-exp here")
            group = _parallel_config.context_parallel_config._ulysses_mesh.get_group()
            if attn_mask is not None and attn_mask.shape[-1] == key.shape[1]:
                attn_mask = _gather_mask(attn_mask, group)  # a mask over this rank's keys: over every rank's
            if attn_mask is not None and attn_mask.dim() == 4 and attn_mask.shape[1] == query.shape[2] > 1:
                # a mask repeated per head (LTX-2's `prepare_attention_mask`): this rank's heads after the exchange
                local = query.shape[2] // dist.get_world_size(group)
                attn_mask = attn_mask.narrow(1, dist.get_rank(group) * local, local)
            ctx.forward_op, ctx.backward_op, ctx._parallel_config = forward_op, backward_op, _parallel_config
            meta = ulysses_anything_metadata(query)
            kv_meta = ulysses_anything_metadata(key)
            if query.shape[2] % dist.get_world_size(group):
                raise ValueError(f"{query.shape[2]} heads do not divide by the Ulysses degree "
                                 f"{dist.get_world_size(group)}")
            ctx.q_meta, ctx.kv_meta, ctx.group = meta, kv_meta, group
            q = all_to_all_single_any_qkv_async(query, group, **meta)()
            k = all_to_all_single_any_qkv_async(key, group, **kv_meta)()
            v = all_to_all_single_any_qkv_async(value, group, **kv_meta)()
            out = forward_op(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, False, _save_ctx=True,
                             _parallel_config=_parallel_config)
            return all_to_all_single_any_o_async(out, group, **meta)()

        @staticmethod
        def backward(ctx, grad_out, *args):
            group = ctx.group
            # the output's exchange reversed = the query exchange: [B, S_local, H, D] → [B, S, H/U, D]
            grad = all_to_all_single_any_qkv_async(grad_out.contiguous(), group, **ctx.q_meta)()
            grad_q, grad_k, grad_v, *_ = ctx.backward_op(ctx, grad)
            # the query/key/value exchange reversed = the output exchange: [B, S, H/U, D] → [B, S_local, H, D]
            grad_q = all_to_all_single_any_o_async(grad_q.contiguous(), group, **ctx.q_meta)()
            grad_k = all_to_all_single_any_o_async(grad_k.contiguous(), group, **ctx.kv_meta)()
            grad_v = all_to_all_single_any_o_async(grad_v.contiguous(), group, **ctx.kv_meta)()
            return grad_q, grad_k, grad_v, None, None, None, None, None, None, None, None, None

    return UlyssesAnythingAttention


def _gather_mask(mask: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """A mask over this rank's keys (last dim) → over every rank's, in rank order (diffusers' forward does the
    same: padded to the longest rank's, all-gathered, trimmed)."""
    from diffusers.models._modeling_parallel import gather_size_by_comm

    sizes = gather_size_by_comm(mask.shape[-1], group)
    longest = max(sizes)
    padded = torch.nn.functional.pad(mask, (0, longest - mask.shape[-1])) if mask.shape[-1] < longest else mask
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p[..., :n] for p, n in zip(parts, sizes, strict=True)], dim=-1)

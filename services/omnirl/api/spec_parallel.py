"""How one replica of a model role is laid out over its devices (`spec.roles.rollout.parallel`,
`spec.roles.actor.parallel`), and the GPU counts that follow from it (docs/parallel.md).

A rollout replica is a gang of `ulysses × tensor` ranks (one process per device) that generates together:
Ulysses sequence parallelism splits each sample's tokens over `ulysses` ranks (diffusers' context-parallel
API), tensor parallelism splits the DiT's weights over `tensor` ranks, and the text encoder is split over
`encoderTensor` of the replica's ranks. The actor is `replicas` data-parallel ranks, each a gang of `ulysses`
ranks sharing its micro-batches; FSDP2 shards the weights over every actor rank (`replicate: 1`), or HSDP
over `replicate` groups that each hold one sharded copy.

Torch-free (the operator and `omnirl validate` read it). What needs the model's config (heads divisible by
a degree) is checked where the config is read: `omnirl validate` on a model directory of this machine and
the roles at start (`omnirl.models.parallel.check_layout`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from omnirl.api._base import CelRule, SpecModel
from omnirl.api.errors import FieldProblem
from omnirl.api.extensions import families_with

CONTEXT_PARALLEL_FAMILIES: tuple[str, ...] = families_with("parallel", "ulysses")
"""Families that declare `parallel=("ulysses", ...)` (`register_family`): their diffusers transformer has a
context-parallel plan (`_cp_plan`, diffusers 0.42.1), so `parallel.ulysses > 1` can split their tokens; SD3 and
the built-in models have none."""
TENSOR_PARALLEL_FAMILIES: tuple[str, ...] = families_with("parallel", "tensor")
"""Families that declare `parallel=(..., "tensor")`: their diffusers transformer has a tensor-parallel plan
(`_tp_plan`, diffusers 0.42.1) for `roles.rollout.parallel.tensor > 1`; Wan, LTX-2 and MiniMax-H3 have none there
(vLLM-Omni's TP2 of H3 is its own)."""
MAX_DEGREE = 64
GPU_MEMORY_GIB: dict[str, float] = {
    "h100-80gb": 79.6, "h200": 140.4, "b200": 179.1, "a100-80gb": 80.0, "a100-40gb": 40.0, "l40s": 45.0,
    "ascend-910b": 64.0,
}
"""Memory of one device by product, GiB (nvidia-smi's total memory, which `torch.cuda.get_device_properties`
reports: H100 SXM 81559 MiB, H200 143771 MiB, B200 183359 MiB, A100 81920 / 40960 MiB, L40S 46068 MiB; Ascend
910B 64 GB HBM): what `omnirl plan` fits a replica into (`accelerator.product`)."""
DEFAULT_PRODUCT: dict[str, str] = {"nvidia": "h100-80gb", "ascend": "ascend-910b"}
"""The product a plan assumes when `accelerator.product` is not written."""


class ReplicaLayoutSpec(SpecModel):
    """The degrees both model roles take: Ulysses and tensor parallelism of the DiT, tensor parallelism of
    the text encoder."""

    ulysses: int = Field(1, ge=1, le=MAX_DEGREE, description="Ulysses sequence-parallel degree of the DiT: each "
                         "sample's tokens are split over this many ranks, which exchange heads for attention "
                         "(all-to-all; diffusers' context-parallel API). The model's attention heads must be "
                         "divisible by it. Families: " + ", ".join(CONTEXT_PARALLEL_FAMILIES) + ".")
    tensor: int = Field(1, ge=1, le=MAX_DEGREE, description="Tensor-parallel degree of the DiT (rollout only): its "
                        "linear layers are split column- and row-wise over this many ranks (diffusers' tensor-"
                        "parallel plan). Not together with ulysses > 1 (diffusers 0.42.1 refuses the two in one "
                        "model). Families: " + ", ".join(TENSOR_PARALLEL_FAMILIES) + ".")
    encoderTensor: int = Field(1, ge=1, le=MAX_DEGREE, description="Tensor-parallel degree of the text encoder "
                               "(\"ETP\"): its attention and MLP are split over this many of the replica's ranks "
                               "(DTensor colwise/rowwise plans); it must divide the replica's ranks, and the "
                               "encoder's heads must divide by it.")

    @property
    def ranks(self) -> int:
        """Ranks (devices, one process each) of one replica's DiT gang: `ulysses × tensor`."""
        return self.ulysses * self.tensor

    def _check_encoder(self, role: str) -> None:
        if self.ranks % self.encoderTensor:
            valid = [d for d in range(1, self.ranks + 1) if self.ranks % d == 0]
            raise FieldProblem("encoderTensor", self.encoderTensor, f"must divide the {role} replica's "
                               f"ranks, ulysses × tensor = {self.ulysses} × {self.tensor} = {self.ranks} (the text "
                               f"encoder is split over the replica's own devices); valid: {valid}")


class RolloutLayoutSpec(ReplicaLayoutSpec):
    """One rollout replica: `ulysses × tensor` ranks that generate each batch together."""

    podsPerReplica: int = Field(1, ge=1, le=MAX_DEGREE, description="Kubernetes: 1 puts a replica's ranks in one "
                                "pod on one node (accelerator.count = ulysses × tensor devices); N > 1 makes the "
                                "replica a gang of N pods across nodes (accelerator.count = ulysses × tensor / N "
                                "each) that is admitted whole or not at all, its ranks meeting at a headless "
                                "Service. Locally (omnirl run) every rank is a process either way.")
    cel_rules = (
        CelRule("{ulysses} == 1 || {tensor} == 1", "spec.roles.rollout.parallel.tensor: cannot be combined with "
                "ulysses > 1 (diffusers 0.42.1 refuses context and tensor parallelism in one model); keep one of the "
                "two at 1", ".tensor"),
        CelRule("({ulysses} * {tensor}) % {encoderTensor} == 0", "spec.roles.rollout.parallel.encoderTensor: must "
                "divide the replica's ranks, ulysses × tensor (the text encoder is split over the replica's own "
                "devices)", ".encoderTensor"),
        CelRule("({ulysses} * {tensor}) % {podsPerReplica} == 0", "spec.roles.rollout.parallel.podsPerReplica: must "
                "divide the replica's ranks, ulysses × tensor (every pod of the gang holds as many)", ".podsPerReplica"),
    )

    @model_validator(mode="after")
    def _check(self) -> RolloutLayoutSpec:
        if self.ulysses > 1 and self.tensor > 1:
            raise FieldProblem("tensor", self.tensor, f"cannot be combined with ulysses {self.ulysses} "
                               "(diffusers 0.42.1 refuses context and tensor parallelism in one model): keep one "
                               "of the two at 1")
        self._check_encoder("rollout")
        if self.ranks % self.podsPerReplica:
            valid = [d for d in range(1, self.ranks + 1) if self.ranks % d == 0]
            raise FieldProblem("podsPerReplica", self.podsPerReplica, f"must divide the replica's ranks, "
                               f"ulysses × tensor = {self.ranks} (every pod of the gang holds as many); valid: {valid}")
        return self

    @property
    def ranks_per_pod(self) -> int:
        """Ranks (devices) each pod of a replica holds: `ranks / podsPerReplica`."""
        return self.ranks // self.podsPerReplica


class ActorLayoutSpec(ReplicaLayoutSpec):
    """The actor: `roles.actor.replicas` data-parallel ranks, each a gang of `ulysses` ranks."""

    replicate: int = Field(1, ge=1, le=1024, description="HSDP: the actor's ranks form this many groups, each "
                           "holding one FSDP-sharded copy of the weights (gradients all-reduced between groups); "
                           "1 = plain FSDP2 over every actor rank. Must divide roles.actor.replicas.")
    cel_rules = (
        CelRule("{tensor} == 1", "spec.roles.actor.parallel.tensor: must be 1: the actor shards the DiT with FSDP2 "
                "(and ulysses for long sequences), not tensor parallelism", ".tensor"),
        CelRule("({ulysses} * {tensor}) % {encoderTensor} == 0", "spec.roles.actor.parallel.encoderTensor: must "
                "divide the actor replica's ranks, ulysses (the text encoder is split over a replica's own devices)",
                ".encoderTensor"),
    )

    @model_validator(mode="after")
    def _check(self) -> ActorLayoutSpec:
        if self.tensor != 1:
            raise FieldProblem("tensor", self.tensor, "must be 1: the actor shards the DiT with FSDP2 over "
                               "its ranks (parallel.replicate for HSDP) and splits long sequences with "
                               "parallel.ulysses, not with tensor parallelism")
        self._check_encoder("actor")
        return self


Role = Literal["rollout", "actor"]


def actor_world(replicas: int, layout: ActorLayoutSpec) -> int:
    """Actor ranks (devices): `replicas` data-parallel ranks × `ulysses` ranks each."""
    return replicas * layout.ranks


def fsdp_degree(replicas: int, layout: ActorLayoutSpec) -> int:
    """Ranks one FSDP-sharded copy of the actor's weights is spread over: every actor rank, or with HSDP
    each of `replicate` groups'."""
    return actor_world(replicas, layout) // layout.replicate

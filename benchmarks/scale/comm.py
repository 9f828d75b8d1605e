"""Collective and weight-sync costs: the α-β model NCCL itself uses, with its published constants.

Sources:

- Formulas: NVIDIA/nccl-tests ``doc/PERFORMANCE.md``: a ring broadcast moves S bytes at the root's
  bandwidth B, t = S / B whatever the ranks (pipelined; busbw = algbw); an all-gather or a
  reduce-scatter t = S·(n−1)/(n·B); an all-reduce t = 2·S·(n−1)/(n·B).
- Latencies: NVIDIA/nccl ``src/graph/tuning.cc`` (2.2x): base latency of the Simple protocol 8.4 µs;
  per step of a ring, 3.4 µs over NVLink and 14 µs over the network (``hwLat``); a ring broadcast takes
  n steps, an all-gather n − 1 (of which nodes − 1 cross the network).
- Bandwidths: 8 × H100 SXM with NVLink 4 (450 GB/s one way per GPU): nccl-tests bus bandwidth
  460–480 GB/s for an all-reduce on one node (docs.alayanew.com, "NCCL-tests in practice",
  2026-05-06); across nodes with 8 × 400 Gb/s ConnectX-7 per node, 350 GB/s bus bandwidth over 8 nodes
  (uccl-project/uccl issue #205, 2025-07-25). The models below take 360 GB/s on one node (a ring
  without NVLink SHARP) and 350 GB/s across nodes (`NCCL_H100`).
- The weight sync's own costs are measured: one LoRA sync of SD3.5-M (47.8 MB, 486 tensors) took
  0.23 s over CUDA IPC on one H200 and 0.29 s over NCCL on two (`benchmarks/results/
  2026-12-01-nvidia-h200.json` ``weight_sync_one_gpu``, `2026-11-29-nvidia-h200.json`
  ``sync_nccl_2gpu``): manifest, checksums, bind, acks — bandwidth is < 1 ms of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Fabric:
    """The α-β constants of one interconnect.

    Attributes:
        per_node: devices one node holds (a collective within it stays on `busbw_node`).
        busbw_node, busbw_net: bus bandwidth (bytes/s) within a node and across nodes.
        base_s: a collective's base latency; hop_node_s, hop_net_s: per ring step within / across nodes.
    """

    name: str
    per_node: int
    busbw_node: float
    busbw_net: float
    base_s: float
    hop_node_s: float
    hop_net_s: float

    def nodes(self, ranks: int) -> int:
        """Nodes `ranks` devices span (packed, `per_node` each)."""
        return max(1, math.ceil(ranks / self.per_node))

    def busbw(self, ranks: int) -> float:
        """Bus bandwidth (bytes/s) of a collective over `ranks` devices."""
        return self.busbw_node if self.nodes(ranks) == 1 else self.busbw_net

    def ring_latency(self, steps: int, ranks: int) -> float:
        """Latency (s) of a ring of `steps` steps over `ranks` devices: base + node hops + network hops."""
        inter = self.nodes(ranks) - 1
        return self.base_s + max(steps - inter, 0) * self.hop_node_s + min(inter, steps) * self.hop_net_s


NCCL_H100 = Fabric("nccl-h100", 8, busbw_node=360e9, busbw_net=350e9, base_s=8.4e-6, hop_node_s=3.4e-6,
                   hop_net_s=14e-6)
"""8 × H100/H200 SXM per node, NVLink 4, 8 × 400 Gb/s per node (the module docstring's sources)."""
GLOO_LOOPBACK = Fabric("gloo-loopback", 10**6, busbw_node=0.28e9, busbw_net=0.28e9, base_s=100e-6,
                       hop_node_s=50e-6, hop_net_s=50e-6)
"""Processes of one CPU host over gloo: 0.28 GB/s is the measured gloo weight sync through host memory
(`2026-11-29-nvidia-h200.json` ``sync``, full weights); the latencies are assumptions (a loopback TCP
round trip measured 23 µs, `benchmarks.scale.measure`, and gloo adds its own)."""


def broadcast_s(nbytes: float, ranks: int, fabric: Fabric = NCCL_H100) -> float:
    """Ring broadcast of `nbytes` to `ranks` (root included): S / B + n steps of latency; 0 for one rank."""
    if ranks <= 1:
        return 0.0
    return nbytes / fabric.busbw(ranks) + fabric.ring_latency(ranks, ranks)


def all_gather_s(nbytes: float, ranks: int, fabric: Fabric = NCCL_H100) -> float:
    """All-gather (or reduce-scatter) of `nbytes` in all over `ranks`: S·(n−1)/(n·B) + (n−1) steps; 0 for one."""
    if ranks <= 1:
        return 0.0
    return nbytes * (ranks - 1) / (ranks * fabric.busbw(ranks)) + fabric.ring_latency(ranks - 1, ranks)


def all_reduce_s(nbytes: float, ranks: int, fabric: Fabric = NCCL_H100) -> float:
    """Ring all-reduce of `nbytes` over `ranks`: 2·S·(n−1)/(n·B) + 2(n−1) steps; 0 for one rank."""
    if ranks <= 1:
        return 0.0
    return 2 * nbytes * (ranks - 1) / (ranks * fabric.busbw(ranks)) + fabric.ring_latency(2 * (ranks - 1), ranks)


def tree_depth(leaves: int, fanout: int = 2) -> int:
    """Levels below the root of the shallowest `fanout`-ary tree holding the root and `leaves` receivers.

    A complete f-ary tree of depth d holds (f^(d+1) − 1)/(f − 1) nodes, so the depth is the least d
    with that ≥ leaves + 1; binary: ⌈log2(leaves + 2)⌉ − 1 (1 receiver: 1 level, 2: 1, 3: 2, 6: 2, 7: 3).

    Raises:
        ValueError: leaves < 0 or fanout < 2.
    """
    if leaves < 0 or fanout < 2:
        raise ValueError(f"leaves must be >= 0 and fanout >= 2, got {leaves}, {fanout}")
    m = leaves + 1
    depth, capacity, width = 0, 1, 1
    while capacity < m:
        width *= fanout
        capacity += width
        depth += 1
    return depth


NIC_BPS = 50e9
"""Bytes/s of one GPU's network port (400 Gb/s ConnectX-7, line rate): a point-to-point copy between nodes."""

SYNC_MODES = ("ring", "ring-batched", "tree")


@dataclass(frozen=True)
class WeightSync:
    """One weight sync from actor rank 0 to `receivers` rollout replicas (`omnirl.weight_sync`).

    Attributes:
        fixed_s: measured cost of one sync to one receiver (manifest, checksums, bind, ack).
        store_rtt_s: one TCPStore request from the actor (a round trip to its own store server).
        store_ops_per_receiver: sequential store requests the actor makes per receiver and sync:
            delete the old ack, set the assignment, check ready (≥ 1 poll), check, get and delete the
            ack, delete the ready key (`weight_sync/sender.py::_announce`, `_collect_acks`): 7.
        mode: ``ring`` (today: one NCCL ring broadcast, the store requests one receiver at a time),
            ``ring-batched`` (the same broadcast, each phase's store requests batched into one round
            trip: ``multi_set``/``multi_get``), ``tree`` (a binary tree of point-to-point copies at
            `NIC_BPS`, one batched store round per level).
    """

    fixed_s: float
    store_rtt_s: float
    store_ops_per_receiver: int = 7
    mode: str = "ring"
    fabric: Fabric = NCCL_H100

    def __post_init__(self) -> None:
        if self.mode not in SYNC_MODES:
            raise ValueError(f"weight sync mode {self.mode!r}: expected one of {SYNC_MODES}")

    def seconds(self, nbytes: float, receivers: int) -> float:
        """Seconds one sync of `nbytes` to `receivers` takes (0 without receivers).

        - ring: fixed + ops·receivers·rtt + `broadcast_s(nbytes, receivers + 1)`;
        - ring-batched: fixed + ops·rtt + `broadcast_s(nbytes, receivers + 1)`;
        - tree: fixed + depth·(ops·rtt + nbytes / NIC_BPS + a network hop), depth = `tree_depth(receivers)`.
        """
        if receivers <= 0:
            return 0.0
        if self.mode == "tree":
            depth = tree_depth(receivers)
            return self.fixed_s + depth * (self.store_ops_per_receiver * self.store_rtt_s + nbytes / NIC_BPS
                                           + self.fabric.hop_net_s)
        per = receivers if self.mode == "ring" else 1
        return (self.fixed_s + self.store_ops_per_receiver * per * self.store_rtt_s
                + broadcast_s(nbytes, receivers + 1, self.fabric))

"""Every random draw's seed: one derivation, `derive`, with a real hash.

    seed = int.from_bytes(blake2b(pack, digest_size=8, person=b"omnirl-seed-v1"), "little") & (2**63 - 1)
    pack = purpose (16 bytes, ASCII, NUL-padded) + job_seed, step, group, sample, attempt, draw
           (six signed 64-bit little-endian integers) + key (16 bytes: BLAKE2b-128 of the UTF-8 key,
           or zeros when the key is empty)

The packing has a fixed width, so no two argument tuples share a message (unlike sums such as
`index + 7·attempt`, which collide), and BLAKE2b spreads the messages over 63 bits (a torch
`Generator`, `random.Random` and NumPy all take it): a job of 3·10⁶ samples collides with
probability ≈ n²/2⁶⁴ ≈ 5·10⁻⁷. The personalization string versions the scheme: changing it (or
the packing) changes every seed, and with it every golden curve.

Purposes (`PURPOSES`) and the arguments each uses:

| purpose | arguments | drawn by |
| --- | --- | --- |
| `sample` | step, group (prompt index), sample (index), attempt | a training sample's noise (rollout engine) |
| `window` | step | FlowGRPO's SDE window (`algorithms/window.py::select_window`) |
| `prompts` | draw (epoch) | the training prompt order (`controller/data.py`) |
| `validation` | sample (prompt index) | validation and `omnirl eval` noise, seeded by `validation.seed` |
| `minibatch` | step | the actor's minibatch order |
| `lora-init` | — | the LoRA adapters' initial A (the actor; every rank the same, every run of the seed the same) |
| `nft` | step, group, attempt, draw | DiffusionNFT's (σ, ε) of a group's draw |
| `awm-sigma` | step, group, attempt | AWM's σ draws of a group |
| `awm-eps` | step, group, sample, attempt | AWM's ε draws (sample = -1: the group's shared ε) |
| `judge` | key (the sample id), job_seed 0 | a VLM judge request's `seed` (`reward/vlm.py`, low 31 bits) |

Not job draws, so not derived here: `omnirl pretrain` and the shipped prompt sets
(`models/digits/pretrain.py`, `prompts.py`) seed their own generators from their `--seed`, and a
fresh model's parameter initialisation uses torch's global generator.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Annotated

from pydantic import AfterValidator

PURPOSES = ("sample", "window", "prompts", "validation", "minibatch", "nft", "awm-sigma", "awm-eps", "judge", "lora-init")
PERSON = b"omnirl-seed-v1"
MASK = (1 << 63) - 1
_PACK = struct.Struct("<16s6q16s")
_NO_KEY = bytes(16)
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)
"""What `derive` takes as a seed (and `spec.seed`, `spec.validation.seed` may be): a signed 64-bit integer."""


def _in_seed_range(value: int) -> int:
    # a validator, not ge/le: the CRD would carry ±2**63 as bounds, which YAML tools (helm) turn into floats
    if not SEED_RANGE[0] <= value <= SEED_RANGE[1]:
        raise ValueError(f"must be a signed 64-bit integer, {SEED_RANGE[0]} .. {SEED_RANGE[1]} (what derive hashes)")
    return value


Seed = Annotated[int, AfterValidator(_in_seed_range)]
"""The type of `spec.seed` and `spec.validation.seed`: an int in `SEED_RANGE`."""


def derive(job_seed: int, purpose: str, *, step: int = 0, group: int = 0, sample: int = 0, attempt: int = 0,
           draw: int = 0, key: str = "") -> int:
    """The seed in [0, 2⁶³) of one random draw (the module docstring gives the formula).

    Args:
        job_seed: the job's seed (`spec.seed`, or `validation.seed` for validation/eval noise).
        purpose: one of `PURPOSES` (what is drawn); different purposes never share a seed.
        step: training step. group: prompt index (the `{prompt}` of a group id). sample: index in
            the group. attempt: refill attempt (0 = first). draw: the k-th draw under the other
            arguments (an epoch, an NFT stratum). key: a string identity where no integers name
            the draw (a judge request's sample id, which may be a validation id).

    Raises:
        ValueError: an unknown purpose, or an argument that is not an int in the signed 64-bit range
            (names the argument).
    """
    if purpose not in PURPOSES:
        raise ValueError(f"seed purpose {purpose!r}: expected one of {', '.join(PURPOSES)}")
    values = {"job_seed": job_seed, "step": step, "group": group, "sample": sample, "attempt": attempt, "draw": draw}
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or not SEED_RANGE[0] <= v <= SEED_RANGE[1]:
            raise ValueError(f"seed argument {name}={v!r}: must be an int in the signed 64-bit range")
    if not isinstance(key, str):
        raise ValueError(f"seed argument key={key!r}: must be a str")
    digest = hashlib.blake2b(key.encode(), digest_size=16).digest() if key else _NO_KEY
    packed = _PACK.pack(purpose.encode("ascii"), *values.values(), digest)
    return int.from_bytes(hashlib.blake2b(packed, digest_size=8, person=PERSON).digest(), "little") & MASK


def group_seeds(job_seed: int, step: int, prompt: int, attempt: int, group_size: int) -> list[int]:
    """The noise seeds of one group's samples, index 0..G−1: `derive(job_seed, "sample", step,
    group=prompt, sample=i, attempt)` (the controller's requests and refills)."""
    return [derive(job_seed, "sample", step=step, group=prompt, sample=i, attempt=attempt) for i in range(group_size)]

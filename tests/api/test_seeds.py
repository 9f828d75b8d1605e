"""One seed derivation (api/seeds.py): every argument matters, and a large job never reuses a seed."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

from omnirl.api.ids import parse_group_id, parse_sample_id
from omnirl.api.seeds import MASK, PERSON, PURPOSES, derive, group_seeds

BASE = {"step": 3, "group": 5, "sample": 7, "attempt": 1, "draw": 2}


def test_the_documented_formula():
    """The module docstring's formula, written out: blake2b-64 of the fixed-width packing."""
    packed = struct.pack("<16s6q16s", b"sample", 11, 3, 5, 7, 1, 2, bytes(16))
    want = int.from_bytes(hashlib.blake2b(packed, digest_size=8, person=PERSON).digest(), "little") & MASK
    assert derive(11, "sample", **BASE) == want
    keyed = struct.pack("<16s6q16s", b"judge", 0, 0, 0, 0, 0, 0, hashlib.blake2b(b"4:7:1", digest_size=16).digest())
    assert derive(0, "judge", key="4:7:1") == int.from_bytes(
        hashlib.blake2b(keyed, digest_size=8, person=PERSON).digest(), "little") & MASK


@pytest.mark.parametrize("name", ["step", "group", "sample", "attempt", "draw"])
def test_each_argument_changes_the_seed(name):
    base = derive(11, "sample", **BASE)
    assert derive(11, "sample", **{**BASE, name: BASE[name] + 1}) != base
    assert derive(11, "sample", **BASE) == base  # and the same arguments give the same seed


def test_job_seed_purpose_and_key_change_the_seed():
    seeds = {derive(11, p, **BASE) for p in PURPOSES}
    assert len(seeds) == len(PURPOSES)
    assert derive(12, "sample", **BASE) != derive(11, "sample", **BASE)
    assert derive(0, "judge", key="a") != derive(0, "judge", key="b") != derive(0, "judge")
    assert all(0 <= s <= MASK for s in seeds)


def test_group_seeds_are_the_sample_derivation():
    assert group_seeds(11, 3, 5, 1, 4) == [derive(11, "sample", step=3, group=5, sample=i, attempt=1) for i in range(4)]


def test_swapped_arguments_do_not_collide():
    """A fixed-width packing: (group 1, sample 2) and (group 2, sample 1) differ (a sum would not care)."""
    assert derive(0, "sample", group=1, sample=2) != derive(0, "sample", group=2, sample=1)
    assert derive(0, "sample", step=1, attempt=0) != derive(0, "sample", step=0, attempt=1)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"purpose": "noise"}, r"seed purpose 'noise': expected one of sample"),
    ({"step": 1.0}, r"seed argument step=1.0: must be an int"),
    ({"sample": True}, r"seed argument sample=True"),
    ({"draw": 1 << 63}, r"seed argument draw=9223372036854775808: must be an int in the signed 64-bit range"),
    ({"key": 5}, r"seed argument key=5: must be a str"),
])
def test_bad_arguments_name_the_argument(kwargs, match):
    args = {"purpose": "sample", **kwargs}
    with pytest.raises(ValueError, match=match):
        derive(0, args.pop("purpose"), **args)


def test_no_two_samples_of_a_large_job_share_a_seed():
    """1,000 steps × 64 prompts × 16 samples × 3 attempts = 3,072,000 sample seeds, all distinct —
    `group_seeds`, what the controller's requests and refills carry."""
    steps, prompts, samples, attempts = 1000, 64, 16, 3
    seeds = np.fromiter((seed for s in range(steps) for p in range(prompts) for a in range(attempts)
                         for seed in group_seeds(0, s, p, a, samples)),
                        dtype=np.uint64, count=steps * prompts * samples * attempts)
    assert seeds.size == 3_072_000
    assert np.unique(seeds).size == seeds.size


def test_ids_parse_back_to_their_integers():
    assert parse_group_id("4:7") == (4, 7, 0, 0) and parse_group_id("4:7r2") == (4, 7, 0, 2)
    assert parse_sample_id("4:7:3") == (4, 7, 3, 0) and parse_sample_id("4:7:3r1") == (4, 7, 3, 1)
    for bad in ("val3:1", "4:7:3", "4", "4:7r"):
        with pytest.raises(ValueError, match=r"group id .*: expected \{step\}:\{prompt\}\[r\{attempt\}\]"):
            parse_group_id(bad)
    with pytest.raises(ValueError, match=r"sample id 'val3:1:0': expected"):
        parse_sample_id("val3:1:0")

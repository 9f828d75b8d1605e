"""Parsing the training ids (docs/architecture.md §4): group `{step}:{prompt}` and sample
`{step}:{prompt}:{index}`, each with `r{attempt}` appended for refills (attempt ≥ 1)."""

from __future__ import annotations

import re
from typing import NamedTuple

# a group id has no index
_FORMS = {
    "group": re.compile(r"(?P<step>\d+):(?P<prompt>\d+)(?:r(?P<attempt>\d+))?"),
    "sample": re.compile(r"(?P<step>\d+):(?P<prompt>\d+):(?P<index>\d+)(?:r(?P<attempt>\d+))?"),
}
_SHOWN = {"group": "{step}:{prompt}[r{attempt}]", "sample": "{step}:{prompt}:{index}[r{attempt}]"}


class SampleRef(NamedTuple):
    """The integers a training id names (`index` is 0 for a group id)."""

    step: int
    prompt: int
    index: int
    attempt: int


def _parse(what: str, text: str) -> SampleRef:
    m = _FORMS[what].fullmatch(text)
    if m is None:
        raise ValueError(f"{what} id {text!r}: expected {_SHOWN[what]}")
    d = m.groupdict()
    return SampleRef(int(d["step"]), int(d["prompt"]), int(d.get("index") or 0), int(d["attempt"] or 0))


def parse_group_id(group_id: str) -> SampleRef:
    """`"4:7"` → (4, 7, 0, 0); `"4:7r2"` → (4, 7, 0, 2).

    Raises:
        ValueError: not a training group id (names the id and the expected form).
    """
    return _parse("group", group_id)


def parse_sample_id(sample_id: str) -> SampleRef:
    """`"4:7:3"` → (4, 7, 3, 0); `"4:7:3r1"` → (4, 7, 3, 1).

    Raises:
        ValueError: not a training sample id (names the id and the expected form).
    """
    return _parse("sample", sample_id)

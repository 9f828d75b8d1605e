"""What a manifest's path-like fields may hold: a value no file system or HTTP request can take is refused
with one line naming the field, before anything looks the path up.

A 5,000-character `spec.model.path` made `omnirl validate` and `omnirl run` end in a traceback
(`OSError: [Errno 36] File name too long` from the check for files not on this machine), a NUL in
`spec.checkpoint.dir` was accepted and failed the first checkpoint, and a manifest holding a byte that
is not UTF-8 was refused without naming the field (issue 31). The limits are Linux's, where pods and
`omnirl run` live: a path of at most `PATH_MAX_BYTES` bytes, each `/`-separated name at most
`NAME_MAX_BYTES`, no NUL; an HTTP path also holds no control character or space (what `http.client`
refuses to send).
"""

from __future__ import annotations

import re

PATH_MAX_BYTES = 4095
"""Bytes of the longest path Linux opens (PATH_MAX, 4096, counts the terminating NUL)."""
NAME_MAX_BYTES = 255
"""Bytes of the longest single name (NAME_MAX) between two `/`."""
_URL_FORBIDDEN = re.compile("[\x00-\x20\x7f]")  # http.client's _contains_disallowed_url_pchar_re


def printable(value: str) -> str:
    """`value` with what cannot be printed as UTF-8 (a lone surrogate, e.g. from a YAML `"\\udcff"` escape)
    written as a backslash escape, for a problem line."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def utf8_problem(value: str) -> str | None:
    """Why `value` is no UTF-8 text (a lone surrogate, which the manifest's escapes or a non-UTF-8 byte make), as
    a phrase following "is invalid:"; None when it is."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        return (f"is not valid UTF-8 (character {err.start + 1} is {printable(value[err.start])!r}, not a "
                "character); write it in UTF-8")
    return None


def path_problem(value: str) -> str | None:
    """Why `value` cannot name a file (NUL, not UTF-8, longer than `PATH_MAX_BYTES`, a name longer than
    `NAME_MAX_BYTES`), as a phrase following "is invalid:"; None when it can (whether it exists is not asked)."""
    if "\x00" in value:
        return "must not contain a NUL character (\\x00): no file name holds one"
    problem = utf8_problem(value)
    if problem:
        return problem
    size = len(value.encode("utf-8"))
    if size > PATH_MAX_BYTES:
        return f"is {size} bytes long: a path holds at most {PATH_MAX_BYTES} bytes (Linux PATH_MAX)"
    name = next((part for part in value.split("/") if len(part.encode("utf-8")) > NAME_MAX_BYTES), None)
    if name is not None:
        return (f"has a name of {len(name.encode('utf-8'))} bytes between two '/': each holds at most "
                f"{NAME_MAX_BYTES} bytes (Linux NAME_MAX)")
    return None


def url_path_problem(value: str) -> str | None:
    """Why `value` cannot be an HTTP request's path (not UTF-8, a control character or space, longer than
    `PATH_MAX_BYTES`), as a phrase following "is invalid:"; None when it can."""
    problem = utf8_problem(value)
    if problem:
        return problem
    bad = _URL_FORBIDDEN.search(value)
    if bad is not None:
        return (f"must not contain a control character or space ({bad.group()!r} at character {bad.start() + 1}); "
                "percent-encode it (a space is %20)")
    size = len(value.encode("utf-8"))
    if size > PATH_MAX_BYTES:
        return f"is {size} bytes long: an HTTP path here holds at most {PATH_MAX_BYTES} bytes"
    return None

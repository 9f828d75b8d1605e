"""The chain of an exception: what it was raised from or during, for the callers that classify a failure by what is
behind a library's wrapper (a storage errno behind safetensors' own error, a SafetensorError behind diffusers'
OSError, a redis-py ConnectionError behind a role's RuntimeError)."""

from __future__ import annotations

from collections.abc import Iterator


def causes(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc`, then the exception it was raised from (`__cause__`), else during (`__context__`), and so on; each
    once (a cycle ends the chain). Nothing for None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def cause_of(exc: BaseException | None, types: type[BaseException] | tuple[type[BaseException], ...]
             ) -> BaseException | None:
    """The first exception of `causes(exc)` that is one of `types`, or None."""
    return next((e for e in causes(exc) if isinstance(e, types)), None)

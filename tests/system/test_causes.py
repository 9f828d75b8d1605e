"""`omnirl.system.causes`: the chain of an exception that storage faults, a lost Redis and a damaged safetensors
file are recognised by behind a library's wrapper."""

from __future__ import annotations

import pytest

from omnirl.system.causes import cause_of, causes


def _raised(make):
    try:
        make()
    except BaseException as err:  # noqa: BLE001 - the test inspects whatever it raised
        return err
    raise AssertionError("nothing raised")


def _wrapped() -> None:
    try:
        raise OSError(28, "No space left on device")
    except OSError as inner:
        try:
            raise RuntimeError("safetensors: write failed") from inner
        except RuntimeError:
            raise ValueError("the checkpoint could not be saved")  # noqa: B904 - __context__ on purpose


def test_the_chain_follows_cause_then_context_in_order():
    err = _raised(_wrapped)
    assert [type(e) for e in causes(err)] == [ValueError, RuntimeError, OSError]
    assert cause_of(err, OSError).errno == 28
    assert isinstance(cause_of(err, (KeyError, RuntimeError)), RuntimeError)
    assert cause_of(err, KeyError) is None
    assert list(causes(None)) == [] and cause_of(None, OSError) is None


def test_a_cycle_ends_the_chain():
    a, b = ValueError("a"), RuntimeError("b")
    a.__cause__, b.__context__ = b, a  # as a handler re-raising what it caught can leave them
    assert list(causes(a)) == [a, b]
    assert cause_of(a, KeyError) is None


@pytest.mark.parametrize("types", [OSError, (OSError,)])
def test_the_first_match_is_the_outermost(types):
    outer = OSError(13, "Permission denied")
    outer.__cause__ = OSError(28, "No space left on device")
    assert cause_of(outer, types) is outer

"""What diffusers 0.42.1's parallel API assumes of the machine, answered for the CPU (gloo) for the duration
of one call: the CPU tests of docs/parallel.md run the same code path a GPU replica runs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def an_accelerator_count() -> Iterator[None]:
    """`torch.accelerator.device_count()` answers at least 1 inside: diffusers' `_resolve_parallel_config` takes
    the device index `rank % device_count()`, a division by zero on a machine without an accelerator."""
    if torch.accelerator.device_count() > 0:
        yield
        return
    original = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = original


@contextlib.contextmanager
def tensor_parallel_on(device_type: str) -> Iterator[None]:
    """diffusers' `apply_tensor_parallel` takes `device_type` inside (it lists cuda, neuron, tpu and xpu; the
    DTensor plans it applies run on gloo as well)."""
    from diffusers.hooks import tensor_parallel

    original = tensor_parallel._SUPPORTED_TP_DEVICES
    if device_type not in original:
        tensor_parallel._SUPPORTED_TP_DEVICES = (*original, device_type)
    try:
        with an_accelerator_count():
            yield
    finally:
        tensor_parallel._SUPPORTED_TP_DEVICES = original

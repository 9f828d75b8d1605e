"""Python stubs of `scorer.proto`, generated with grpcio-tools, never committed.

`make install` (and the reward image's build) runs `python -m omnirl.reward.protocol.stubs`, which
writes `scorer_pb2.py` and `scorer_pb2_grpc.py` beside the .proto together with `scorer.sha256`,
the digest of the .proto they came from. `load()` regenerates them when they are missing or
stale (the .proto was edited since), so a fresh clone and an edited protocol both just work; an
installation whose package directory is read-only must have been generated at build time.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
PROTO = HERE / "scorer.proto"
STAMP = HERE / "scorer.sha256"
ROOT = HERE.parents[2]  # the directory holding the `omnirl` package: the .proto's import root
"""Generated modules import each other as `omnirl.reward.protocol.scorer_pb2`."""


def _digest() -> str:
    return hashlib.sha256(PROTO.read_bytes()).hexdigest()


def is_fresh() -> bool:
    """True when both stub modules exist and were generated from the current .proto."""
    outputs = [HERE / "scorer_pb2.py", HERE / "scorer_pb2_grpc.py"]
    return all(p.is_file() for p in outputs) and STAMP.is_file() and STAMP.read_text().strip() == _digest()


def generate() -> None:
    """Run protoc (grpcio-tools) on scorer.proto into this package directory.

    Raises:
        RuntimeError: grpcio-tools is missing, protoc failed, or the directory is not writable.
    """
    try:
        from grpc_tools import protoc
    except ImportError as err:
        raise RuntimeError("grpcio-tools is not installed; pip install grpcio-tools (make install does)") from err
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    rel = PROTO.relative_to(ROOT).as_posix()
    try:  # generate aside, then rename: a process importing meanwhile never sees half a file
        with tempfile.TemporaryDirectory(dir=HERE, prefix=".protoc-") as tmp:
            args = ["protoc", f"-I{ROOT}", f"-I{well_known}", f"--python_out={tmp}", f"--grpc_python_out={tmp}", rel]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed on {PROTO}: {' '.join(args)}")
            for name in ("scorer_pb2.py", "scorer_pb2_grpc.py"):
                os.replace(Path(tmp) / PROTO.parent.relative_to(ROOT) / name, HERE / name)
        STAMP.write_text(_digest() + "\n")
    except OSError as err:
        raise RuntimeError(f"cannot write the stubs beside {PROTO}: {err}; generate them at build time") from err


def load() -> tuple[ModuleType, ModuleType]:
    """`(scorer_pb2, scorer_pb2_grpc)`, generated first when missing or stale.

    Raises:
        RuntimeError: the stubs are stale or missing and cannot be generated here.
    """
    if not is_fresh():
        try:
            generate()
        except (RuntimeError, OSError) as err:
            raise RuntimeError(
                f"the scorer protocol stubs beside {PROTO} are missing or stale and could not be generated: {err}. "
                "Run `python -m omnirl.reward.protocol.stubs` where the package is writable (make install does)."
            ) from err
        for name in ("omnirl.reward.protocol.scorer_pb2", "omnirl.reward.protocol.scorer_pb2_grpc"):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
    pb2 = importlib.import_module("omnirl.reward.protocol.scorer_pb2")
    pb2_grpc = importlib.import_module("omnirl.reward.protocol.scorer_pb2_grpc")
    return pb2, pb2_grpc


if __name__ == "__main__":
    generate()
    print(f"generated the scorer protocol stubs beside {PROTO}")

"""The run directory's `ledger/`: one line per sample a role published, exactly once per sample.

The rollout and reward roles append `{"sample_id": ..., ...}` to `ledger/{role}-{worker}.jsonl`
after their atomic publish (`TransferQueue.publish(done_kind=...)`); `make chaos` reads the files
to prove that nothing was lost or doubled. The publish and the file append are two steps: a worker
killed between them published a sample without its line, and its successor's publish of the same
sample is refused as a duplicate (the reward role) or skipped as published (the rollout role). So
either looks the sample up in every ledger of the role and writes the line only where none has it.
On Kubernetes the worker is the pod's name (one file per pod) and `ledger/` is on the job's claim
when it is ReadWriteMany (`omnirl_operator.storage.shares_claim`), so a successor pod sees them too.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnirl.system.disk import append_lines

LEDGER_DIR = "ledger"


class Ledger:
    """Append-only JSON lines of the sample ids one worker of one role published.

    Args:
        out_dir: the run directory.
        role: `rollout` or `reward` (the file name's prefix, shared by the role's workers).
        worker_id: this worker (`rollout-0`'s `0` is `env.worker_id`).
    """

    def __init__(self, out_dir: str | Path, role: str, worker_id: str) -> None:
        self._dir = Path(out_dir) / LEDGER_DIR
        self._dir.mkdir(parents=True, exist_ok=True)
        self._role = role
        self._f = append_lines(self._dir / f"{role}-{worker_id}.jsonl")  # a line a full disk cut is dropped
        self._seen: set[str] = set()  # the role's ids read so far (only duplicates read them)
        self._read_upto: dict[Path, int] = {}  # per ledger file: bytes read, whole lines only

    def record(self, sample_id: str, published: bool, **fields: object) -> None:
        """Write the sample's line if this publish appended it (`published`), or if it was a
        duplicate whose first publisher died before writing its line (no ledger of the role has it).

        Raises:
            OSError: the run directory cannot be written (a full or read-only volume).
        """
        if not published:
            self._read_role()  # fresh each time: a live worker of the role may have written it since
            if sample_id in self._seen:
                return
        self._f.write(json.dumps({"sample_id": sample_id, **fields}) + "\n")

    def _read_role(self) -> None:
        for path in sorted(self._dir.glob(f"{self._role}-*.jsonl")):
            with path.open("rb") as f:
                f.seek(self._read_upto.get(path, 0))
                chunk = f.read()
            whole = chunk[: chunk.rfind(b"\n") + 1]  # a line being appended right now is read next time
            self._read_upto[path] = self._read_upto.get(path, 0) + len(whole)
            self._seen.update(json.loads(line)["sample_id"] for line in whole.splitlines() if line.strip())

    def close(self) -> None:
        """Close this worker's file."""
        self._f.close()

"""Whether an RLJob's controller finished the job before its Job failed: its `finish` record on the job's
Redis (`kv:finished`, `omnirl.transfer.records.FINISHED`, written by the controller right after the `finish` line
of `metrics.jsonl`, before it sets `stop` and exits 0).

A controller pod that dies after that record (SIGKILLed, evicted, its node gone) fails its Job (`backoffLimit`
0 under the default `restart-job`). The failure policy then restarted the whole finished job: measured through
the operator and the e2e's stand-in kubelet, `restarts` 1 and every pod rolled, and before the roles learned to
exit at once on that record the new controller exported the last checkpoint again (`exports/step-000002.1`);
with `failurePolicy.maxRestarts: 0` the RLJob ended Failed (`RestartsExhausted`) although its job had finished.
The reconcile reads the record only when the controller Job failed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from omnirl.api.run_dir import finish_covers
from omnirl.api.spec import RLJob
from omnirl.transfer.client import RedisError
from omnirl.transfer.records import JobRecords
from omnirl_operator.autoscale import _client, _password
from omnirl_operator.kube import KubeApi
from omnirl_operator.runowner import _where
from omnirl_operator.settings import OperatorSettings


async def finish_record(kube: KubeApi, job: RLJob, ns: str, settings: OperatorSettings,
                        log: logging.Logger) -> dict[str, Any] | None:
    """The job's `finish` record when its controller finished all `spec.algorithm.steps`, else None.

    A Redis that cannot be read, or a record that is not JSON, is logged as a warning and counts as none:
    the failure policy then decides as before (a restarted job's roles find the record themselves and exit 0,
    `omnirl.launch.roles.finished_record`).

    Raises:
        KubeError: the Secret of `spec.transferQueue.passwordSecret` could not be read (kopf retries).
    """
    url, field, where = _where(job, settings)
    name = job.metadata.name
    try:
        client = _client(url, await _password(kube, job, ns, settings))
        try:
            record = await asyncio.to_thread(JobRecords(client, name).finish_record)
        finally:
            client.close()
    except (RedisError, ValueError) as exc:
        log.warning("job %s: its controller Job failed, and whether it had finished the job first was not read from "
                    "the Redis %s (%s): %s: %s", name, where, field, type(exc).__name__, exc)
        return None
    if not isinstance(record, dict) or not finish_covers(record, job.spec.algorithm.steps):
        return None
    return record


def finished_message(record: dict[str, Any], failure: str) -> str:
    """The Succeeded message of a job whose controller Job failed after the controller wrote `record`."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(record.get("time") or 0)))
    return (f"the controller finished the job ({record.get('total_steps')} training steps; its finish record at "
            f"{when}, last export {record.get('last_export') or 'none'}); its pod failed after that ({failure}), "
            "which is not restarted")

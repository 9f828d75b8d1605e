"""The TransferQueue: one job's Redis Streams, consumer groups, tensor keys and markers (docs/architecture.md §2).

Delivery is at-least-once: an entry stays pending in its consumer group until it is acknowledged,
and entries pending longer than ``claim_idle_s`` (a dead or stuck consumer) are reclaimed with
XAUTOCLAIM by the next :meth:`TransferQueue.consume` of that group. The effect is exactly-once
when consumers are idempotent: check :meth:`~TransferQueue.is_done` and publish the result with
``publish(..., done_kind=kind)``, which sets the marker and appends the entry atomically (a
duplicate publish writes nothing and returns ``None``), then acknowledge.

Memory stays bounded three ways: (1) after every :meth:`~TransferQueue.ack` the stream is trimmed
with ``XTRIM MINID`` to the oldest entry some group still needs (its oldest pending entry, or the
first one not yet delivered), an atomic Lua script that is correct for any number of groups;
(2) tensor and image keys and done markers carry TTLs; (3) :meth:`~TransferQueue.publish` waits while the
stream holds ``max_stream_length`` entries (back-pressure). A group created after entries were
trimmed never sees them, so create every group (:meth:`~TransferQueue.ensure_group`) before
consuming starts; groups start at id ``0`` and so see entries published before they existed.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, NamedTuple

import redis
import torch

from omnirl.api.spec import TransferQueueSpec
from omnirl.transfer import _scripts
from omnirl.transfer.cleanup import delete_job_keys
from omnirl.transfer.client import RECONNECT_S, redis_client
from omnirl.transfer.codec import decode_meta, decode_tensors, encode_meta, encode_tensors
from omnirl.transfer.errors import BackpressureTimeout, MissingTensors
from omnirl.transfer.keys import StreamNames, done_key, image_key, job_prefix, kv_key, staged_key
from omnirl.transfer.keys import tensor_key as make_tensor_key
from omnirl.transfer.media import check_media, poster
from omnirl.transfer.message import Message
from omnirl.transfer.pending import holders
from omnirl.transfer.records import JobRecords


class Backlog(NamedTuple):
    """A consumer group's unfinished entries of one stream (:meth:`TransferQueue.backlog`)."""

    undelivered: int
    """Entries not yet delivered to any consumer of the group (XINFO GROUPS ``lag``)."""
    in_flight: int
    """Entries delivered and not yet acknowledged (XINFO GROUPS ``pending``)."""


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _positive(name: str, value: float, allow_zero: bool = False) -> float:
    if not isinstance(value, (int, float)) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a number {bound}, got {value!r}")
    return value


class TransferQueue:
    """The streams of one RLJob on one Redis.

    Args:
        redis: a ``redis.Redis`` client made with ``decode_responses=False`` (tensors are bytes);
            its ``socket_timeout``, if set, must exceed ``block_ms`` of :meth:`consume`.
        job: the job name (DNS-1123); every key is ``omnirl:{job}:…``.
        max_stream_length: entries a stream may hold before :meth:`publish` waits (back-pressure).
        tensor_ttl_s: seconds a tensor key lives; a consumer later than that gets
            :class:`MissingTensors`.
        claim_idle_s: seconds an entry may stay pending without a renewal (:meth:`touch`,
            :func:`~omnirl.transfer.lease.holding`) before another consumer reclaims it; work that
            renews no claim must take less than that.
        backpressure_timeout_s: seconds :meth:`publish` waits for room before raising
            :class:`BackpressureTimeout`.
        done_ttl_s: seconds an idempotency marker (``publish(done_kind=...)``) lives.

    Raises:
        ValueError: for an invalid job name, a non-positive bound, or a client that decodes
            responses.
    """

    def __init__(
        self,
        redis: redis.Redis,
        job: str,
        *,
        max_stream_length: int = 10_000,
        tensor_ttl_s: float = 3600,
        claim_idle_s: float = 60.0,
        backpressure_timeout_s: float = 300.0,
        done_ttl_s: float = 86_400,
    ):
        if redis.get_connection_kwargs().get("decode_responses"):
            raise ValueError("TransferQueue needs a redis client with decode_responses=False (tensors are bytes)")
        if not isinstance(max_stream_length, int) or max_stream_length < 1:
            raise ValueError(f"max_stream_length must be an int >= 1, got {max_stream_length!r}")
        self.redis = redis
        self.job = job
        self.streams = StreamNames(job)
        self._prefix = job_prefix(job)
        self.max_stream_length = max_stream_length
        self.tensor_ttl_s = _positive("tensor_ttl_s", tensor_ttl_s)
        self.claim_idle_s = _positive("claim_idle_s", claim_idle_s)
        self.backpressure_timeout_s = _positive("backpressure_timeout_s", backpressure_timeout_s, True)
        self.done_ttl_s = _positive("done_ttl_s", done_ttl_s)
        self._publish_script = redis.register_script(_scripts.PUBLISH)
        self._trim_script = redis.register_script(_scripts.TRIM)
        self._touch_script = redis.register_script(_scripts.TOUCH)
        self._groups: set[tuple[str, str]] = set()
        self._claim_cursor: dict[tuple[str, str], str] = {}
        self._owns_client = False
        self.records = JobRecords(redis, job)  # the job's small records two roles exchange (`records.py`)

    @classmethod
    def from_url(cls, url: str, job: str, *, reconnect_s: float = RECONNECT_S, **kwargs: Any) -> TransferQueue:
        """Connect to ``url`` (``redis://host:port/db``); :meth:`close` closes this client.

        Every command is retried on connection errors, timeouts and "loading the dataset" with
        exponential backoff (50 ms doubling to 2 s, jittered) for about ``reconnect_s`` seconds, so a
        Redis restart (AOF replay) is ridden out; after that the error is raised.
        """
        queue = cls(redis_client(url, reconnect_s), job, **kwargs)
        queue._owns_client = True
        return queue

    @classmethod
    def for_job(cls, job: str, settings: TransferQueueSpec, url: str) -> TransferQueue:
        """The queue every role and the launcher use: :meth:`from_url` with the job's
        ``spec.transferQueue`` bounds (``maxStreamLength``, ``tensorTtlSeconds``, ``claimIdleSeconds``).

        Args:
            job: the RLJob name.
            settings: the job's ``spec.transferQueue``.
            url: the Redis the roles reach (``RoleEnv.redis_url``; the launcher's embedded one or
                ``settings.redisUrl``), which may differ from ``settings.redisUrl``.
        """
        return cls.from_url(url, job, max_stream_length=settings.maxStreamLength,
                            tensor_ttl_s=settings.tensorTtlSeconds, claim_idle_s=settings.claimIdleSeconds)

    # ------------------------------------------------------------------ names and groups
    def _check_key(self, what: str, key: str) -> str:
        if not isinstance(key, str) or not key.startswith(self._prefix):
            raise ValueError(
                f"{what} {key!r} is not a key of job {self.job!r}: use queue.streams.samples etc. "
                f"or a key starting with {self._prefix!r}"
            )
        return key

    def ensure_group(self, stream: str, group: str) -> None:
        """Create consumer ``group`` on ``stream`` (and the stream) at id 0; a no-op if it exists."""
        self._check_key("stream", stream)
        try:
            self.redis.xgroup_create(stream, group, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise
        self._groups.add((stream, group))

    # ------------------------------------------------------------------ producing
    def publish(
        self,
        stream: str,
        meta: dict,
        tensors: dict[str, torch.Tensor] | None = None,
        *,
        image: torch.Tensor | None = None,
        media: dict[str, torch.Tensor] | None = None,
        tensor_key: str | None = None,
        done_kind: str | None = None,
        count_key: str | None = None,
    ) -> str | None:
        """Append one entry; store ``tensors`` and ``image`` (if any) under two keys with a TTL.

        Args:
            stream: a stream key of this job (``queue.streams.samples``).
            meta: plain metadata (see :func:`~omnirl.transfer.codec.encode_meta`); needs
                ``meta["sample_id"]`` when tensors come without ``tensor_key`` or with ``done_kind``.
            tensors: name → tensor (any shape/dtype; a sample's trajectory), stored as safetensors
                bytes under ``tensor_key`` (default ``omnirl:{job}:tensors:{sample_id}``) for
                ``tensor_ttl_s``; read back with :meth:`load_tensors`.
            image: the sample's image (any shape/dtype, e.g. uint8 ``[H, W, 3]``), stored alone
                under :func:`~omnirl.transfer.keys.image_key` of the tensor key with the same TTL,
                so that a scorer reads it (:meth:`load_image`) without the trajectory. Needs ``tensors``.
            media: instead of ``image``, the sample's media (:mod:`omnirl.transfer.media`: ``video`` uint8
                ``[T, H, W, 3]``, ``audio`` float32 ``[L]``, …), stored as ONE safetensors blob under the same
                image key (raw bytes, bit-exact); read back with :meth:`load_media`. Needs ``tensors``.
            tensor_key: where to store them (``omnirl:{job}:tensors:…``); with ``tensors=None`` the
                entry just names this existing key (e.g. a score entry pointing at its sample).
            done_kind: when given, set the marker ``done:{done_kind}:{sample_id}`` atomically with
                the append; if it already exists nothing is written (a duplicate result).
            count_key: a key of this job INCR'd in the same atomic step as the append (not for a
                duplicate), so a count of published results survives a kill at any moment.

        Returns:
            The new entry id, or ``None`` when ``done_kind`` found the result already published by
            another call (a retry of this call after a lost reply gets the id its attempt appended).

        Raises:
            TypeError: metadata or tensors that cannot be encoded (names the key).
            ValueError: a key outside this job, a tensor key not under ``tensors:``, an image or media
                without tensors, both an image and media, media that break the media contract
                (:func:`~omnirl.transfer.media.check_media`), or a missing ``meta["sample_id"]``.
            BackpressureTimeout: the stream stayed full for ``backpressure_timeout_s`` seconds.

        Back-pressure waits while XLEN >= ``max_stream_length``; the check and the append are two
        steps, so P concurrent producers may overshoot the bound by at most P - 1 entries.
        """
        self._check_key("stream", stream)
        if image is not None and media is not None:
            raise ValueError("publish: pass the sample's image or its media, not both (media may hold an image)")
        if (image is not None or media is not None) and tensors is None:
            raise ValueError("publish(image=/media=...) needs the sample's tensors too (the image key is named after them)")
        meta_bytes = encode_meta(meta)
        tensor_bytes = encode_tensors(tensors) if tensors is not None else None
        if media is not None:
            image_bytes = encode_tensors(check_media(media, "publish(media=)"))
        else:
            image_bytes = encode_tensors({"image": image}) if image is not None else None
        if tensor_key is None and tensors is not None:
            tensor_key = make_tensor_key(self.job, self._sample_id(meta, "tensors without tensor_key"))
        marker = None if done_kind is None else done_key(self.job, done_kind, self._sample_id(meta, "done_kind"))
        if tensor_key is not None:
            self._check_tensor_key(tensor_key)
        if count_key is not None:
            self._check_key("count key", count_key)
        self._wait_for_room(stream)
        entry_id = self._append(stream, meta_bytes, tensor_key, tensor_bytes, image_bytes, marker, count_key)
        return None if entry_id is None else _s(entry_id)

    def _append(self, stream: str, meta_bytes: bytes, tensor_key: str | None, tensor_bytes: bytes | None,
                image_bytes: bytes | None, marker: str | None, count_key: str | None) -> bytes | str | None:
        """Stage the payload bytes with plain SETs, then run the publish script, in one pipelined round trip.

        The script moves the staged keys under their names (RENAME, O(1)) with the marker, the count and the
        XADD, all or nothing; a payload passed to the script as an argument instead costs Redis 6-10× the CPU
        per byte (Lua copies and hashes it: `benchmarks/transfer_load.py`, docs/scale.md). Staged keys carry
        the tensor TTL, so a producer that dies between the two leaves nothing for long. A staged key gone
        when the script runs (a Redis restarted without persistence) is staged again, once.
        """
        token = uuid.uuid4().hex  # the same in redis-py's retries of this call: the script knows its own marker
        staged = {part: staged_key(self.job, token, part) for part, data in (("t", tensor_bytes), ("i", image_bytes))
                  if data is not None}
        keys = [stream]
        if tensor_key is not None:
            keys += [tensor_key] + ([staged["t"]] if "t" in staged else [])
        if image_bytes is not None:
            keys += [image_key(tensor_key), staged["i"]]
        keys += [k for k in (marker, count_key) if k is not None]
        flag = lambda x: "1" if x else "0"  # noqa: E731
        args = [meta_bytes, flag(tensor_key), flag("t" in staged), flag("i" in staged), flag(marker),
                int(self.done_ttl_s * 1000), flag(count_key), token]
        ttl_ms = int(self.tensor_ttl_s * 1000)
        for attempt in range(2):
            with self.redis.pipeline(transaction=False) as pipe:
                for part, data in (("t", tensor_bytes), ("i", image_bytes)):
                    if data is not None:
                        pipe.set(staged[part], data, px=ttl_ms)
                self._publish_script(keys=keys, args=args, client=pipe)
                try:
                    return pipe.execute()[-1]
                except redis.ResponseError as err:
                    if _scripts.STAGED_MISSING not in str(err) or attempt:
                        raise
        raise AssertionError("unreachable")  # the loop returns or raises

    @staticmethod
    def _sample_id(meta: dict, why: str) -> str:
        sample_id = meta.get("sample_id")
        if not isinstance(sample_id, str) or not sample_id:
            raise ValueError(
                f"meta['sample_id'] must be a non-empty str (e.g. '{{step}}:{{prompt}}:{{index}}') "
                f"for {why}, got {sample_id!r}"
            )
        return sample_id

    def _wait_for_room(self, stream: str) -> None:
        """Back-pressure: block while XLEN(stream) >= max_stream_length (trimming as it polls)."""
        length = self.redis.xlen(stream)
        if length < self.max_stream_length:
            return
        start = time.monotonic()
        pause = 0.005
        while True:
            self.trim(stream)  # a consumer that died between XACK and its trim leaves work here
            length = self.redis.xlen(stream)
            if length < self.max_stream_length:
                return
            waited = time.monotonic() - start
            if waited >= self.backpressure_timeout_s:
                raise BackpressureTimeout(stream, length, self.max_stream_length, waited)
            time.sleep(min(pause, max(self.backpressure_timeout_s - waited, 0.0)))
            pause = min(pause * 2, 0.1)

    # ------------------------------------------------------------------ consuming
    def consume(
        self, stream: str, group: str, consumer: str, *, count: int = 16, block_ms: int = 1000
    ) -> list[Message]:
        """Reclaim stale pending entries, then read new ones, up to ``count`` in all.

        First XAUTOCLAIM moves to ``consumer`` the entries of ``group`` pending longer than
        ``claim_idle_s`` (a dead consumer's work); then XREADGROUP ``>`` reads new entries,
        blocking up to ``block_ms`` ms only when nothing was reclaimed. ``block_ms=0`` returns at
        once (unlike raw XREADGROUP, where 0 blocks forever). The group is created if missing.

        Returns:
            Up to ``count`` messages, reclaimed ones first; ``[]`` after the timeout.

        Raises:
            ValueError: a stream outside this job, or ``count < 1``; or an entry that was not
                written by :meth:`publish`.
        """
        self._check_key("stream", stream)
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        if (stream, group) not in self._groups:
            self.ensure_group(stream, group)
        try:
            return self._consume(stream, group, consumer, count, block_ms)
        except redis.ResponseError as err:
            if "NOGROUP" not in str(err):
                raise
            self.ensure_group(stream, group)  # the stream was deleted (cleanup) under us
            return self._consume(stream, group, consumer, count, block_ms)

    def _consume(self, stream: str, group: str, consumer: str, count: int, block_ms: int) -> list[Message]:
        messages = self._reclaim(stream, group, consumer, count)
        remaining = count - len(messages)
        if remaining > 0:
            block = block_ms if block_ms > 0 and not messages else None
            reply = self.redis.xreadgroup(group, consumer, {stream: ">"}, count=remaining, block=block)
            for _name, entries in reply or []:
                messages.extend(self._message(stream, entry_id, fields, 1) for entry_id, fields in entries)
        return messages

    def _reclaim(self, stream: str, group: str, consumer: str, count: int) -> list[Message]:
        """XAUTOCLAIM entries idle > claim_idle_s, continuing the scan where the last call ended."""
        cursor = self._claim_cursor.get((stream, group), "0-0")
        reply = self.redis.xautoclaim(
            stream, group, consumer, min_idle_time=int(self.claim_idle_s * 1000), start_id=cursor, count=count
        )
        self._claim_cursor[(stream, group)] = _s(reply[0])
        entries = [(entry_id, fields) for entry_id, fields in reply[1] if fields]  # deleted: no fields
        if not entries:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            for entry_id, _ in entries:
                pipe.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
            details = pipe.execute()
        return [
            self._message(stream, entry_id, fields, int(info[0]["times_delivered"]) if info else 1)
            for (entry_id, fields), info in zip(entries, details, strict=True)
        ]

    def _message(self, stream: str, entry_id: bytes | str, fields: dict, delivery_count: int) -> Message:
        if b"m" not in fields:
            raise ValueError(
                f"entry {_s(entry_id)} of {stream!r} has no 'm' field: only TransferQueue.publish may "
                "write to this job's streams"
            )
        key = fields.get(b"k")
        return Message(_s(entry_id), stream, decode_meta(fields[b"m"]), None if key is None else _s(key),
                       delivery_count)

    def _check_tensor_key(self, key: str) -> str:
        """``key`` if it is a tensor key of this job (``omnirl:{job}:tensors:…``), else ValueError."""
        if not isinstance(key, str) or not key.startswith(f"{self._prefix}tensors:"):
            raise ValueError(f"tensor key {key!r} is not under {self._prefix}tensors: (see keys.tensor_key)")
        return key

    def _tensor_key_of(self, msg_or_key: Message | str) -> str:
        if isinstance(msg_or_key, Message):
            if msg_or_key.tensor_key is None:
                raise ValueError(f"message {msg_or_key.id} of {msg_or_key.stream!r} carries no tensors")
            return msg_or_key.tensor_key
        return self._check_tensor_key(msg_or_key)

    def _get(self, key: str) -> dict[str, torch.Tensor]:
        data = self.redis.get(key)
        if data is None:
            raise MissingTensors(key)
        return decode_tensors(data)

    def load_tensors(self, msg_or_key: Message | str) -> dict[str, torch.Tensor]:
        """The tensors a message (or a tensor key) names, as CPU tensors; without the image.

        Raises:
            MissingTensors: the key expired or was deleted (never an empty dict).
            ValueError: the message carries no tensor key, or the key is not a tensor key.
        """
        return self._get(self._tensor_key_of(msg_or_key))

    def load_image(self, msg_or_key: Message | str) -> torch.Tensor:
        """The image published with a message's tensors (one GET of the image key alone); for a sample published
        with media, its poster (:func:`~omnirl.transfer.media.poster`: a video's frames side by side).

        Raises:
            MissingTensors: the image key expired, was deleted, or was never written.
            ValueError: the message carries no tensor key, or the key is not a tensor key.
        """
        return poster(self.load_media(msg_or_key))

    def load_media(self, msg_or_key: Message | str) -> dict[str, torch.Tensor]:
        """The media published with a message's tensors (:mod:`omnirl.transfer.media`; an image sample's is
        ``{"image": …}``), one GET of the image key alone.

        Raises:
            MissingTensors: the image key expired, was deleted, or was never written.
            ValueError: the message carries no tensor key, or the key is not a tensor key.
        """
        return self._get(image_key(self._tensor_key_of(msg_or_key)))

    def absent(self, keys: list[str]) -> list[str]:
        """The tensor keys of `keys` that no longer exist (expired after `tensor_ttl_s`, or deleted), in
        order; one pipelined EXISTS each."""
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.exists(self._check_tensor_key(key))
        return [key for key, n in zip(keys, pipe.execute(), strict=True) if not n]

    def ages(self, keys: list[str]) -> list[float | None]:
        """Seconds each tensor key of `keys` has lived of `tensor_ttl_s` (`tensor_ttl_s` − its PTTL: Redis's
        own clock, no writer's), in order; None for a key that no longer exists (0 for one without expiry).
        One pipelined PTTL each."""
        pipe = self.redis.pipeline(transaction=False)
        for key in keys:
            pipe.pttl(self._check_tensor_key(key))
        return [None if ms == -2 else 0.0 if ms < 0 else max(0.0, self.tensor_ttl_s - ms / 1000)
                for ms in pipe.execute()]

    def delete_tensors(self, keys: list[str] | str) -> int:
        """UNLINK tensor keys (a str or a list) and their image keys; returns how many keys existed."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        names = [name for key in keys for name in (self._check_tensor_key(key), image_key(key))]
        return int(self.redis.unlink(*names)) if names else 0

    def recover(self, stream: str, group: str, consumer: str, count: int = 1000) -> list[Message]:
        """This consumer's own pending entries (XREADGROUP id ``0``): the work a previous process
        with the same consumer name (a restarted replica) had read and not acknowledged."""
        self._check_key("stream", stream)
        if (stream, group) not in self._groups:
            self.ensure_group(stream, group)
        reply = self.redis.xreadgroup(group, consumer, {stream: "0"}, count=count)
        return [self._message(stream, entry_id, fields, 2)
                for _name, entries in reply or [] for entry_id, fields in entries if fields]

    def take_over(self, stream: str, group: str, consumer: str) -> list[Message]:
        """Move every pending entry of ``group`` to ``consumer`` at once (XAUTOCLAIM, idle >= 0).

        For a group with a single consumer (the controller): its predecessor is dead, so there is
        no reason to wait ``claim_idle_s``.
        """
        self._check_key("stream", stream)
        if (stream, group) not in self._groups:
            self.ensure_group(stream, group)
        out, cursor = [], "0-0"
        while True:
            reply = self.redis.xautoclaim(stream, group, consumer, min_idle_time=0, start_id=cursor, count=1000)
            out += [self._message(stream, entry_id, fields, 2) for entry_id, fields in reply[1] if fields]
            cursor = _s(reply[0])
            if cursor == "0-0":
                return out

    def touch(self, stream: str, group: str, consumer: str, ids: list[str]) -> list[str]:
        """Renew the lease on entries this consumer is still working on (idle → 0, atomically, Lua),
        so a live consumer's long work is not reclaimed by another after ``claim_idle_s``.

        Only entries still pending for ``consumer`` are renewed: one another consumer reclaimed
        (this one's renewals lapsed) stays with it, one acknowledged stays acknowledged.

        Returns:
            The ids of ``ids`` renewed (still this consumer's), in order.
        """
        self._check_key("stream", stream)
        if not ids:
            return []
        return [_s(i) for i in self._touch_script(keys=[stream], args=[group, consumer, *ids])]

    def ack(self, stream: str, group: str, ids: list[str]) -> None:
        """XACK ``ids`` in ``group``, then trim what every group has acknowledged (see :meth:`trim`)."""
        self._check_key("stream", stream)
        if ids:
            self.redis.xack(stream, group, *ids)
            self.trim(stream)

    def trim(self, stream: str) -> int:
        """Delete the entries below the oldest one any group still needs; returns how many.

        Per group the oldest needed entry is its oldest pending one, or, when nothing is pending,
        the first not yet delivered; ``XTRIM MINID`` (exact) runs on the minimum, atomically (Lua).
        A stream without groups is not trimmed.
        """
        return int(self._trim_script(keys=[self._check_key("stream", stream)]))

    # ------------------------------------------------------------------ idempotency
    def is_done(self, kind: str, sample_id: str) -> bool:
        """True if the marker ``done:{kind}:{sample_id}`` exists."""
        return bool(self.redis.exists(done_key(self.job, kind, sample_id)))

    def are_done(self, kind: str, sample_ids: list[str]) -> list[bool]:
        """:meth:`is_done` of each of ``sample_ids``, in order, in one round trip (a pipeline)."""
        if not sample_ids:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            for sample_id in sample_ids:
                pipe.exists(done_key(self.job, kind, sample_id))
            return [bool(n) for n in pipe.execute()]

    # ------------------------------------------------------------------ inspection
    def stream_length(self, stream: str) -> int:
        """XLEN: entries held (acknowledged but untrimmed ones included); 0 for a missing stream."""
        return int(self.redis.xlen(self._check_key("stream", stream)))

    def _group_info(self, stream: str, group: str) -> dict:
        try:
            groups = self.redis.xinfo_groups(self._check_key("stream", stream))
        except redis.ResponseError as err:
            raise ValueError(f"stream {stream!r} does not exist; call ensure_group first") from err
        for info in groups:
            if _s(info["name"]) == group:
                return info
        raise ValueError(f"stream {stream!r} has no consumer group {group!r}; call ensure_group first")

    def holders(self, stream: str, group: str) -> tuple[list[str], str]:
        """Who holds ``stream``'s entries in ``group`` (`pending.holders`: the consumers with a pending entry and
        one line of text); never raises for a stream or group not there yet."""
        return holders(self.redis, self._check_key("stream", stream), group)

    def pending_count(self, stream: str, group: str) -> int:
        """Entries delivered to ``group`` and not yet acknowledged.

        Raises:
            ValueError: the stream or group does not exist.
        """
        return int(self._group_info(stream, group)["pending"])

    def lag(self, stream: str, group: str) -> int:
        """Entries in ``stream`` not yet delivered to ``group`` (XINFO GROUPS ``lag`` on Redis >= 7,
        else counted with XRANGE after the group's last-delivered id).

        Raises:
            ValueError: the stream or group does not exist.
        """
        return self._lag(stream, self._group_info(stream, group))

    def backlog(self, stream: str, group: str) -> Backlog:
        """``group``'s unfinished entries of ``stream``: (undelivered, in flight), from one XINFO GROUPS.

        ``undelivered`` is :meth:`lag`; ``in_flight`` the entries delivered to some consumer and not yet
        acknowledged (``pending``). A stream or group not there yet (or deleted by cleanup) has ``(0, 0)``:
        the next :meth:`consume` creates it.
        """
        try:
            info = self._group_info(stream, group)
        except ValueError:
            self._check_key("stream", stream)  # a foreign key is still an error
            return Backlog(0, 0)
        return Backlog(self._lag(stream, info), int(info["pending"]))

    def _lag(self, stream: str, info: dict) -> int:
        # Redis reports lag as nil when it cannot tell (an XDEL after the group's last-delivered id, a
        # group moved by XGROUP SETID without ENTRIESREAD; Redis < 7 has no lag field): count instead
        if info.get("lag") is not None:
            return int(info["lag"])
        start, total = "(" + _s(info["last-delivered-id"]), 0
        while True:
            entries = self.redis.xrange(stream, min=start, max="+", count=1000)
            total += len(entries)
            if len(entries) < 1000:
                return total
            start = "(" + _s(entries[-1][0])

    # ------------------------------------------------------------------ small KV
    def set_json(self, name: str, obj: Any, ttl_s: float | None = None) -> None:
        """Store ``obj`` as JSON under ``omnirl:{job}:kv:{name}`` (e.g. ``stop``, ``actor_state``).

        Raises:
            TypeError / ValueError: ``obj`` is not JSON-serialisable (NaN/inf are refused).
        """
        data = json.dumps(obj, allow_nan=False, separators=(",", ":"))
        px = None if ttl_s is None else int(_positive("ttl_s", ttl_s) * 1000)
        self.redis.set(kv_key(self.job, name), data.encode(), px=px)

    def get_json(self, name: str) -> Any | None:
        """The JSON value stored by :meth:`set_json`, or ``None`` when absent."""
        data = self.redis.get(kv_key(self.job, name))
        return None if data is None else json.loads(data)

    # ------------------------------------------------------------------ lifecycle
    def cleanup(self, keep: tuple[str, ...] = ()) -> int:
        """UNLINK every key of this job (:func:`~omnirl.transfer.cleanup.delete_job_keys`, shared
        with the operator's finalizer) but the kv names in `keep` (a fresh `omnirl run` keeps the
        run-owner record it claimed first, `transfer/owner.py`); returns how many. Other jobs are untouched."""
        removed = delete_job_keys(self.redis, self.job, keep=keep)
        self._groups.clear()
        self._claim_cursor.clear()
        return removed

    def close(self) -> None:
        """Close the client if :meth:`from_url` made it (a client passed in stays open)."""
        if self._owns_client:
            self.redis.close()

    def __enter__(self) -> TransferQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The diffusion rollout engine: step-wise continuous batching, or static request batching.

Step-wise (the default): requests wait in a queue; before every denoising step the scheduler
admits waiting requests (they join at step boundaries), groups the in-flight samples by
batching key (latent shape, guidance scale) and runs ONE denoiser forward for the chosen
bucket — the fullest one, unless a sample has waited `max_wait_steps` engine steps, then the
bucket of the oldest waiter (age-based fairness, so a rare shape is never starved). A sample
that takes its last step leaves at once and is returned, out of order. Samples of different
step counts or σ positions share a forward: σ is per sample.

Packed (step-wise scheduling past shape buckets): buckets by guidance scale only, so samples of
different resolutions share one forward through the adapter's `velocity_packed` (concatenated
image tokens, attention per sample; the SD3 family has it). A step whose samples all have one
shape takes the step-wise path unchanged; the ODE/SDE update runs per shape group.

Static (the baseline a diffusers loop runs): take up to `max_batch_size` queued requests with
the head's key and run them together from the first step to the last.

Held-out cohorts (`SampleRequest.cohort`, from a `HeldOutCohort`): in every mode a cohort's samples are
admitted together, form buckets of their own (the cohort is part of the batching key) and each of their
forwards takes the whole bucket in admission order, so a held-out sample runs in the same batches however
its request arrived and whatever else is in flight; `omnirl eval` runs the same cohorts and gets bitwise
the same latents (`omnirl.rollout.requests`).

The σ grid of a sample is its adapter's (`ModelAdapter.sigma_grid`: the family's own, or the
request's `shift` override). This engine is the only denoising loop: training rollouts,
in-run validation and `omnirl eval` all run through it.

Every sample draws its noise from its own generator (on the engine's device) seeded by
`request.seed`, so a sample is bit-identical whichever batch it ran in. Latents and the SDE math
stay fp32 (docs/architecture.md §4). Latents, σ and the recorded trajectory stay on the engine's device
until the sample finishes: a step launches its work without waiting for the device.

Handover on an accelerator: a step that finishes samples only launches their copies to the host
(pinned memory, one per dtype); the NEXT step launches its own forward first and then returns
them. So the host never waits for a forward with nothing queued behind it, and the caller's work
on the results (publishing them) overlaps the next forward. On the CPU, results come back from
the step that finished them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from omnirl.algorithms import ode_step, sde_step
from omnirl.models.protocol import ModelAdapter
from omnirl.rollout.types import SampleRequest, SampleResult
from omnirl.transfer.media import poster, unbatch

_Handover = Callable[[], list["SampleResult"]]
"""A finished group: calling it waits for its host copies and returns its results."""


@dataclass
class _InFlight:
    request: SampleRequest
    key: tuple
    x: torch.Tensor  # [C, H, W] fp32, on the engine's device
    sigmas: torch.Tensor  # [num_steps + 1] fp32, on the engine's device
    cond: dict[str, torch.Tensor]  # leading dim 1
    generator: torch.Generator
    step: int = 0
    waited: int = 0
    latents: list[torch.Tensor] = field(default_factory=list)
    log_probs: list[torch.Tensor] = field(default_factory=list)
    mask: torch.Tensor | None = None  # [D] bool: the trained elements of a flat multi-modal latent (None: all)


@dataclass
class EngineStats:
    """Counters for benchmarks and metrics: forwards, sample-steps, finished samples."""

    forwards: int = 0
    sample_steps: int = 0
    finished: int = 0

    @property
    def mean_batch(self) -> float:
        """Mean samples per denoiser forward."""
        return self.sample_steps / max(self.forwards, 1)


class RolloutEngine:
    """Denoises `SampleRequest`s with a `ModelAdapter`.

    Args:
        adapter: the model.
        max_batch_size: max samples in one denoiser forward.
        batching: "stepwise", "packed" (needs `adapter.velocity_packed`) or "static".
        max_wait_steps: step-wise fairness bound, in engine steps.
        device: where the denoiser runs; results are returned on the CPU.
        policy_version: stamped on every result; `set_policy_version` after a weight sync.
    Raises:
        ValueError: unknown batching mode, "packed" with an adapter lacking `velocity_packed`, or a request whose window is not contiguous or
            includes the last step.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        *,
        max_batch_size: int = 64,
        batching: str = "stepwise",
        max_wait_steps: int = 8,
        device: str | torch.device = "cpu",
        policy_version: int = 0,
    ) -> None:
        if batching not in ("stepwise", "packed", "static"):
            raise ValueError(f"batching must be 'stepwise', 'packed' or 'static', got {batching!r}")
        if batching == "packed" and not hasattr(adapter, "velocity_packed"):
            raise ValueError(f"batching='packed' needs an adapter with velocity_packed (mixed shapes in one forward); "
                             f"{type(adapter).__name__} has none: use batching='stepwise'")
        self.adapter = adapter
        self.max_batch_size = max_batch_size
        self.batching = batching
        self.max_wait_steps = max_wait_steps
        self.device = torch.device(device)
        self.policy_version = policy_version
        self.waiting: deque[SampleRequest] = deque()
        self.in_flight: list[_InFlight] = []
        self.stats = EngineStats()
        # accelerators hand finished samples over one step later (module docstring: Handover)
        self._defer = self.device.type not in ("cpu", "meta")
        self._handover: list[_Handover] = []
        self._masks: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ queue
    def submit(self, request: SampleRequest) -> None:
        """Queue a request; it joins the running batch at the next step boundary."""
        _check_window(request)
        self.waiting.append(request)

    def has_work(self) -> bool:
        """True while anything is queued, in flight, or finished and not yet returned by `step`."""
        return bool(self.waiting or self.in_flight or self._handover)

    def set_policy_version(self, version: int) -> None:
        """Stamp later results with `version`. Call only when nothing is in flight."""
        if self.in_flight:
            raise RuntimeError("policy version changed with samples in flight (mixed-weight samples)")
        self.policy_version = version

    # ------------------------------------------------------------------ stepping
    @torch.no_grad()
    def step(self) -> list[SampleResult]:
        """Run one denoiser forward over one bucket; return the samples that finished: on the CPU
        those of this step, on an accelerator those of the previous step (waiting only for that
        step's copies, while this step's forward runs)."""
        self._admit()
        handed, self._handover = self._handover, []
        if self.in_flight:
            finished = self._advance(self._pick_batch())
            if self._defer:
                self._handover = finished
            else:
                handed += finished
        return [r for build in handed for r in build()]

    def run_until_idle(self) -> list[SampleResult]:
        """Step until the queue and the in-flight set are empty; results in finishing order."""
        out: list[SampleResult] = []
        while self.has_work():
            out.extend(self.step())
        return out

    # ------------------------------------------------------------------ internals
    def _admit(self) -> None:
        if self.batching == "static":
            if self.in_flight or not self.waiting:
                return
            head_key = self._key(self.waiting[0])
            keep: deque[SampleRequest] = deque()
            while self.waiting and len(self.in_flight) < self.max_batch_size:
                req = self.waiting.popleft()
                if self._key(req) == head_key:
                    self.in_flight.append(self._start(req))
                else:
                    keep.append(req)
            self.waiting = keep + self.waiting
            return
        # step-wise: keep up to 2× the batch in flight so another bucket can fill meanwhile; a cohort whole
        while self.waiting and len(self.in_flight) < 2 * self.max_batch_size:
            req = self.waiting.popleft()
            self.in_flight.append(self._start(req))
            while req.cohort is not None and self.waiting and self.waiting[0].cohort == req.cohort:
                self.in_flight.append(self._start(self.waiting.popleft()))

    def _shape(self, req: SampleRequest) -> tuple[int, ...]:
        if req.resolution is None:
            return tuple(self.adapter.latent_shape(list(req.prompt_ids)))
        return tuple(self.adapter.latent_shape(list(req.prompt_ids), resolution=req.resolution))

    def _key(self, req: SampleRequest) -> tuple:
        return (self._shape(req), req.guidance_scale, req.cohort)

    def _start(self, req: SampleRequest) -> _InFlight:
        shape = self._shape(req)
        # the sample's own generator on the engine's device: its noise never depends on the batch
        gen = torch.Generator(device=self.device).manual_seed(req.seed)
        x = torch.randn(shape, generator=gen, dtype=torch.float32, device=self.device)
        cond = self.adapter.encode([list(req.prompt_ids)], device=self.device)
        sig = self.adapter.sigma_grid(req.num_steps, shape, req.shift).to(self.device, non_blocking=True)
        return _InFlight(req, (shape, req.guidance_scale, req.cohort), x, sig, cond, gen, mask=self._trained_mask(req))

    def _trained_mask(self, req: SampleRequest) -> torch.Tensor | None:
        """A multi-modal sample's trained elements `[D]` on the device when a modality is left out of the policy
        (`adapter.latent_layout`); None otherwise (every element stochastic in the SDE window). One tensor per
        layout, shared by its samples."""
        layout_of = getattr(self.adapter, "latent_layout", None)
        if layout_of is None:
            return None
        layout = layout_of(list(req.prompt_ids))
        if layout.all_trained:
            return None
        key = repr(layout)
        if key not in self._masks:
            self._masks[key] = layout.trained_mask().to(self.device)
        return self._masks[key]

    def _pick_batch(self) -> list[_InFlight]:
        if self.batching == "static":
            return list(self.in_flight)
        bucket_key = (lambda s: s.key[1:]) if self.batching == "packed" else (lambda s: s.key)  # packed: no shape
        buckets: dict[tuple, list[_InFlight]] = {}
        for s in self.in_flight:
            buckets.setdefault(bucket_key(s), []).append(s)
        oldest = max(self.in_flight, key=lambda s: s.waited)
        if oldest.waited >= self.max_wait_steps:
            key = bucket_key(oldest)
        else:
            key = max(buckets, key=lambda k: min(len(buckets[k]), self.max_batch_size))
        if key[-1] is not None:  # a held-out cohort: all of it, in admission order, as `omnirl eval` runs it
            chosen = buckets[key]
        else:  # within a bucket, the longest-waiting first
            chosen = sorted(buckets[key], key=lambda s: -s.waited)[: self.max_batch_size]
        ids = {id(s) for s in chosen}
        for s in self.in_flight:
            s.waited = 0 if id(s) in ids else s.waited + 1
        return chosen

    def _advance(self, batch: list[_InFlight]) -> list[_Handover]:
        # Everything stays on the engine's device: no host round trip until a sample finishes.
        sigma = torch.stack([s.sigmas[s.step] for s in batch])
        cond = {k: torch.cat([s.cond[k] for s in batch]) for k in batch[0].cond}
        groups = _shape_groups(batch)
        if len(groups) == 1:
            x = torch.stack([s.x for s in batch])
            self._update(batch, x, self.adapter.velocity(x, sigma, cond).float(), sigma)
        else:  # mixed shapes (packed): one forward, then the update per shape group
            vs = self.adapter.velocity_packed([s.x for s in batch], sigma, cond)
            for rows in groups:
                group = [batch[i] for i in rows]
                self._update(group, torch.stack([s.x for s in group]), torch.stack([vs[i] for i in rows]).float(),
                             torch.stack([s.sigmas[s.step] for s in group]))
        self.stats.forwards += 1
        self.stats.sample_steps += len(batch)
        finished = [s for s in batch if s.step == s.request.num_steps]
        if not finished:
            return []
        done = {id(s) for s in finished}
        self.in_flight = [s for s in self.in_flight if id(s) not in done]
        return self._finish(finished)

    def _update(self, batch: list[_InFlight], x: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor) -> None:
        """One ODE/SDE step for `batch` (one latent shape): x `[B, C, H, W]`, v alike, σ `[B]`."""
        sigma_next = torch.stack([s.sigmas[s.step + 1] for s in batch])
        x_next = ode_step(x, v, sigma, sigma_next)
        self._sde_rows(batch, x, v, sigma, sigma_next, x_next)
        for i, s in enumerate(batch):
            s.x = x_next[i]
            s.step += 1

    def _sde_rows(self, batch: list[_InFlight], x: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor,
                  sigma_next: torch.Tensor, x_next: torch.Tensor) -> None:
        """Replace the ODE step by an SDE step for the rows inside their window, one vectorised
        `sde_step` per (noise level, SDE type, trained mask); record their latents and log-probs. A multi-modal
        sample's untrained modality keeps the ODE update and stays out of the log-prob (`sde_step(mask=)`)."""
        kinds: dict[tuple[float, str, int], list[int]] = {}
        for i, s in enumerate(batch):
            if s.step in s.request.window:
                kinds.setdefault((s.request.noise_level, s.request.sde_type, id(s.mask)), []).append(i)
        for (noise_level, sde_type, _), rows in kinds.items():
            idx = self._rows(rows)
            noise = torch.stack([torch.randn(batch[i].x.shape, generator=batch[i].generator, dtype=torch.float32,
                                             device=self.device) for i in rows])
            out = sde_step(x[idx], v[idx], sigma[idx], sigma_next[idx], noise_level, sde_type=sde_type, noise=noise,
                           mask=batch[rows[0]].mask)
            x_next[idx] = out.x_next
            for j, i in enumerate(rows):
                s = batch[i]
                if not s.latents:
                    s.latents.append(s.x.clone())  # a copy: a view would keep the whole batch tensor alive
                s.latents.append(out.x_next[j].clone())
                s.log_probs.append(out.log_prob[j])

    def _rows(self, rows: list[int]) -> slice | torch.Tensor:
        """An index for `rows` that never waits for the device: a slice when they are consecutive
        (the usual case), else an index copied from pinned memory without blocking."""
        if rows == list(range(rows[0], rows[-1] + 1)):
            return slice(rows[0], rows[-1] + 1)
        index = torch.tensor(rows)
        if self.device.type == "cuda":
            return index.pin_memory().to(self.device, non_blocking=True)
        return index.to(self.device)

    def _finish(self, finished: list[_InFlight]) -> list[_Handover]:
        self.stats.finished += len(finished)
        # decode batches by shape (packed steps finish mixed shapes)
        return [self._finish_group([finished[i] for i in rows]) for rows in _shape_groups(finished)]

    def _finish_group(self, finished: list[_InFlight]) -> _Handover:
        """Decode `finished` (one latent shape) and launch its tensors' copies to the host; the
        returned function waits for them and builds the results."""
        x0 = torch.stack([s.x for s in finished])
        decode_media = getattr(self.adapter, "decode_media", None)
        if decode_media is None:
            images, media, names = self.adapter.decode(x0), [], []
        else:  # a multi-modal family: its media travel, the poster stands for the sample as a picture
            batched = decode_media(x0)
            names = sorted(batched)
            media = [batched[k] for k in names]
            images = torch.stack([poster(m) for m in unbatch(batched, x0.shape[0])])
        latents = [torch.stack(s.latents) if s.latents else None for s in finished]
        log_probs = [torch.stack(s.log_probs) if s.log_probs else None for s in finished]
        sigmas = [s.sigmas[s.request.window[0] : s.request.window[-1] + 2] if s.request.window else None
                  for s in finished]
        copy = _HostCopy([images, x0, *latents, *log_probs, *sigmas, *media])
        requests, version = [s.request for s in finished], self.policy_version  # stamped now, not at handover

        def build() -> list[SampleResult]:
            host = copy.wait()
            images, x0 = host[0], host[1]
            n = len(requests)
            latents, log_probs = host[2 : 2 + n], host[2 + n : 2 + 2 * n]
            sigmas, media = host[2 + 2 * n : 2 + 3 * n], dict(zip(names, host[2 + 3 * n :], strict=True))
            results = []
            for i, req in enumerate(requests):
                shape = tuple(x0[i].shape)
                results.append(
                    SampleResult(req, x0[i], images[i],
                                 latents[i] if latents[i] is not None else torch.zeros((0, *shape)),
                                 log_probs[i] if log_probs[i] is not None else torch.zeros(0),
                                 sigmas[i] if sigmas[i] is not None else torch.zeros(0),
                                 version, req.num_steps,
                                 {k: v[i].clone() for k, v in media.items()} if media else None)
                )
            return results

        return build


class _HostCopy:
    """Tensors (None allowed) on their way to the CPU: one device→host copy per dtype, launched
    into pinned memory without waiting for the device; `wait()` returns them on the CPU.

    Why: each `.cpu()` of a device tensor waits for the whole queue, after which the GPU idles
    until the host launches more; a finished group of 32 samples held ~100 such tensors
    (latents, log-probs, σ per sample). Tensors already on the CPU are returned as they are.
    """

    def __init__(self, tensors: list[torch.Tensor | None]) -> None:
        self._tensors: list[torch.Tensor | None] | None = list(tensors)
        if all(t is None or t.device.type == "cpu" for t in tensors):
            return
        self._shapes = [None if t is None else t.shape for t in tensors]
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(tensors):
            if t is not None:
                by_dtype.setdefault(t.dtype, []).append(i)
        self._flat: list[tuple[list[int], torch.Tensor]] = []
        for idx in by_dtype.values():
            flat = torch.cat([tensors[i].reshape(-1) for i in idx])
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            self._flat.append((idx, host))
        self._ready = torch.Event(device=next(t for t in tensors if t is not None).device)
        self._ready.record()
        self._tensors = None  # the device tensors may be freed: the copies are queued behind their producers

    def wait(self) -> list[torch.Tensor | None]:
        """The tensors on the CPU (own storage each: safetensors refuses shared memory); waits
        only for the work queued before the copies."""
        if self._tensors is not None:
            return list(self._tensors)
        self._ready.synchronize()
        out: list[torch.Tensor | None] = [None] * len(self._shapes)
        for idx, host in self._flat:
            sizes = [self._shapes[i].numel() for i in idx]
            for i, part in zip(idx, host.split(sizes), strict=True):
                out[i] = part.view(self._shapes[i]).clone()
        return out


def _shape_groups(batch: list[_InFlight]) -> list[list[int]]:
    """Row indices of `batch` grouped by latent shape, in first-appearance order."""
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(batch):
        groups.setdefault(tuple(s.x.shape), []).append(i)
    return list(groups.values())


def _check_window(req: SampleRequest) -> None:
    w = list(req.window)
    if not w:
        return
    if w != list(range(w[0], w[0] + len(w))):
        raise ValueError(f"request {req.sample_id}: window {w} must be contiguous")
    if w[0] < 0 or w[-1] >= req.num_steps - 1:
        raise ValueError(
            f"request {req.sample_id}: window {w} must lie in [0, num_steps-2] (num_steps={req.num_steps}); "
            "the last denoising step is never stochastic"
        )

"""Torch's fused SDPA kernel against the formula written out: time and peak memory.

The second table (``--sdpa-lengths``, default T = 256 to 2048) puts the kernel that
``F.scaled_dot_product_attention`` runs on this CPU beside the formula written out,
``softmax(q k^T / sqrt(Dh)) v``, as T grows: time, and peak memory read from the allocation
events of ``torch.profiler`` (see :func:`profile_memory`). The formula holds ``(T, S)``
scores, so its memory grows like T^2; the fused kernel works on tiles, and grows like T.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mha.bench.timing import time_rows

FUSED = "F.scaled_dot_product_attention"
EXPLICIT = "softmax(q k^T / sqrt(Dh)) v"
SDPA_KERNEL_PREFIX = "aten::_scaled_dot_product"  # the op F.sdpa dispatches to
SDPA_SHAPE = (1, 8, 64)  # B, H, Dh of the SDPA kernel vs formula table


def explicit_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The formula as written, holding the whole ``(B, H, T, S)`` score matrix."""
    # (B, H, T, Dh) @ (B, H, Dh, S) -> (B, H, T, S)
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    return torch.softmax(scores, dim=-1) @ v  # (B, H, T, S) @ (B, H, S, Dv) -> (B, H, T, Dv)


@dataclass(frozen=True)
class MemoryProfile:
    """What torch's CPU allocator did during each call, read from ``torch.profiler``."""

    peak_bytes: dict[Any, int]  # key -> largest total held above the start of the call
    sdpa_kernels: dict[Any, tuple[str, ...]]  # key -> aten::_scaled_dot_product* ops run


def profile_memory(calls: dict[Any, Callable[[], object]]) -> MemoryProfile:
    """Run each call once under ``torch.profiler.profile(profile_memory=True)``.

    The profiler records every allocation and free of torch's CPU allocator as a
    ``[memory]`` event with a signed size and a time stamp. Within the time window of
    each call (a ``record_function`` range), the running total of those sizes starts at
    0; its largest value is the call's peak: the memory it held at once beyond what
    existed before it (its inputs), its result included. One profiling session for all
    calls, so the profiler starts (and logs its start on stderr) once.

    The events are read from ``prof.profiler.kineto_results``, the list torch's profiler
    keeps; it is not a documented API, so tests/test_bench_sdpa.py checks the peaks this
    gives against allocations whose sizes are known.
    """
    windows = {f"mha.bench call {i}": key for i, key in enumerate(calls)}
    activities = [torch.profiler.ProfilerActivity.CPU]
    with _without_profiler_log(), torch.profiler.profile(
        activities=activities, profile_memory=True
    ) as prof:
        for window, fn in zip(windows, calls.values(), strict=True):
            with torch.profiler.record_function(window):
                fn()
    events = prof.profiler.kineto_results.events()
    spans = {e.name(): (e.start_ns(), e.end_ns()) for e in events if e.name() in windows}
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    peaks, kernels = {}, {}
    for window, key in windows.items():
        start, end = spans[window]
        held = peak = 0
        for stamp, nbytes in memory:
            if start <= stamp <= end:
                held += nbytes
                peak = max(peak, held)
        peaks[key] = peak
        names = (e.name() for e in events if start <= e.start_ns() <= end)
        kernels[key] = tuple(dict.fromkeys(n for n in names if n.startswith(SDPA_KERNEL_PREFIX)))
    return MemoryProfile(peaks, kernels)


_PROFILER_LOG = ("USDT:", "STAGE:")  # how the profiler's own log lines start


@contextmanager
def _without_profiler_log() -> Iterator[None]:
    """Keep the profiler's start/stop log lines (written by C++ straight to file
    descriptor 2, with a time stamp) out of the output; pass any other line on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            for line in log.read().decode(errors="replace").splitlines():
                if not line.startswith(_PROFILER_LOG):
                    print(line, file=sys.stderr)


@dataclass(frozen=True)
class SdpaRow:
    length: int  # T = S
    seconds: dict[str, float]  # label -> median seconds of one call
    peak_bytes: dict[str, int]  # label -> peak bytes of one call


def measure_sdpa(
    lengths: Sequence[int], repeats: int, warmup: int, shape: tuple[int, int, int] = SDPA_SHAPE
) -> tuple[list[SdpaRow], tuple[str, ...]]:
    """Time and profile ``F.scaled_dot_product_attention`` and the explicit formula on
    the same float32 ``q, k, v`` of shape ``(B, H, T, Dh)`` for each ``T``.

    Times first (which also warms both up), then the peak memory of one more call of
    each, all in one profiling session. Returns the rows and the aten kernels that
    ``F.scaled_dot_product_attention`` ran.
    """
    batch, heads, head_dim = shape
    generator = torch.Generator().manual_seed(0)
    calls, seconds = {}, {}
    with torch.no_grad():
        for T in lengths:
            q, k, v = (torch.randn(batch, heads, T, head_dim, generator=generator) for _ in "qkv")
            pair = {
                FUSED: lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v),
                EXPLICIT: lambda q=q, k=k, v=v: explicit_attention(q, k, v),
            }
            times = time_rows(pair, repeats, warmup)
            for label, fn in pair.items():
                calls[T, label] = fn
                seconds[T, label] = statistics.median(times[label])
        memory = profile_memory(calls)
    rows = [
        SdpaRow(
            T,
            {label: seconds[T, label] for label in (FUSED, EXPLICIT)},
            {label: memory.peak_bytes[T, label] for label in (FUSED, EXPLICIT)},
        )
        for T in lengths
    ]
    kernels = tuple(dict.fromkeys(n for T in lengths for n in memory.sdpa_kernels[T, FUSED]))
    return rows, kernels

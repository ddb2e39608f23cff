"""The ceiling: the best rate float32 GEMMs reach on this machine, in this run.

The ceiling is the best rate of a few large float32 ``torch.matmul`` GEMMs ``(n, n) @ (n, n)``
timed in the same run with the same threads (best of 3 at n = 2048 and 4096 by default):
what this machine demonstrably reaches on the work BLAS does best. "% of ceiling" is each
row's GFLOP/s over it. Should a row's fastest call beat every GEMM, that measured rate
becomes the ceiling and the table says so, so no row can show more than 100%.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from mha.bench.config import CEILING_REPEATS, CEILING_SIZES
from mha.bench.flops import gemm_flops


@dataclass(frozen=True)
class Ceiling:
    """The best GFLOP/s measured in this run, and what reached it."""

    gflops: float
    source: str
    gemm_rates: tuple[tuple[int, float], ...]  # (n, GFLOP/s) of every timed n^3 GEMM
    raised_from: float | None = None  # the best GEMM rate, when a row beat it


def measure_ceiling(
    sizes: Iterable[int] = CEILING_SIZES,
    repeats: int = CEILING_REPEATS,
    timer: Callable[[], float] = time.perf_counter,
) -> Ceiling:
    """Best rate of ``repeats`` float32 ``(n, n) @ (n, n)`` products for each ``n``.

    The output buffer is allocated once per size, so page faults on a fresh 64 MB tensor
    are not timed; the first call of each size is timed too and the best call wins, which
    makes a separate warm-up unnecessary.
    """
    generator = torch.Generator().manual_seed(0)
    rates: list[tuple[int, float]] = []
    with torch.no_grad():
        for n in sizes:
            a = torch.randn(n, n, generator=generator)
            b = torch.randn(n, n, generator=generator)
            out = torch.empty(n, n)
            for _ in range(repeats):
                start = timer()
                torch.matmul(a, b, out=out)  # (n, n) @ (n, n) -> (n, n)
                rates.append((n, gemm_flops(n, n, n) / (timer() - start) / 1e9))
    if not rates:
        raise ValueError(f"sizes and repeats give no GEMM to time: {sizes=}, {repeats=}")
    n, best = max(rates, key=lambda r: r[1])
    return Ceiling(best, f"torch.matmul {n}^3", tuple(rates))


def raise_ceiling(ceiling: Ceiling, best_rates: dict[str, float]) -> Ceiling:
    """The ceiling, raised to any row's best rate above it (a rate this run did reach).

    Rows are timed after the GEMMs; a burst of load during the GEMMs could otherwise leave
    the ceiling below what the machine did, and a percentage above 100.
    """
    label, rate = max(best_rates.items(), key=lambda item: item[1], default=("", 0.0))
    if rate <= ceiling.gflops:
        return ceiling
    return Ceiling(rate, f"fastest call of '{label}'", ceiling.gemm_rates, ceiling.gflops)


def percent_of_ceiling(rate: float, ceiling: Ceiling) -> float:
    """``rate`` as a percentage of the ceiling; a rate above it means a broken ceiling."""
    if rate > ceiling.gflops:
        raise ValueError(f"rate {rate:.1f} GFLOP/s is above the ceiling {ceiling.gflops:.1f}")
    return 100 * rate / ceiling.gflops

"""mha.bench.gemm: the measured ceiling, raising it to a faster row, % of ceiling.

The GEMMs are timed with a scripted clock, or the real one only compared with itself.
"""

from __future__ import annotations

import itertools

import pytest

from mha import bench


def scripted_timer(durations):
    """A clock whose successive start/stop pairs are ``durations`` apart."""
    ticks = itertools.accumulate(itertools.chain.from_iterable((1.0, d) for d in durations))
    return lambda: next(ticks)


def test_ceiling_is_the_best_of_all_measured_gemms() -> None:
    durations = [4e-6, 1e-6, 4e-5, 2e-5]  # n=4 twice, then n=8 twice
    ceiling = bench.measure_ceiling((4, 8), repeats=2, timer=scripted_timer(durations))
    flops = [128, 128, 1024, 1024]  # 2 n^3
    rates = [f / d / 1e9 for f, d in zip(flops, durations, strict=True)]
    assert [n for n, _ in ceiling.gemm_rates] == [4, 4, 8, 8]
    assert [r for _, r in ceiling.gemm_rates] == pytest.approx(rates)
    # The best call is n=4's second, neither the last call nor the largest size.
    assert ceiling.gflops == pytest.approx(max(rates)) == pytest.approx(rates[1])
    assert ceiling.source == "torch.matmul 4^3"
    assert ceiling.raised_from is None


def test_ceiling_with_the_real_clock_is_its_own_max() -> None:
    ceiling = bench.measure_ceiling((8, 16), repeats=2)
    assert len(ceiling.gemm_rates) == 4
    assert ceiling.gflops == max(rate for _, rate in ceiling.gemm_rates) > 0


def test_ceiling_needs_a_gemm() -> None:
    with pytest.raises(ValueError, match="sizes"):
        bench.measure_ceiling((), repeats=3)


def test_ceiling_is_raised_to_a_faster_row() -> None:
    gemm = bench.Ceiling(100.0, "torch.matmul 8^3", ((8, 100.0),))
    assert bench.raise_ceiling(gemm, {"a": 99.0, "b": 100.0}) is gemm
    raised = bench.raise_ceiling(gemm, {"a": 99.0, "b": 120.0, "c": 110.0})
    assert raised.gflops == 120.0
    assert raised.raised_from == 100.0
    assert "'b'" in raised.source
    assert raised.gemm_rates == gemm.gemm_rates


def test_percent_of_ceiling_refuses_a_rate_above_it() -> None:
    ceiling = bench.Ceiling(200.0, "torch.matmul 8^3", ((8, 200.0),))
    assert bench.percent_of_ceiling(200.0, ceiling) == 100
    assert bench.percent_of_ceiling(50.0, ceiling) == 25
    with pytest.raises(ValueError, match="above the ceiling"):
        bench.percent_of_ceiling(200.5, ceiling)

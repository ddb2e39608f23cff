"""mha.bench.cpu: what /proc/cpuinfo says, and the FMA peak estimated from it."""

from __future__ import annotations

import pytest

from mha import bench


def cpuinfo(model: str | None, flags: str, mhz: str | None = None, core_ids=(0, 1)) -> str:
    blocks = []
    for processor, core in enumerate(core_ids):
        lines = [f"processor\t: {processor}", "vendor_id\t: GenuineIntel"]
        if model is not None:
            lines.append(f"model name\t: {model}")
        if mhz is not None:
            lines.append(f"cpu MHz\t\t: {mhz}")
        lines += ["physical id\t: 0", f"core id\t\t: {core}", f"flags\t\t: {flags}"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


AVX512 = "fpu sse2 avx fma avx2 avx512f avx512dq avx512bw avx512vl"
AVX2 = "fpu sse2 avx fma avx2"
XEON_SMT = cpuinfo("Intel(R) Xeon(R) Gold 6140 CPU @ 2.30GHz", AVX512, "1200.000", (0, 1, 0, 1))


def test_peak_from_the_clock_in_the_model_name() -> None:
    info = bench.parse_cpuinfo(XEON_SMT)
    assert (info.logical, info.cores) == (4, 2)  # SMT siblings share one core's FMA units
    assert info.clock_ghz == 2.3  # the nominal clock, not the 1.2 GHz of the moment
    peak = bench.estimate_fma_peak(info, threads=4)
    assert (peak.cores, peak.flops_per_cycle, peak.isa) == (2, 64, "AVX-512")
    assert peak.gflops == pytest.approx(2 * 2.3 * 64)
    assert bench.estimate_fma_peak(info, threads=1).gflops == pytest.approx(2.3 * 64)
    assert "2 FMA units" in peak.assumptions and "model name" in peak.assumptions


def test_peak_without_a_clock_is_not_shown() -> None:
    info = bench.parse_cpuinfo(cpuinfo("Intel(R) Xeon(R) Processor", AVX512))
    assert info.model == "Intel(R) Xeon(R) Processor" and info.clock_ghz is None
    assert bench.estimate_fma_peak(info, threads=2) is None
    ceiling = bench.Ceiling(100.0, "torch.matmul 8^3", ((8, 100.0),))
    (note,) = bench.peak_notes(info, 2, ceiling)
    assert note.startswith("FMA peak: not shown: no clock")


def test_peak_falls_back_to_cpu_mhz() -> None:
    info = bench.parse_cpuinfo(cpuinfo("Intel(R) Xeon(R) Processor", AVX512, "2299.998"))
    peak = bench.estimate_fma_peak(info, threads=2)
    assert peak.clock_ghz == pytest.approx(2.299998)
    assert "cpu MHz" in peak.assumptions


def test_peak_follows_the_widest_fma_flag() -> None:
    model = "Intel(R) Core(TM) i7-4770 CPU @ 3.40GHz"
    avx2 = bench.estimate_fma_peak(bench.parse_cpuinfo(cpuinfo(model, AVX2)), threads=2)
    assert (avx2.isa, avx2.flops_per_cycle) == ("AVX2 FMA", 32)
    assert avx2.gflops == pytest.approx(2 * 3.4 * 32)
    no_fma = bench.parse_cpuinfo(cpuinfo(model, "fpu sse2 avx"))
    assert bench.estimate_fma_peak(no_fma, threads=2) is None
    assert "no avx512f or fma flag" in bench.peak_notes(no_fma, 2, bench.Ceiling(1.0, "", ()))[0]


def test_peak_note_says_when_the_ceiling_beats_the_estimate() -> None:
    info = bench.parse_cpuinfo(XEON_SMT)  # estimate 2 x 2.3 x 64 = 294.4 GFLOP/s
    above = bench.peak_notes(info, 2, bench.Ceiling(318.0, "torch.matmul 4096^3", ()))[0]
    assert "108% of it: the cores ran above the clock read" in above
    below = bench.peak_notes(info, 2, bench.Ceiling(147.2, "torch.matmul 4096^3", ()))[0]
    assert "50% of it (a peak" in below


def test_no_cpuinfo_means_no_peak() -> None:
    info = bench.parse_cpuinfo("")
    assert (info.model, info.clock_ghz, info.logical, info.cores) == (None, None, 0, None)
    assert bench.estimate_fma_peak(info, threads=2) is None
    assert bench.read_cpuinfo("/nonexistent/cpuinfo") == ""

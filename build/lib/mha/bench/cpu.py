"""The CPU, from ``/proc/cpuinfo``: model, clock, cores, and an estimated FMA peak.

Where ``/proc/cpuinfo`` gives the CPU model, a clock and a vector FMA flag, the table also
prints an estimated FMA peak (cores x clock x FLOPs per cycle) with its assumptions; the
measured ceiling (:mod:`mha.bench.gemm`) is the number the percentages use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mha.bench.gemm import Ceiling


@dataclass(frozen=True)
class CpuInfo:
    model: str | None
    clock_ghz: float | None
    clock_source: str | None
    flags: frozenset[str]
    logical: int
    cores: int | None  # distinct (physical id, core id): SMT siblings share FMA units


@dataclass(frozen=True)
class PeakEstimate:
    gflops: float
    cores: int
    clock_ghz: float
    flops_per_cycle: int
    isa: str
    assumptions: str


def read_cpuinfo(path: str = "/proc/cpuinfo") -> str:
    """The text of ``/proc/cpuinfo``, or "" where there is none (macOS, Windows)."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def parse_cpuinfo(text: str) -> CpuInfo:
    """Model, clock, flags and core count from the text of ``/proc/cpuinfo``.

    The clock comes from ``@ x.xxGHz`` in the model name (the nominal base clock) or else
    from ``cpu MHz`` (the clock the kernel reported; under a hypervisor, usually the host's).
    """
    blocks = [dict(_fields(block)) for block in re.split(r"\n\s*\n", text)]
    processors = [block for block in blocks if "processor" in block]
    first = processors[0] if processors else (blocks[0] if blocks else {})
    model = first.get("model name") or None
    clock_ghz, clock_source = None, None
    found = re.search(r"@\s*(\d+(?:\.\d+)?)\s*GHz", model or "")
    if found:
        clock_ghz, clock_source = float(found.group(1)), "'@ GHz' in the model name"
    elif first.get("cpu MHz"):
        clock_ghz, clock_source = float(first["cpu MHz"]) / 1000, "'cpu MHz'"
    core_ids = {(b.get("physical id"), b["core id"]) for b in processors if "core id" in b}
    return CpuInfo(
        model=model,
        clock_ghz=clock_ghz,
        clock_source=clock_source,
        flags=frozenset(first.get("flags", "").split()),
        logical=len(processors),
        cores=len(core_ids) or None,
    )


def _fields(block: str) -> Iterable[tuple[str, str]]:
    for line in block.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            yield key.strip(), value.strip()


def _peak_or_reason(info: CpuInfo, threads: int) -> PeakEstimate | str:
    if info.model is None:
        return "no CPU model name in /proc/cpuinfo"
    if info.clock_ghz is None:
        return "no clock in /proc/cpuinfo (no '@ x.xxGHz' in the model name, no 'cpu MHz')"
    if "avx512f" in info.flags:
        isa, per_cycle = "AVX-512", 2 * 16 * 2
        assumptions = (
            "2 FMA units x 16 float32 lanes x 2 FLOPs per cycle per core; parts with one "
            "512-bit FMA unit, and AMD Zen 4 (512 bits as two halves), reach half"
        )
    elif "fma" in info.flags:
        isa, per_cycle = "AVX2 FMA", 2 * 8 * 2
        assumptions = (
            "2 FMA units x 8 float32 lanes x 2 FLOPs per cycle per core; AMD Zen 1 reaches half"
        )
    else:
        return "no avx512f or fma flag in /proc/cpuinfo, so FLOPs per cycle are not known here"
    cores = min(threads, info.cores or info.logical or threads)
    if info.cores is None:
        assumptions += "; core ids not listed, logical CPUs counted as cores"
    return PeakEstimate(
        cores * info.clock_ghz * per_cycle,
        cores,
        info.clock_ghz,
        per_cycle,
        isa,
        f"{assumptions}; clock from {info.clock_source}",
    )


def estimate_fma_peak(info: CpuInfo, threads: int) -> PeakEstimate | None:
    """cores x clock x FLOPs per cycle, or None where model, clock or FMA flag is missing."""
    peak = _peak_or_reason(info, threads)
    return peak if isinstance(peak, PeakEstimate) else None


def peak_notes(info: CpuInfo, threads: int, ceiling: Ceiling) -> list[str]:
    """The FMA peak estimate with its assumptions, or why it is not shown."""
    peak = _peak_or_reason(info, threads)
    if isinstance(peak, str):
        return [f"FMA peak: not shown: {peak}."]
    share = 100 * ceiling.gflops / peak.gflops
    verdict = (
        ": the cores ran above the clock read (turbo), or an assumption is wrong, so the "
        "estimate is no bound here"
        if share > 100
        else " (a peak that holds only while every core keeps the clock read)"
    )
    return [
        f"FMA peak (estimate): {peak.cores} cores x {peak.clock_ghz:.2f} GHz x "
        f"{peak.flops_per_cycle} FLOP/cycle ({peak.isa}) = {peak.gflops:.1f} GFLOP/s; "
        f"assumes {peak.assumptions}. The measured ceiling is {share:.0f}% of it{verdict}.",
    ]

"""Speed of multi-head attention on this machine: ``python -m mha.bench``.

Every implementation runs the same self-attention forward (float32, no autograd) on the
same weights and input, side by side in one run, so the ratios are comparable even
though absolute times depend on the machine. Each row is warmed up, then timed
``--repeats`` times; the table shows the median.

FLOPs of one forward (multiply + add = 2 FLOPs), from :func:`attention_flops`: ``Q K^T``
and ``weights V`` cost ``2 B H T S Dh`` each, and the four projections cost ``2 B T D^2``
(query, output) and ``2 B S D^2`` (key, value). Every attention row computes all six
products; softmax, scaling, masking and bias adds are not counted, so the rates err low.

The ceiling is the best rate of a few large float32 ``torch.matmul`` GEMMs ``(n, n) @ (n, n)``
timed in the same run with the same threads (best of 3 at n = 2048 and 4096 by default):
what this machine demonstrably reaches on the work BLAS does best. "% of ceiling" is each
row's GFLOP/s over it. Should a row's fastest call beat every GEMM, that measured rate
becomes the ceiling and the table says so, so no row can show more than 100%.

Where ``/proc/cpuinfo`` gives the CPU model, a clock and a vector FMA flag, the table also
prints an estimated FMA peak (cores x clock x FLOPs per cycle) with its assumptions; the
measured ceiling is the number the percentages use.

A second table (``--sdpa-lengths``, default T = 256 to 2048) puts the kernel that
``F.scaled_dot_product_attention`` runs on this CPU beside the formula written out,
``softmax(q k^T / sqrt(Dh)) v``, as T grows: time, and peak memory read from the allocation
events of ``torch.profiler`` (see :func:`profile_memory`). The formula holds ``(T, S)``
scores, so its memory grows like T^2; the fused kernel works on tiles, and grows like T.

A third table times greedy decoding with and without the KV cache, side by side in one
run: a Transformer of the tiny translator's shape with random weights generates exactly N
tokens (``--decode-tokens``) both ways, and the table shows the time per token, the
speed-up, and next to it how many times fewer multiply-adds the cache needs: counted by
``FlopCounterMode`` over the whole model, and from :mod:`mha.cost` for one self-attention.

This is a benchmark, not a test: it prints, it never fails on a slow machine.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mha.attention import multi_head_attention
from mha.convert import module_to_torch, params_from_module
from mha.cost import decode_macs_with_cache, decode_macs_without_cache
from mha.modules import MultiHeadAttention
from mha.threads import num_threads
from mha.transformer import Transformer
from mha.translator.decoding import greedy_decode

OURS_WEIGHTS = "mha MultiHeadAttention, weights"
OURS_FAST = "mha MultiHeadAttention, fast path"
TORCH_WEIGHTS = "nn.MultiheadAttention, weights"
TORCH_FAST = "nn.MultiheadAttention, no weights"
SDPA_REF = "projections + F.sdpa (reference)"
PER_HEAD = "per-head loop"
NUMPY = "NumPy multi_head_attention"
MATMUL = "plain matmul (B*T, D) @ (D, 4D)"

# Row label -> the row it is compared with (the one that does the same work).
BASELINE = {
    OURS_WEIGHTS: TORCH_WEIGHTS,
    TORCH_WEIGHTS: TORCH_WEIGHTS,
    PER_HEAD: TORCH_WEIGHTS,
    NUMPY: TORCH_WEIGHTS,
    OURS_FAST: SDPA_REF,
    TORCH_FAST: SDPA_REF,
    SDPA_REF: SDPA_REF,
}
ROW_LABELS = (OURS_WEIGHTS, OURS_FAST, TORCH_WEIGHTS, TORCH_FAST, SDPA_REF, PER_HEAD, NUMPY)
TARGETS = ((OURS_WEIGHTS, 1.25), (OURS_FAST, 1.05))
CEILING_SIZES = (2048, 4096)
CEILING_REPEATS = 3
SDPA_LENGTHS = (256, 512, 1024, 2048)  # T = S of the SDPA kernel vs formula table
SDPA_SHAPE = (1, 8, 64)  # its B, H, Dh

# Greedy decoding, with and without the KV cache: the tiny translator's shape.
DECODE_TOKENS = (16, 64, 256)
DECODE_BATCH = 16
DECODE_REPEATS = 3
DECODE_MODEL = {
    "d_model": 32,
    "num_heads": 2,
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "d_ff": 64,
}
DECODE_VOCAB = 100
DECODE_SOURCE_LENGTH = 12
DECODE_BOS = 1
# An id past the vocabulary: argmax never returns it, so every row decodes all N tokens.
DECODE_NEVER_EOS = DECODE_VOCAB


def gemm_flops(m: int, k: int, n: int) -> int:
    """FLOPs of one ``(m, k) @ (k, n)`` product: ``m n`` dot products of length ``k``."""
    return 2 * m * k * n


def attention_flops(
    batch: int,
    heads: int,
    target_len: int,
    source_len: int,
    head_dim: int,
    *,
    projections: bool = True,
) -> int:
    """FLOPs of one multi-head attention forward, counting matrix products only.

    Parameters
    ----------
    batch, heads, target_len, source_len, head_dim : int
        B, H, T, S and Dh; the model width is ``D = H Dh``.
    projections : bool
        Also count the four ``(., D) @ (D, D)`` projections (W_q W_k W_v W_o).

    Returns
    -------
    int
        ``2 B H T S Dh`` (Q K^T) + ``2 B H T S Dh`` (weights V), plus, with projections,
        ``2 B T D^2`` (W_q) + ``2 B S D^2`` (W_k) + ``2 B S D^2`` (W_v) + ``2 B T D^2`` (W_o).
    """
    B, H, T, S, Dh = batch, heads, target_len, source_len, head_dim
    scores = B * H * gemm_flops(T, Dh, S)  # (T, Dh) @ (Dh, S) per batch and head
    context = B * H * gemm_flops(T, S, Dh)  # (T, S) @ (S, Dh) per batch and head
    total = scores + context
    if projections:
        D = H * Dh
        total += gemm_flops(B * T, D, D) * 2  # W_q on the queries, W_o on the context
        total += gemm_flops(B * S, D, D) * 2  # W_k and W_v on the keys / values
    return total


@dataclass(frozen=True)
class Config:
    batch: int
    length: int
    d_model: int
    heads: int
    repeats: int
    warmup: int
    threads: int | None = None
    ceiling_sizes: tuple[int, ...] = CEILING_SIZES
    ceiling_repeats: int = CEILING_REPEATS
    sdpa_lengths: tuple[int, ...] = SDPA_LENGTHS
    decode_tokens: tuple[int, ...] = DECODE_TOKENS
    decode_batch: int = DECODE_BATCH
    decode_repeats: int = DECODE_REPEATS

    @property
    def attention_flops(self) -> float:
        """Self-attention (S = T) with its four projections, as every attention row runs."""
        B, T, H = self.batch, self.length, self.heads
        return float(attention_flops(B, H, T, T, self.d_model // H))

    @property
    def matmul_flops(self) -> float:
        return float(gemm_flops(self.batch * self.length, self.d_model, 4 * self.d_model))

    def row_flops(self, label: str) -> float:
        return self.matmul_flops if label == MATMUL else self.attention_flops


# ----------------------------------------------------------------------------- ceiling


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


# --------------------------------------------------------------------------- CPU peak


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


# ------------------------------------------------------------------------------ rows


def _wrapped(notes: Sequence[str]) -> list[str]:
    """A table's notes, each wrapped to 100 columns with its continuation indented."""
    return [textwrap.fill(n, width=100, subsequent_indent="  ", break_on_hyphens=False)
            for n in notes]


def time_rows(
    rows: dict[str, Callable[[], object]], repeats: int, warmup: int
) -> dict[str, list[float]]:
    """Wall time in seconds of every timed call of each row.

    The rows take turns (round robin) rather than running one after another: on a
    shared machine, a burst of load then slows every row a little instead of one row a
    lot, which is what keeps the ratios meaningful.
    """
    for _ in range(warmup):
        for fn in rows.values():
            fn()
    times: dict[str, list[float]] = {label: [] for label in rows}
    for _ in range(repeats):
        for label, fn in rows.items():
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    return times


def sdpa_reference(module: MultiHeadAttention, x: Tensor) -> Tensor:
    """The least code that computes the same thing: three projections, SDPA, W_o.

    Three ``F.linear`` calls rather than one on a fused (3D, D) weight: on the 2-core CPU
    this was written on, the fused version (matmul, then split) measured slower.
    """
    B, T, D = x.shape
    H, Dh = module.num_heads, module.head_dim
    q = F.linear(x, module.W_q.weight, module.W_q.bias)  # (B, T, D)
    k = F.linear(x, module.W_k.weight, module.W_k.bias)  # (B, T, D)
    v = F.linear(x, module.W_v.weight, module.W_v.bias)  # (B, T, D)
    q = q.view(B, T, H, Dh).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)
    k = k.view(B, T, H, Dh).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)
    v = v.view(B, T, H, Dh).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)
    context = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, Dh)
    merged = context.transpose(1, 2).reshape(B, T, D)  # (B, H, T, Dh) -> (B, T, D)
    return F.linear(merged, module.W_o.weight, module.W_o.bias)  # (B, T, D)


def per_head_loop(module: MultiHeadAttention, x: Tensor) -> Tensor:
    """One single-head attention per head on sliced weights, then concatenate: the
    'H separate attentions' picture, without batching the heads."""
    Dh = module.head_dim
    contexts = []
    for h in range(module.num_heads):
        rows = slice(h * Dh, (h + 1) * Dh)
        q = F.linear(x, module.W_q.weight[rows], module.W_q.bias[rows])  # (B, T, Dh)
        k = F.linear(x, module.W_k.weight[rows], module.W_k.bias[rows])  # (B, T, Dh)
        v = F.linear(x, module.W_v.weight[rows], module.W_v.bias[rows])  # (B, T, Dh)
        scores = (q * Dh**-0.5) @ k.transpose(1, 2)  # (B, T, Dh) @ (B, Dh, T) -> (B, T, T)
        contexts.append(torch.softmax(scores, dim=-1) @ v)  # (B, T, T) @ (B, T, Dh)
    merged = torch.cat(contexts, dim=-1)  # H x (B, T, Dh) -> (B, T, D)
    return module.W_o(merged)


def bench_rows(config: Config) -> dict[str, Callable[[], object]]:
    """Every row's forward on the same seeded weights and input."""
    torch.manual_seed(0)
    module = MultiHeadAttention(config.d_model, config.heads).eval()
    reference = module_to_torch(module).eval()
    x = torch.randn(config.batch, config.length, config.d_model)
    params = params_from_module(module)  # float32 NumPy copies of the same weights
    x_np = x.numpy()
    wide = torch.randn(config.d_model, 4 * config.d_model)  # the 4 projections side by side
    flat = x.view(-1, config.d_model)  # (B, T, D) -> (B T, D)
    return {
        OURS_WEIGHTS: lambda: module(x, x, x),
        OURS_FAST: lambda: module(x, x, x, need_weights=False),
        # average_attn_weights=False: per-head (B, H, T, S) weights, the same output as ours
        TORCH_WEIGHTS: lambda: reference(x, x, x, average_attn_weights=False),
        TORCH_FAST: lambda: reference(x, x, x, need_weights=False),
        SDPA_REF: lambda: sdpa_reference(module, x),
        PER_HEAD: lambda: per_head_loop(module, x),
        NUMPY: lambda: multi_head_attention(x_np, x_np, x_np, params, config.heads),
        MATMUL: lambda: flat @ wide,  # (B T, D) @ (D, 4D) -> (B T, 4D)
    }


def measure(config: Config) -> dict[str, list[float]]:
    """Seconds of every timed forward of every row, measured in this one run."""
    rows = bench_rows(config)
    with torch.no_grad():
        return time_rows(rows, config.repeats, config.warmup)


# ----------------------------------------------------------------------------- table


def format_table(
    config: Config, times: dict[str, list[float]], ceiling: Ceiling, cpu: CpuInfo
) -> str:
    """The table: medians, ratios to the baseline row, GFLOP/s and % of ceiling.

    ``ceiling`` is the GEMM measurement; it is raised here to any row's fastest call.
    """
    seconds = {label: statistics.median(t) for label, t in times.items()}
    median_rate = {label: config.row_flops(label) / s / 1e9 for label, s in seconds.items()}
    best_rate = {label: config.row_flops(label) / min(t) / 1e9 for label, t in times.items()}
    ceiling = raise_ceiling(ceiling, best_rate)
    threads = torch.get_num_threads()
    B, T, D, H = config.batch, config.length, config.d_model, config.heads
    per_product = attention_flops(B, H, T, T, D // H, projections=False) / 2
    cores = f"{cpu.cores} cores / " if cpu.cores else ""
    gemms = ", ".join(
        f"n={n} {max(r for m, r in ceiling.gemm_rates if m == n):.1f}"
        for n in dict.fromkeys(n for n, _ in ceiling.gemm_rates)
    )
    if ceiling.raised_from is None:
        ceiling_note = (
            f"ceiling: {ceiling.gflops:.1f} GFLOP/s, the best float32 torch.matmul "
            f"(n, n) @ (n, n) of this run (same threads), best of {config.ceiling_repeats} "
            f"per n: {gemms} GFLOP/s"
        )
    else:
        ceiling_note = (
            f"ceiling: {ceiling.gflops:.1f} GFLOP/s, the {ceiling.source}, which beat every "
            f"float32 torch.matmul (n, n) @ (n, n) of this run (best of "
            f"{config.ceiling_repeats} per n: {gemms} GFLOP/s; too small, or slowed by "
            "other load), so the ceiling was raised to it"
        )
    notes = [
        f"multi-head attention forward: B={B}, T=S={T}, D={D}, H={H}, float32, torch.no_grad",
        f"timing: median of {config.repeats} calls per row after {config.warmup} warm-up, "
        "rows taking turns",
        f"machine: {cpu.model or 'CPU model unknown'}, {cores}{cpu.logical} logical CPUs",
        f"torch {torch.__version__}: {threads} threads, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}",
        f"FLOPs per forward: {config.attention_flops / 1e9:.3f} G, matrix products only "
        "(multiply + add = 2), the same for every attention row: Q K^T and weights V "
        f"2*B*H*T*S*Dh = {per_product / 1e9:.3f} G each, projections W_q W_k W_v W_o "
        f"2*B*T*D^2 = {gemm_flops(B * T, D, D) / 1e9:.3f} G each; softmax, scaling and bias "
        "adds not counted. The plain matmul row counts its own 2*(B*T)*D*4D = "
        f"{config.matmul_flops / 1e9:.3f} G.",
        ceiling_note,
        *peak_notes(cpu, threads, ceiling),
        "% of ceiling = GFLOP/s of the median call / ceiling",
    ]
    lines = _wrapped(notes)
    lines += [
        "",
        f"{'implementation':<36} {'ms':>9} {'ratio':>6}  {'baseline':<32} {'GFLOP/s':>8} "
        f"{'% of ceiling':>12}",
    ]
    for label in ROW_LABELS:
        baseline = BASELINE[label]
        lines.append(
            f"{label:<36} {seconds[label] * 1e3:>9.2f} {seconds[label] / seconds[baseline]:>6.2f}  "
            f"{baseline:<32} {median_rate[label]:>8.1f} "
            f"{percent_of_ceiling(median_rate[label], ceiling):>11.0f}%"
        )
    lines.append(
        f"{MATMUL:<36} {seconds[MATMUL] * 1e3:>9.2f} {'':>6}  {'':<32} "
        f"{median_rate[MATMUL]:>8.1f} {percent_of_ceiling(median_rate[MATMUL], ceiling):>11.0f}%"
    )
    lines.append("")
    for label, limit in TARGETS:
        ratio = seconds[label] / seconds[BASELINE[label]]
        verdict = "met" if ratio <= limit else "NOT met"
        lines.append(f"target: {label} <= {limit:.2f} x {BASELINE[label]}: {ratio:.2f} ({verdict})")
    return "\n".join(lines)


# ------------------------------------------------------- SDPA kernel vs the explicit formula

FUSED = "F.scaled_dot_product_attention"
EXPLICIT = "softmax(q k^T / sqrt(Dh)) v"
SDPA_KERNEL_PREFIX = "aten::_scaled_dot_product"  # the op F.sdpa dispatches to


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
    keeps; it is not a documented API, so tests/test_bench.py checks the peaks this
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


def format_sdpa_table(
    rows: Sequence[SdpaRow],
    kernels: Sequence[str],
    repeats: int,
    warmup: int,
    shape: tuple[int, int, int] = SDPA_SHAPE,
) -> str:
    """Time and peak memory of the fused kernel and of the formula, side by side per T."""
    batch, heads, head_dim = shape
    notes = [
        f"F.scaled_dot_product_attention vs the explicit formula {EXPLICIT}: "
        f"B={batch}, H={heads}, Dh={head_dim}, S=T, no mask, float32, torch.no_grad, "
        f"{torch.get_num_threads()} threads",
        f"kernel torch ran for F.scaled_dot_product_attention: "
        f"{', '.join(kernels) or 'no aten::_scaled_dot_product* op recorded'}",
        f"time: median of {repeats} calls after {warmup} warm-up, the two taking turns",
        "peak: the most memory torch's CPU allocator held at once during one call beyond "
        "what it held before (inputs not counted, result counted), measured with "
        "torch.profiler.profile(profile_memory=True) from its allocation events",
        "one score matrix: B*H*T*S*4 bytes, what the formula must hold (twice, while it divides)",
    ]
    lines = _wrapped(notes)
    lines += [
        "",
        f"{'T':>6} {'sdpa ms':>9} {'formula ms':>11} {'ratio':>6} {'sdpa MB':>9} "
        f"{'formula MB':>11} {'ratio':>6} {'one score matrix MB':>20}",
    ]
    for row in rows:
        fast, slow = row.seconds[FUSED], row.seconds[EXPLICIT]
        small, big = row.peak_bytes[FUSED], row.peak_bytes[EXPLICIT]
        memory_ratio = f"{big / small:>6.1f}" if small else f"{'-':>6}"
        scores_mb = batch * heads * row.length * row.length * 4 / 2**20
        lines.append(
            f"{row.length:>6} {fast * 1e3:>9.2f} {slow * 1e3:>11.2f} {slow / fast:>6.2f} "
            f"{small / 2**20:>9.2f} {big / 2**20:>11.2f} {memory_ratio} {scores_mb:>20.2f}"
        )
    lines.append("ratio = formula / sdpa; MB = 2^20 bytes")
    return "\n".join(lines)


def sdpa_section(config: Config) -> str:
    """The SDPA table for ``config.sdpa_lengths``: measured, then formatted."""
    rows, kernels = measure_sdpa(config.sdpa_lengths, config.repeats, config.warmup)
    return format_sdpa_table(rows, kernels, config.repeats, config.warmup)


# ---------------------------------------------------------------------------- decoding


@dataclass(frozen=True)
class DecodeRow:
    """Greedy decoding of ``new_tokens`` tokens, with and without the KV cache."""

    new_tokens: int
    seconds_without: list[float]  # every timed run without the cache
    seconds_with: list[float]  # every timed run with it
    macs_without: int  # counted over the whole model
    macs_with: int
    same_tokens: bool

    @property
    def speedup(self) -> float:
        """Median time without the cache over median time with it."""
        return statistics.median(self.seconds_without) / statistics.median(self.seconds_with)

    @property
    def macs_ratio(self) -> float:
        """Multiply-adds without the cache over with it, counted over the whole model."""
        return self.macs_without / self.macs_with


def decode_model(max_new_tokens: int, batch: int) -> tuple[Transformer, Tensor]:
    """A seeded Transformer of the translator's shape (random weights) and a random
    ``(batch, DECODE_SOURCE_LENGTH)`` source to translate."""
    torch.manual_seed(0)
    max_len = max(max_new_tokens + 1, DECODE_SOURCE_LENGTH)  # <s> + N tokens
    model = Transformer(DECODE_VOCAB, DECODE_VOCAB, max_len=max_len, **DECODE_MODEL).eval()
    generator = torch.Generator().manual_seed(1)
    # ids from 3: not padding (0), <s> (1) or </s> (2)
    src = torch.randint(3, DECODE_VOCAB, (batch, DECODE_SOURCE_LENGTH), generator=generator)
    return model, src


def counted_macs(run: Callable[[], Tensor]) -> tuple[int, Tensor]:
    """Multiply-adds of the matrix products ``run()`` executes, as torch counts them, and
    what ``run()`` returned.

    SDPA runs in its math form, whose matmuls the counter sees (it does not see inside
    the fused CPU kernel); the arithmetic is the same.
    """
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = run()
    return counter.get_total_flops() // 2, out  # FLOPs = 2 x multiply-adds


def self_attention_macs_ratio(new_tokens: int) -> float:
    """Multiply-adds of one decoder self-attention over ``new_tokens`` greedy steps,
    without the cache over with it (:mod:`mha.cost`). Step ``p`` computes position
    ``p`` after ``p`` earlier ones; layers and batch size cancel in the ratio."""
    d_model, heads = DECODE_MODEL["d_model"], DECODE_MODEL["num_heads"]
    steps = range(new_tokens)
    without = sum(decode_macs_without_cache(d_model, heads, p) for p in steps)
    return without / sum(decode_macs_with_cache(d_model, heads, p) for p in steps)


def measure_decode(tokens: Sequence[int], batch: int, repeats: int) -> list[DecodeRow]:
    """Time and count greedy decoding of each ``N`` in ``tokens``, with and without the
    cache, on one model. The timed runs take turns (see :func:`time_rows`) after one
    short untimed run each way.

    One torch thread, as :class:`mha.translator.Translator` decodes: at these sizes a
    second thread only adds synchronisation (see :func:`mha.threads.num_threads`).
    """
    with num_threads(1):
        return _measure_decode(tokens, batch, repeats)


def _measure_decode(tokens: Sequence[int], batch: int, repeats: int) -> list[DecodeRow]:
    model, src = decode_model(max(tokens), batch)

    def run(n: int, use_cache: bool) -> Callable[[], Tensor]:
        return lambda: greedy_decode(
            model, src, DECODE_BOS, DECODE_NEVER_EOS, max_new_tokens=n, use_cache=use_cache
        )

    run(min(tokens), False)(), run(min(tokens), True)()  # warm-up
    label = {(n, cache): f"N={n}, {'cache' if cache else 'no cache'}"
             for n in tokens for cache in (False, True)}  # fmt: skip
    times = time_rows({label[key]: run(*key) for key in label}, repeats, warmup=0)
    result = []
    for n in tokens:
        macs_without, without = counted_macs(run(n, False))  # (B, N) token ids
        macs_with, with_cache = counted_macs(run(n, True))
        result.append(
            DecodeRow(
                new_tokens=n,
                seconds_without=times[label[n, False]],
                seconds_with=times[label[n, True]],
                macs_without=macs_without,
                macs_with=macs_with,
                same_tokens=without.shape == (batch, n) and torch.equal(without, with_cache),
            )
        )
    return result


def format_decode_table(rows: Sequence[DecodeRow], batch: int, repeats: int) -> str:
    """The decoding table: ms per token both ways, speed-up, and the multiply-add ratios."""
    shape = ", ".join(f"{name}={value}" for name, value in DECODE_MODEL.items())
    same = all(row.same_tokens for row in rows)
    notes = [
        "greedy decoding, every step running the decoder on the whole prefix (no cache) or "
        f"on the newest position only (KV cache): Transformer({shape}), vocabulary "
        f"{DECODE_VOCAB}, random weights (seed 0), float32, torch.no_grad; batch {batch}, "
        f"source {DECODE_SOURCE_LENGTH} tokens; each run generates exactly N tokens",
        f"timing: median of {repeats} runs per row and N, rows taking turns, one torch "
        "thread (as mha.translator decodes); ms per generated token (the whole batch)",
        "MACs ratio: multiply-adds without / with the cache; model: the whole greedy decode "
        "(encoder, decoder, output layer) counted by torch's FlopCounterMode, SDPA in its "
        "math form; self-attention: one decoder self-attention over the N steps, from "
        "mha.cost",
        "same tokens with and without the cache: "
        + ("yes, every row and N" if same else "NO (see DecodeRow.same_tokens)"),
    ]
    lines = _wrapped(notes)
    lines += [
        "",
        f"{'new tokens':>10} {'ms/token, no cache':>19} {'ms/token, cache':>16} "
        f"{'speed-up':>9} {'MACs ratio: model':>18} {'self-attention':>15}",
    ]
    for row in rows:
        per_token = [1e3 * statistics.median(t) / row.new_tokens
                     for t in (row.seconds_without, row.seconds_with)]  # fmt: skip
        lines.append(
            f"{row.new_tokens:>10} {per_token[0]:>19.3f} {per_token[1]:>16.3f} "
            f"{row.speedup:>8.2f}x {row.macs_ratio:>17.1f}x "
            f"{self_attention_macs_ratio(row.new_tokens):>14.1f}x"
        )
    return "\n".join(lines)


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of sizes: {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes must be >= 1: {text!r}")
    return sizes


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m mha.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8, help="B (default 8)")
    parser.add_argument("--length", type=int, default=512, help="T = S (default 512)")
    parser.add_argument("--d-model", type=int, default=768, help="D (default 768)")
    parser.add_argument("--heads", type=int, default=12, help="H (default 12)")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per row")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per row first")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's choice)"
    )
    parser.add_argument(
        "--ceiling-sizes",
        type=_sizes,
        default=CEILING_SIZES,
        help="n of the n^3 GEMMs that measure the ceiling (default 2048,4096)",
    )
    parser.add_argument(
        "--ceiling-repeats", type=int, default=CEILING_REPEATS, help="GEMMs per size (default 3)"
    )
    parser.add_argument(
        "--sdpa-lengths",
        type=_sizes,
        default=None,
        help="T = S of the F.scaled_dot_product_attention vs formula table "
        "(default 256,512,1024,2048; 256,512 with --quick)",
    )
    parser.add_argument(
        "--decode-tokens",
        type=_sizes,
        default=DECODE_TOKENS,
        help="N, new tokens per greedy decoding run (default 16,64,256)",
    )
    parser.add_argument(
        "--decode-batch", type=int, default=DECODE_BATCH, help="sentences decoded at once"
    )
    parser.add_argument(
        "--decode-repeats", type=int, default=DECODE_REPEATS, help="timed decoding runs per N"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="B=2, T=128, D=256, H=4; SDPA T=256,512; decode N=8,32",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.length, args.d_model, args.heads = 2, 128, 256, 4
        if args.decode_tokens == DECODE_TOKENS:
            args.decode_tokens = (8, 32)
    if args.sdpa_lengths is None:
        args.sdpa_lengths = SDPA_LENGTHS[:2] if args.quick else SDPA_LENGTHS
    names = ("batch", "length", "d_model", "heads", "repeats", "ceiling_repeats",
             "decode_batch", "decode_repeats")  # fmt: skip
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}")
    return Config(
        args.batch,
        args.length,
        args.d_model,
        args.heads,
        args.repeats,
        args.warmup,
        args.threads,
        args.ceiling_sizes,
        args.ceiling_repeats,
        sdpa_lengths=args.sdpa_lengths,
        decode_tokens=args.decode_tokens,
        decode_batch=args.decode_batch,
        decode_repeats=args.decode_repeats,
    )


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    previous = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        ceiling = measure_ceiling(config.ceiling_sizes, config.ceiling_repeats)
        times = measure(config)
        print(format_table(config, times, ceiling, parse_cpuinfo(read_cpuinfo())))
        print("\n" + sdpa_section(config))
        print()
        rows = measure_decode(config.decode_tokens, config.decode_batch, config.decode_repeats)
        print(format_decode_table(rows, config.decode_batch, config.decode_repeats))
    finally:
        torch.set_num_threads(previous)


if __name__ == "__main__":
    main()


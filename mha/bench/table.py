"""The three tables as text: notes wrapped to 100 columns, then aligned columns."""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Sequence

import torch

from mha.bench.config import BASELINE, MATMUL, ROW_LABELS, TARGETS, Config
from mha.bench.cpu import CpuInfo, peak_notes
from mha.bench.decode import (
    DECODE_MODEL,
    DECODE_SOURCE_LENGTH,
    DECODE_VOCAB,
    DecodeRow,
    self_attention_macs_ratio,
)
from mha.bench.flops import attention_flops, gemm_flops
from mha.bench.gemm import Ceiling, percent_of_ceiling, raise_ceiling
from mha.bench.sdpa import EXPLICIT, FUSED, SDPA_SHAPE, SdpaRow


def _wrapped(notes: Sequence[str]) -> list[str]:
    """A table's notes, each wrapped to 100 columns with its continuation indented."""
    return [textwrap.fill(n, width=100, subsequent_indent="  ", break_on_hyphens=False)
            for n in notes]


def format_table(
    config: Config,
    times: dict[str, list[float]],
    ceiling: Ceiling,
    cpu: CpuInfo,
    target_ratios: dict[str, list[float]] | None = None,
) -> str:
    """The table: medians, ratios to the baseline row, GFLOP/s and % of ceiling.

    ``ceiling`` is the GEMM measurement; it is raised here to any row's fastest call.
    ``target_ratios`` (from :func:`mha.bench.attention.measure_targets`) decide the
    targets; without them, the table's own ratios do.
    """
    seconds = {label: statistics.median(t) for label, t in times.items()}
    # Each round times every row once: a ratio per round, then their median, cancels
    # the load that slows a whole round (the medians of each row alone do not).
    ratio = {
        label: statistics.median(a / b for a, b in zip(times[label], times[base], strict=True))
        for label, base in BASELINE.items()
    }
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
        "ratio = the median, over the rounds, of the row's time / its baseline's time in "
        "the same round",
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
            f"{label:<36} {seconds[label] * 1e3:>9.2f} {ratio[label]:>6.2f}  "
            f"{baseline:<32} {median_rate[label]:>8.1f} "
            f"{percent_of_ceiling(median_rate[label], ceiling):>11.0f}%"
        )
    lines.append(
        f"{MATMUL:<36} {seconds[MATMUL] * 1e3:>9.2f} {'':>6}  {'':<32} "
        f"{median_rate[MATMUL]:>8.1f} {percent_of_ceiling(median_rate[MATMUL], ceiling):>11.0f}%"
    )
    lines.append("")
    if target_ratios:
        pairs = len(next(iter(target_ratios.values())))
        lines.append(f"targets: the two rows alone, taking turns, median of {pairs} ratios")
    for label, limit in TARGETS:
        value = statistics.median(target_ratios[label]) if target_ratios else ratio[label]
        verdict = "met" if value <= limit else "NOT met"
        lines.append(
            f"target: {label} <= {limit:.2f} x {BASELINE[label]}: {value:.2f} ({verdict})"
        )
    return "\n".join(lines)


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

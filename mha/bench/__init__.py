"""Benchmarks of multi-head attention on this machine, run side by side: ``python -m mha.bench``.

It sits on the top floor of :mod:`mha` and has one module per job, each below the
ones that use it:

* :mod:`~mha.bench.flops`: FLOP formulas, and torch's own multiply-add count of code
  that runs (:func:`counted_macs`);
* :mod:`~mha.bench.config`: what a run measures: :class:`Config`, the rows of the
  attention table, the defaults of the options;
* :mod:`~mha.bench.timing`: calls timed side by side, taking turns (:func:`time_rows`);
* :mod:`~mha.bench.gemm`: the ceiling, the best rate of large GEMMs in this run;
* :mod:`~mha.bench.cpu`: the CPU read from ``/proc/cpuinfo``, and its estimated FMA peak;
* :mod:`~mha.bench.attention`: every implementation's attention forward (first table);
* :mod:`~mha.bench.sdpa`: torch's fused SDPA kernel against the formula written out, in
  time and peak memory (second table);
* :mod:`~mha.bench.decode`: greedy decoding with and without the KV cache (third table);
* :mod:`~mha.bench.table`: the three tables as text;
* :mod:`~mha.bench.cli`: the command line (:func:`parse_args`, :func:`main`).

This is a benchmark, not a test: it prints, it never fails on a slow machine. The names
below are the ones the chapters and tests use, e.g. ``bench.measure_sdpa``.
"""

from mha.bench.attention import (
    bench_rows,
    measure,
    measure_targets,
    per_head_loop,
    sdpa_reference,
)
from mha.bench.cli import main, parse_args, sdpa_section
from mha.bench.config import (
    BASELINE,
    CEILING_REPEATS,
    CEILING_SIZES,
    DECODE_BATCH,
    DECODE_REPEATS,
    DECODE_TOKENS,
    MATMUL,
    NUMPY,
    OURS_FAST,
    OURS_WEIGHTS,
    PER_HEAD,
    ROW_LABELS,
    SDPA_LENGTHS,
    SDPA_REF,
    TARGETS,
    TORCH_FAST,
    TORCH_WEIGHTS,
    Config,
)
from mha.bench.cpu import (
    CpuInfo,
    PeakEstimate,
    estimate_fma_peak,
    parse_cpuinfo,
    peak_notes,
    read_cpuinfo,
)
from mha.bench.decode import (
    DECODE_BOS,
    DECODE_MODEL,
    DECODE_NEVER_EOS,
    DECODE_SOURCE_LENGTH,
    DECODE_VOCAB,
    DecodeRow,
    decode_model,
    measure_decode,
    self_attention_macs_ratio,
)
from mha.bench.flops import attention_flops, counted_macs, gemm_flops
from mha.bench.gemm import Ceiling, measure_ceiling, percent_of_ceiling, raise_ceiling
from mha.bench.sdpa import (
    EXPLICIT,
    FUSED,
    SDPA_KERNEL_PREFIX,
    SDPA_SHAPE,
    MemoryProfile,
    SdpaRow,
    explicit_attention,
    measure_sdpa,
    profile_memory,
)
from mha.bench.table import format_decode_table, format_sdpa_table, format_table
from mha.bench.timing import time_rows

__all__ = [
    "BASELINE",
    "CEILING_REPEATS",
    "CEILING_SIZES",
    "Ceiling",
    "Config",
    "CpuInfo",
    "DECODE_BATCH",
    "DECODE_BOS",
    "DECODE_MODEL",
    "DECODE_NEVER_EOS",
    "DECODE_REPEATS",
    "DECODE_SOURCE_LENGTH",
    "DECODE_TOKENS",
    "DECODE_VOCAB",
    "DecodeRow",
    "EXPLICIT",
    "FUSED",
    "MATMUL",
    "MemoryProfile",
    "NUMPY",
    "OURS_FAST",
    "OURS_WEIGHTS",
    "PER_HEAD",
    "PeakEstimate",
    "ROW_LABELS",
    "SDPA_KERNEL_PREFIX",
    "SDPA_LENGTHS",
    "SDPA_REF",
    "SDPA_SHAPE",
    "SdpaRow",
    "TARGETS",
    "TORCH_FAST",
    "TORCH_WEIGHTS",
    "attention_flops",
    "bench_rows",
    "counted_macs",
    "decode_model",
    "estimate_fma_peak",
    "explicit_attention",
    "format_decode_table",
    "format_sdpa_table",
    "format_table",
    "gemm_flops",
    "main",
    "measure",
    "measure_targets",
    "measure_ceiling",
    "measure_decode",
    "measure_sdpa",
    "parse_args",
    "parse_cpuinfo",
    "peak_notes",
    "per_head_loop",
    "percent_of_ceiling",
    "profile_memory",
    "raise_ceiling",
    "read_cpuinfo",
    "sdpa_reference",
    "sdpa_section",
    "self_attention_macs_ratio",
    "time_rows",
]

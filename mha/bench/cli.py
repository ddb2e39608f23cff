"""Speed of multi-head attention on this machine: ``python -m mha.bench``.

The command line: its options (:func:`parse_args`), then :func:`main` measures the
ceiling and the three benchmarks with the same threads and prints their tables.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch

from mha.bench.attention import measure, measure_targets
from mha.bench.config import (
    CEILING_REPEATS,
    CEILING_SIZES,
    DECODE_BATCH,
    DECODE_REPEATS,
    DECODE_TOKENS,
    SDPA_LENGTHS,
    Config,
)
from mha.bench.cpu import parse_cpuinfo, read_cpuinfo
from mha.bench.decode import measure_decode
from mha.bench.gemm import measure_ceiling
from mha.bench.sdpa import measure_sdpa
from mha.bench.table import format_decode_table, format_sdpa_table, format_table


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


def sdpa_section(config: Config) -> str:
    """The SDPA table for ``config.sdpa_lengths``: measured, then formatted."""
    rows, kernels = measure_sdpa(config.sdpa_lengths, config.repeats, config.warmup)
    return format_sdpa_table(rows, kernels, config.repeats, config.warmup)


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    previous = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        ceiling = measure_ceiling(config.ceiling_sizes, config.ceiling_repeats)
        times = measure(config)
        targets = measure_targets(config)
        print(format_table(config, times, ceiling, parse_cpuinfo(read_cpuinfo()), targets))
        print("\n" + sdpa_section(config))
        print()
        rows = measure_decode(config.decode_tokens, config.decode_batch, config.decode_repeats)
        print(format_decode_table(rows, config.decode_batch, config.decode_repeats))
    finally:
        torch.set_num_threads(previous)

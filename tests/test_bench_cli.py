"""mha.bench.cli: `python -m mha.bench` at tiny sizes (the tables, not the timings), and
its options."""

from __future__ import annotations

import re

import pytest

from mha import bench


def test_main_prints_the_ceiling_and_the_machine(capsys) -> None:
    bench.main(["--batch", "1", "--length", "4", "--d-model", "8", "--heads", "2",
                "--repeats", "1", "--warmup", "0",
                "--ceiling-sizes", "16,32", "--ceiling-repeats", "1",
                "--sdpa-lengths", "8", "--decode-tokens", "2", "--decode-batch", "1",
                "--decode-repeats", "1"])  # fmt: skip
    out = " ".join(capsys.readouterr().out.split())  # the notes are wrapped
    assert "% of ceiling" in out and "CPU capability" in out
    assert "best of 1 per n: n=16" in out
    assert "FMA peak" in out


def test_ceiling_options_are_checked() -> None:
    assert bench.parse_args(["--ceiling-sizes", "64,128"]).ceiling_sizes == (64, 128)
    assert bench.parse_args([]).ceiling_sizes == (2048, 4096)
    for bad in (["--ceiling-sizes", "64,x"], ["--ceiling-sizes", "0"], ["--ceiling-repeats", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


BENCH_ROWS = [
    "mha MultiHeadAttention, weights",
    "mha MultiHeadAttention, fast path",
    "nn.MultiheadAttention, weights",
    "nn.MultiheadAttention, no weights",
    "projections + F.sdpa (reference)",
    "per-head loop",
    "NumPy multi_head_attention",
    "plain matmul (B*T, D) @ (D, 4D)",
]


def test_bench_prints_every_row(capsys) -> None:
    """Smoke test of `python -m mha.bench` at tiny sizes: the table, not the timings."""
    bench.main(["--batch", "2", "--length", "8", "--d-model", "16", "--heads", "2",
                "--repeats", "1", "--warmup", "0",
                "--ceiling-sizes", "32", "--ceiling-repeats", "1",
                "--sdpa-lengths", "8,16", "--decode-tokens", "2,3", "--decode-batch", "2",
                "--decode-repeats", "1"])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert any("B=2, T=S=8, D=16, H=2" in line for line in lines)
    for label in BENCH_ROWS:
        row = [line for line in lines if line.startswith(label)]
        assert len(row) == 1, label
        numbers = re.findall(r"\d+\.\d+", row[0][len(label) :])
        assert len(numbers) >= 2, row[0]  # ms and GFLOP/s (ratio too, except the matmul)
    assert sum(line.startswith("target:") for line in lines) == 2
    kernel_note = "kernel torch ran for F.scaled_dot_product_attention"
    assert any(line.startswith(kernel_note) for line in lines)
    decode_rows = [line.split() for line in lines if re.match(r"\s+[23] ", line)]
    assert [row[0] for row in decode_rows] == ["2", "3"]  # the decoding table, one row per N


def test_sdpa_lengths_option() -> None:
    assert bench.parse_args([]).sdpa_lengths == (256, 512, 1024, 2048)
    assert bench.parse_args(["--quick"]).sdpa_lengths == (256, 512)
    assert bench.parse_args(["--sdpa-lengths", "64,128"]).sdpa_lengths == (64, 128)
    for bad in (["--sdpa-lengths", "0"], ["--sdpa-lengths", "a"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_decode_options() -> None:
    default = bench.parse_args([])
    assert (default.decode_tokens, default.decode_batch, default.decode_repeats) == (
        (16, 64, 256), 16, 3,
    )
    assert bench.parse_args(["--quick"]).decode_tokens == (8, 32)
    assert bench.parse_args(["--quick", "--decode-tokens", "5"]).decode_tokens == (5,)
    for bad in (["--decode-tokens", "0"], ["--decode-batch", "0"], ["--decode-repeats", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)

"""mha.bench.table: the tables laid out from made-up timings, so nothing here depends on
the machine's speed."""

from __future__ import annotations

import re

import torch
from test_bench_cpu import XEON_SMT

from mha import bench

CONFIG = bench.Config(batch=2, length=8, d_model=16, heads=2, repeats=3, warmup=0)
ALL_ROWS = (*bench.ROW_LABELS, bench.MATMUL)


def seconds_for(rate_gflops: float, label: str) -> float:
    return CONFIG.row_flops(label) / rate_gflops / 1e9


def table_percentages(table: str) -> dict[str, float]:
    rows = {}
    for label in ALL_ROWS:
        (line,) = [line for line in table.splitlines() if line.startswith(label)]
        rows[label] = float(re.fullmatch(r".* (\d+)%", line).group(1))
    return rows


def test_table_with_a_row_faster_than_the_gemms_stays_at_or_below_100() -> None:
    gemm = bench.Ceiling(10.0, "torch.matmul 8^3", ((8, 9.0), (8, 10.0)))
    times = {label: [seconds_for(5.0, label)] * 3 for label in ALL_ROWS}
    # The per-head loop's fastest call reaches 40 GFLOP/s, its median 30: both beat the GEMMs.
    times[bench.PER_HEAD] = [seconds_for(r, bench.PER_HEAD) for r in (40.0, 30.0, 20.0)]
    table = bench.format_table(CONFIG, times, gemm, bench.parse_cpuinfo(XEON_SMT))
    percentages = table_percentages(table)
    table = " ".join(table.split())  # the notes are wrapped
    assert max(percentages.values()) <= 100
    assert percentages[bench.PER_HEAD] == 75  # 30 of the raised ceiling 40
    assert percentages[bench.OURS_WEIGHTS] == 12  # 5 of 40, rounded
    assert "ceiling: 40.0 GFLOP/s, the fastest call of 'per-head loop'" in table
    assert "raised" in table


def test_table_uses_the_gemm_ceiling_when_no_row_beats_it() -> None:
    gemm = bench.Ceiling(50.0, "torch.matmul 8^3", ((4, 20.0), (8, 50.0)))
    times = {label: [seconds_for(10.0, label)] * 3 for label in ALL_ROWS}
    times[bench.MATMUL] = [seconds_for(50.0, bench.MATMUL)] * 3  # exactly at the ceiling
    table = bench.format_table(CONFIG, times, gemm, bench.parse_cpuinfo(""))
    percentages = table_percentages(table)
    table = " ".join(table.split())  # the notes are wrapped
    assert percentages[bench.MATMUL] == 100
    assert percentages[bench.NUMPY] == 20
    assert "ceiling: 50.0 GFLOP/s, the best float32 torch.matmul" in table
    assert "n=4 20.0, n=8 50.0 GFLOP/s" in table
    assert "raised" not in table
    assert "FMA peak: not shown: no CPU model name" in table
    assert f"{torch.get_num_threads()} threads" in table
    assert f"CPU capability {torch.backends.cpu.get_cpu_capability()}" in table


def test_sdpa_table_puts_each_number_in_its_column() -> None:
    MB = 2**20
    row = bench.SdpaRow(
        512, {bench.FUSED: 0.002, bench.EXPLICIT: 0.006}, {bench.FUSED: MB, bench.EXPLICIT: 8 * MB}
    )
    table = bench.format_sdpa_table([row], ["aten::k"], repeats=3, warmup=1, shape=(1, 8, 64))
    (line,) = [line for line in table.splitlines() if line.split()[:1] == ["512"]]
    # T, sdpa ms, formula ms, ratio, sdpa MB, formula MB, ratio, one score matrix (8 MB)
    assert line.split() == ["512", "2.00", "6.00", "3.00", "1.00", "8.00", "8.0", "8.00"]
    assert "median of 3 calls after 1 warm-up" in " ".join(table.split())

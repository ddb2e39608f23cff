"""mha.bench's arithmetic: FLOP counts, the measured ceiling, % of ceiling, the FMA peak.

None of these tests times anything that could fail on a slow machine: timings come
from a scripted clock or are only compared with themselves.
"""

from __future__ import annotations

import itertools
import os
import re

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mha import bench, cost

# ------------------------------------------------------------------------------ FLOPs


def test_attention_flops_by_hand() -> None:
    # B=2, H=3, T=4, S=5, Dh=6, so D=18.
    # Q K^T: 2*2*3*4*5*6 = 1440; weights V: the same.
    assert bench.attention_flops(2, 3, 4, 5, 6, projections=False) == 2880
    # W_q, W_o: 2*(2*4)*18*18 = 5184 each; W_k, W_v: 2*(2*5)*18*18 = 6480 each.
    assert bench.attention_flops(2, 3, 4, 5, 6) == 2880 + 2 * 5184 + 2 * 6480
    # One of everything: two 1-term dot products and four 1x1 projections, 2 FLOPs each.
    assert bench.attention_flops(1, 1, 1, 1, 1) == 12
    assert bench.gemm_flops(2, 3, 4) == 48  # 2*4 dot products of length 3


def test_config_counts_self_attention_with_projections() -> None:
    config = bench.Config(batch=2, length=4, d_model=18, heads=3, repeats=1, warmup=0)
    # 2 * 2 B T T D (attention) + 4 * 2 B T D^2 (projections) = 2304 + 20736
    assert config.attention_flops == 23040
    assert config.matmul_flops == 2 * 8 * 18 * 72
    assert config.row_flops(bench.MATMUL) == config.matmul_flops
    assert config.row_flops(bench.PER_HEAD) == config.attention_flops


@pytest.mark.parametrize(
    "label", [bench.OURS_WEIGHTS, bench.TORCH_WEIGHTS, bench.SDPA_REF, bench.PER_HEAD, bench.MATMUL]
)
def test_flop_count_matches_torch_flop_counter(label, one_torch_thread) -> None:
    """Oracle: PyTorch's own counter over the row's real forward (SDPA in its math form,
    since the counter does not see inside the fused CPU kernel)."""
    config = bench.Config(batch=2, length=4, d_model=18, heads=3, repeats=1, warmup=0)
    forward = bench.bench_rows(config)[label]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as count:
        forward()
    assert count.get_total_flops() == config.row_flops(label)


# ---------------------------------------------------------------------------- ceiling


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


# --------------------------------------------------------------------------- FMA peak


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


# ------------------------------------------------- SDPA kernel vs the explicit formula


def test_explicit_formula_equals_torch_sdpa() -> None:
    q, k, v = torch.randn(3, 2, 2, 7, 8, dtype=torch.float64).unbind(0)  # (B, H, T, Dh) each
    expected = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(bench.explicit_attention(q, k, v), expected, rtol=0, atol=1e-12)


def test_profiled_peak_of_known_allocations() -> None:
    def alloc() -> torch.Tensor:
        a = torch.empty(1000)  # 4000 bytes
        b = torch.empty(3000)  # 12000 bytes: 16000 held at once
        del a
        return torch.empty(500) + b[:500]  # 2000 + 2000 after a was freed

    def nothing() -> None:
        return None

    memory = bench.profile_memory({"alloc": alloc, "nothing": nothing})
    assert memory.peak_bytes == {"alloc": 16000, "nothing": 0}
    assert memory.sdpa_kernels == {"alloc": (), "nothing": ()}


def test_the_profiler_log_is_kept_out_of_stderr(capfd) -> None:
    memory = bench.profile_memory({"ones": lambda: torch.ones(10) + 1})
    err = capfd.readouterr().err
    assert memory.peak_bytes["ones"] > 0
    assert "USDT" not in err and "profiler_start" not in err


def test_other_lines_on_stderr_still_come_through(capfd) -> None:
    def loud() -> None:
        os.write(2, b"USDT: a profiler line\nsomething else went wrong\n")

    with bench._without_profiler_log():
        loud()
    err = capfd.readouterr().err
    assert "something else went wrong" in err and "USDT" not in err


def test_profiled_peak_of_the_formula_is_two_score_matrices_and_the_output(
    one_torch_thread,
) -> None:
    # explicit_attention holds q k^T and its scaled copy at once, then the scaled copy,
    # the softmax and the output: 2 * (B H T S) + B H T Dv floats of 4 bytes.
    B, H, T, Dh = 1, 2, 64, 8
    q, k, v = torch.randn(3, B, H, T, Dh).unbind(0)
    memory = bench.profile_memory(
        {
            "formula": lambda: bench.explicit_attention(q, k, v),
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
        }
    )
    expected = (2 * B * H * T * T + B * H * T * Dh) * 4
    assert expected <= memory.peak_bytes["formula"] <= expected + 256  # + scalars, if any
    assert memory.peak_bytes["sdpa"] >= B * H * T * Dh * 4  # its output at least
    assert memory.peak_bytes["sdpa"] < memory.peak_bytes["formula"]
    assert memory.sdpa_kernels["formula"] == ()
    assert memory.sdpa_kernels["sdpa"]  # some aten::_scaled_dot_product* kernel ran
    assert all(n.startswith("aten::_scaled_dot_product") for n in memory.sdpa_kernels["sdpa"])


def test_sdpa_table_format(one_torch_thread) -> None:
    """Tiny sizes: the layout and the numbers that do not depend on timing."""
    rows, kernels = bench.measure_sdpa((8, 16), repeats=1, warmup=0, shape=(1, 2, 4))
    assert [row.length for row in rows] == [8, 16]
    for row in rows:
        assert set(row.seconds) == set(row.peak_bytes) == {bench.FUSED, bench.EXPLICIT}
        assert all(s > 0 for s in row.seconds.values())
    table = bench.format_sdpa_table(rows, kernels, repeats=1, warmup=0, shape=(1, 2, 4))
    lines = table.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["T"])
    body = lines[header + 1 : header + 3]
    for row, line in zip(rows, body, strict=True):
        cells = line.split()
        assert len(cells) == 8 and int(cells[0]) == row.length
        # one score matrix: B H T S * 4 bytes, in MB
        assert float(cells[7]) == pytest.approx(2 * row.length**2 * 4 / 2**20, abs=0.005)
        assert float(cells[5]) == pytest.approx(row.peak_bytes[bench.EXPLICIT] / 2**20, abs=0.005)
    joined = " ".join(table.split())
    assert "B=1, H=2, Dh=4" in joined and "torch.profiler.profile(profile_memory=True)" in joined
    assert f"F.scaled_dot_product_attention: {kernels[0]}" in joined


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


def test_sdpa_lengths_option() -> None:
    assert bench.parse_args([]).sdpa_lengths == (256, 512, 1024, 2048)
    assert bench.parse_args(["--quick"]).sdpa_lengths == (256, 512)
    assert bench.parse_args(["--sdpa-lengths", "64,128"]).sdpa_lengths == (64, 128)
    for bad in (["--sdpa-lengths", "0"], ["--sdpa-lengths", "a"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


# --------------------------------------------------------------------------- decoding


def test_decode_table_has_a_row_per_length() -> None:
    rows = bench.measure_decode((1, 4), batch=2, repeats=2)
    assert [row.new_tokens for row in rows] == [1, 4]
    assert all(len(row.seconds_without) == len(row.seconds_with) == 2 for row in rows)
    assert all(row.same_tokens for row in rows)
    # One token: the cached run does exactly what the uncached one does (nothing cached
    # yet, the memory projected once either way). Four: the recomputation costs more.
    assert rows[0].macs_with == rows[0].macs_without > 0
    assert rows[1].macs_without > rows[1].macs_with
    table = bench.format_decode_table(rows, batch=2, repeats=2)
    lines = table.splitlines()
    header = [i for i, line in enumerate(lines) if line.lstrip().startswith("new tokens")]
    assert len(header) == 1
    body = [line.split() for line in lines[header[0] + 1 :]]
    assert [row[0] for row in body] == ["1", "4"]
    for row in body:
        assert len(row) == 6, row  # N, two ms/token, speed-up, two MACs ratios
        assert all(re.fullmatch(r"\d+\.\d+x?", cell) for cell in row[1:]), row
    assert body[0][4:] == ["1.0x", "1.0x"]  # one step: nothing to save
    assert "same tokens with and without the cache: yes" in " ".join(table.split())


def test_self_attention_ratio_sums_the_steps() -> None:
    assert bench.self_attention_macs_ratio(1) == 1.0
    # Two steps: the second recomputes both positions, i.e. twice the cached step's work.
    first, second = (cost.decode_macs_with_cache(32, 2, p) for p in (0, 1))
    assert bench.self_attention_macs_ratio(2) == pytest.approx(
        (first + 2 * second) / (first + second)
    )


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

"""mha.bench.sdpa: the formula written out, the peak memory read from torch.profiler, and
the table of both beside F.scaled_dot_product_attention (timings only compared with
themselves)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from mha import bench
from mha.bench import sdpa


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

    with sdpa._without_profiler_log():
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

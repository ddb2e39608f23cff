"""mha.bench.decode: greedy decoding with and without the KV cache, timed and counted,
and the multiply-add ratio of one self-attention from mha.cost."""

from __future__ import annotations

import re

import pytest

from mha import bench, cost


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

"""mha.bench.timing: the order in which calls are timed (the times themselves vary)."""

from __future__ import annotations

from mha.bench.timing import time_pair, time_rows


def recorder(calls: list[str], name: str):
    return lambda: calls.append(name)


def test_rows_take_turns_in_a_new_order_each_round_the_same_every_run():
    calls: list[str] = []
    rows = {name: recorder(calls, name) for name in "abcde"}
    times = time_rows(rows, repeats=6, warmup=1)
    assert calls[:5] == list("abcde")  # the warm-up, in order
    rounds = [calls[5 + 5 * i : 10 + 5 * i] for i in range(6)]
    assert all(sorted(r) == list("abcde") for r in rounds)  # each row once per round
    predecessors = {r[r.index("c") - 1] if r.index("c") else None for r in rounds}
    assert len(predecessors) > 1  # "c" does not always follow the same row
    assert {len(t) for t in times.values()} == {6}
    again: list[str] = []
    time_rows({name: recorder(again, name) for name in "abcde"}, repeats=6, warmup=1)
    assert again == calls  # seeded: every run times in the same order


def test_a_pair_alternates_which_goes_first():
    calls: list[str] = []
    ratios = time_pair(recorder(calls, "a"), recorder(calls, "b"), pairs=4, warmup=1)
    assert calls == list("ab" + "ab" + "ba" + "ab" + "ba")  # warm-up, then alternating
    assert len(ratios) == 4 and all(r > 0 for r in ratios)

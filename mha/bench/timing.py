"""Wall time of calls measured side by side: the rows take turns, so load hits them all."""

from __future__ import annotations

import random
import time
from collections.abc import Callable


def time_rows(
    rows: dict[str, Callable[[], object]], repeats: int, warmup: int
) -> dict[str, list[float]]:
    """Wall time in seconds of every timed call of each row.

    The rows take turns (round robin) rather than running one after another: on a
    shared machine, a burst of load then slows every row a little instead of one row a
    lot, which is what keeps the ratios meaningful. Each round runs the rows in another
    order (seeded, the same in every run), so that no row always runs right after the
    same one: a row that frees a large tensor leaves the next one to fault fresh pages
    in, measured as 5% on the row that always followed the weights rows.
    """
    for _ in range(warmup):
        for fn in rows.values():
            fn()
    order = list(rows)
    shuffle = random.Random(0).shuffle
    times: dict[str, list[float]] = {label: [] for label in rows}
    for _ in range(repeats):
        shuffle(order)
        for label in order:
            start = time.perf_counter()
            rows[label]()
            times[label].append(time.perf_counter() - start)
    return times


def time_pair(
    first: Callable[[], object], second: Callable[[], object], pairs: int, warmup: int
) -> list[float]:
    """``time(first) / time(second)`` for each of ``pairs`` pairs of calls, the two
    taking turns (which one goes first alternates from pair to pair)."""
    for _ in range(warmup):
        first()
        second()
    ratios = []
    for i in range(pairs):
        seconds = {}
        for name, fn in (("a", first), ("b", second)) if i % 2 == 0 else (
            ("b", second), ("a", first)
        ):
            start = time.perf_counter()
            fn()
            seconds[name] = time.perf_counter() - start
        ratios.append(seconds["a"] / seconds["b"])
    return ratios

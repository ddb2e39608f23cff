"""Wall time of calls measured side by side: the rows take turns, so load hits them all."""

from __future__ import annotations

import time
from collections.abc import Callable


def time_rows(
    rows: dict[str, Callable[[], object]], repeats: int, warmup: int
) -> dict[str, list[float]]:
    """Wall time in seconds of every timed call of each row.

    The rows take turns (round robin) rather than running one after another: on a
    shared machine, a burst of load then slows every row a little instead of one row a
    lot, which is what keeps the ratios meaningful.
    """
    for _ in range(warmup):
        for fn in rows.values():
            fn()
    times: dict[str, list[float]] = {label: [] for label in rows}
    for _ in range(repeats):
        for label, fn in rows.items():
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    return times

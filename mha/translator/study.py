"""What the length studies share: their command lines' list arguments, running their
runs a few processes at a time, and writing a short arm into a results file.

``python -m mha.translator.lengths`` (the translator) and ``python -m
mha.translator.lm_lengths`` (the causal language model) both take comma-separated
schemes and seeds, and both can re-record their short arm alone (``--short-only``)
beside main runs measured before.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

__all__ = ["comma_list", "merge_into", "run_tasks", "seed_list"]


def comma_list(text: str) -> list[str]:
    """An argparse type: ``"a, b"`` -> ``["a", "b"]``."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}")
    return items


def seed_list(text: str) -> list[int]:
    """An argparse type: ``"0,1,2"`` -> ``[0, 1, 2]``."""
    try:
        return [int(t) for t in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of seeds: {text!r}") from None


def merge_into(path: Path, block: dict[str, Any]) -> dict[str, Any]:
    """The results document at ``path`` (empty if there is none) with the entries of
    ``block`` put in, each in its old place if it had one: how ``--short-only``
    records a short arm beside main runs measured before."""
    document = json.loads(path.read_text()) if path.exists() else {}
    document.update(block)
    return document


def run_tasks(
    work: Callable[[Any], Any], tasks: Sequence[Any], jobs: int, report: Callable[[Any], None]
) -> list[Any]:
    """``work(task)`` for every task, ``jobs`` at a time, each in a fresh (spawned)
    process when ``jobs > 1``; ``report(result)`` as each ends (progress lines).

    Returns
    -------
    list
        The results in the order of ``tasks``, whatever order they ended in.
    """
    results: list[Any] = [None] * len(tasks)
    if jobs == 1:
        for k, task in enumerate(tasks):
            results[k] = work(task)
            report(results[k])
        return results
    context = multiprocessing.get_context("spawn")  # not fork: the parent may hold torch's threads
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        index = {pool.submit(work, task): k for k, task in enumerate(tasks)}
        for future in as_completed(index):
            results[index[future]] = future.result()
            report(results[index[future]])
    return results

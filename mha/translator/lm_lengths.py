"""``python -m mha.translator.lm_lengths``: which position scheme lets a causal language
model read past its training length?

Press, Smith and Lewis (2022, ALiBi) found a causal language model's perplexity stays
flat far beyond the training length with ALiBi, while sinusoidal models degrade at once
and rotary ones soon after; Kazemnejad et al. (2023) found no position encoding at all
(NoPE) generalised best on small tasks. This study asks the same of a tiny model, on
text the translator's grammar writes.

Data (:mod:`mha.translator.lm_data`): a document is ``<s>`` followed by sentence pairs
``english <sep> spanish </s>`` back to back. Training and in-length validation
documents hold ``L + 1`` tokens (:data:`~mha.translator.lm_training.TRAIN_LEN` inputs);
the test documents ``4 L + 1``, made of sentences that never occur in training. Model
(:mod:`mha.translator.lm_model`): a pre-norm causal Transformer of
:class:`mha.layers.EncoderLayer` s; the position scheme
(one of :data:`ARMS`) is the only difference between the
arms. One run (:mod:`mha.translator.lm_training`): the translator's training loop and
recipe, with a seed fixing the documents, the initial weights and the batch order, so
the arms are compared on the same documents.

Measures, on the test documents, at every position ``p = 1 .. 4 L`` (the number of
tokens read so far, so ``p <= L`` is the training range):

* **loss**: the next-token cross-entropy in nats (no label smoothing), over every
  token. The English sentences are random draws, so it has a floor well above zero;
* **accuracy**: how often the most likely next token is the right one, over every
  token: bounded well below 1 by the same randomness;
* **translation accuracy**: the same, over the tokens that are determined by what
  came before (each Spanish word and the ``</s>`` after it, given the English):
  a model that has learned the task scores 1 on them, so a drop at long positions is
  the length, not the randomness.

Training rule: every run trains for the same number of steps (``STEPS``, the cap) and
evaluates its in-length validation loss every ``EVAL_EVERY`` steps. The arm
with the lowest mean final validation loss sets the target; a run is "trained" when its
validation loss is within :data:`MARGIN` nats of that target, and the record says after
how many steps it first was (``steps_needed``). ``STEPS`` was chosen so that every
run is, and the tests check it on the results file: a run that did not learn is never
read as a run that does not generalise.

The study also trains a short arm (:data:`SHORT`: one scheme, few steps, every seed),
which ``tests/test_translator_lm_lengths.py`` re-runs in seconds to check that the
command still reproduces the file; the Noam schedule and the batch order do not depend
on the number of steps, so its runs are the first steps of that scheme's runs.
``--short-only`` trains the short arm alone and writes its block (with the environment
it was measured in) into an existing results file, leaving the main runs as they are.
The results (configuration, data settings, the
torch version and CPU they were measured with, the command's wall time, the runs'
total CPU time and the load average before and after (a shared machine makes the wall
time longer than the CPU time divided by ``--jobs``), and per run the validation curve,
the per-position measures, the wall and CPU times) go to ``mha/translator/results/lm_lengths.json``
(:data:`RESULTS`); the command prints the table of mean, min and max per scheme. Runs
are spread over ``--jobs`` processes of one torch thread each, with a progress line on
stderr per finished run. Numbers from training differ a little from one CPU to another
(see :mod:`mha.translator.training`): the file says which CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mha.transformer import POSITION_SCHEMES
from mha.translator.lm_training import EVAL_EVERY, STEPS, LMConfig, run_one
from mha.translator.study import comma_list, merge_into, run_tasks, seed_list
from mha.translator.training import environment

__all__ = [
    "ARMS",
    "MARGIN",
    "RESULTS",
    "SEEDS",
    "SHORT",
    "apply_rule",
    "format_table",
    "main",
    "run",
    "run_short",
    "summarise",
]

#: Where ``python -m mha.translator.lm_lengths`` writes its results by default.
RESULTS = Path(__file__).with_name("results") / "lm_lengths.json"
#: The position schemes compared (of :data:`mha.transformer.POSITION_SCHEMES`; in a causal
#: model "alibi_directional" is "alibi").
ARMS = ("none", "sinusoidal", "rope", "alibi", "t5")
#: The seeds of the recorded results.
SEEDS = (0, 1, 2, 3, 4)
#: Nats: how close to the best arm's validation loss every run must come.
MARGIN = 0.05
#: The short arm, trained with every seed and re-run by the tests: (scheme, steps). At 100
#: steps the validation translation accuracy is about 0.74 (seed 0): still learning.
SHORT = ("alibi", 100)


def _run_one_task(task: tuple[str, int, int]) -> dict[str, Any]:
    scheme, seed, steps = task
    return run_one(seed, scheme, steps)


def _execute(tasks: list[tuple[str, int, int]], jobs: int, log: Any) -> list[dict[str, Any]]:
    """Run the tasks, ``jobs`` at a time (in fresh processes when ``jobs > 1``)."""
    start = time.perf_counter()
    records = []

    def report(record: dict[str, Any]) -> None:
        records.append(record)
        if log is not None:
            elapsed = time.perf_counter() - start
            print(
                f"[{len(records)}/{len(tasks)}] {record['position_scheme']:<10} seed "
                f"{record['seed']}, {record['steps']} steps: val {record['valid_loss']:.3f}, "
                f"loss at {len(record['loss'])} {statistics.fmean(record['loss'][-8:]):.3f}"
                f" ({record['train_seconds']:.0f} s; {elapsed:.0f} s in all)",
                file=log, flush=True,
            )  # fmt: skip

    return run_tasks(_run_one_task, tasks, jobs, report)


def apply_rule(runs: list[dict[str, Any]], margin: float = MARGIN) -> dict[str, Any]:
    """The training rule on finished runs: the best arm, its target, and per run the
    steps it needed to come within ``margin`` of it (None if it never did).

    Sets ``steps_needed`` on every run; returns ``best_arm``, ``target`` (its mean
    final validation loss) and ``margin``.
    """
    finals: dict[str, list[float]] = {}
    for record in runs:
        finals.setdefault(record["position_scheme"], []).append(record["valid_loss"])
    best = min(finals, key=lambda scheme: statistics.fmean(finals[scheme]))
    target = statistics.fmean(finals[best])
    for record in runs:
        reached = [step for step, loss in record["valid_curve"] if loss <= target + margin]
        record["steps_needed"] = reached[0] if reached else None
    return {"best_arm": best, "target": round(target, 6), "margin": margin}


def run(
    schemes: Sequence[str] = ARMS,
    seeds: Sequence[int] = SEEDS,
    steps: int = STEPS,
    short: tuple[str, int] | None = SHORT,
    jobs: int = 2,
    log: Any = None,
) -> dict[str, Any]:
    """Every scheme with every seed (and the short arm); the whole results document.

    Parameters
    ----------
    schemes : sequence of str
        From :data:`mha.transformer.POSITION_SCHEMES` (default :data:`ARMS`).
    seeds : sequence of int
    steps : int
        Optimizer steps of every run of the main arms.
    short : (str, int), optional
        The short arm's scheme and steps, run with every seed; None: no short arm.
    jobs : int
        Runs at a time, each in its own process with one torch thread.
    log : file, optional
        Gets one progress line per finished run.

    Returns
    -------
    dict
        ``config`` (:class:`LMConfig`; ``seed``, ``position_scheme`` and ``steps`` per
        run),
        ``data`` (sizes and lengths), ``rule`` (see :func:`apply_rule`, and the cap),
        ``environment``, ``runs`` and ``short_runs`` (records of :func:`run_one`).
    """
    bad = [s for s in schemes if s not in POSITION_SCHEMES]
    if bad or not schemes:
        raise ValueError(f"schemes must be some of {POSITION_SCHEMES}, got {list(schemes)}")
    _check_short(short, seeds)
    tasks = [(p, s, steps) for s in seeds for p in schemes]
    short_tasks = [] if short is None else [(short[0], s, short[1]) for s in seeds]
    load_before = os.getloadavg()[0]  # other work on the machine slows the wall time
    start = time.perf_counter()
    records = _execute(tasks + short_tasks, jobs, log)
    wall = time.perf_counter() - start
    load_after = os.getloadavg()[0]
    runs, short_runs = records[: len(tasks)], records[len(tasks) :]
    rule = apply_rule(runs) | {"steps": steps, "eval_every": EVAL_EVERY}
    block = _short_block(short, short_runs)
    config = asdict(LMConfig())
    for name in ("seed", "position_scheme", "steps"):
        config[name] = None  # per run
    data = {name: config.pop(name) for name in
            ("train_len", "test_len", "num_train", "num_valid", "num_test")}  # fmt: skip
    return {
        "description": (
            "Next-token loss and accuracy by position of a tiny causal language model "
            "trained on L-token documents and tested on 4 L, per position scheme and seed "
            "(python -m mha.translator.lm_lengths)."
        ),
        "config": config,
        "data": data | {"adjective_prob": 0.5, "sequence": "<s> (en <sep> es </s>)*"},
        "rule": rule,
        "short_arm": block["short_arm"],
        "environment": environment(config["num_threads"]) | {
            "jobs": jobs,
            "cpu_count": os.cpu_count(),
            "wall_seconds": round(wall, 1),
            # the runs' own CPU time: the wall time the command needs on `jobs` idle cores
            "cpu_seconds": round(sum(r["cpu_seconds"] for r in records), 1),
            "load_average": [round(load_before, 2), round(load_after, 2)],
        },
        "runs": runs,
        "short_runs": block["short_runs"],
    }


def _check_short(short: tuple[str, int] | None, seeds: Sequence[int]) -> None:
    if not seeds:
        raise ValueError("seeds is empty; give at least one seed")
    if short is not None and short[0] not in POSITION_SCHEMES:
        raise ValueError(
            f"the short arm's scheme must be one of {POSITION_SCHEMES}, got {short}"
        )


def _short_block(short: tuple[str, int] | None, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``short_arm`` (scheme, steps, and the environment its runs were measured in) and
    ``short_runs``, with the training rule applied among them."""
    if short is None:
        return {"short_arm": None, "short_runs": []}
    apply_rule(runs)
    measured = environment(LMConfig.num_threads) | {
        "cpu_seconds": round(sum(r["cpu_seconds"] for r in runs), 1)
    }
    arm = {"position_scheme": short[0], "steps": short[1], "environment": measured}
    return {"short_arm": arm, "short_runs": runs}


def run_short(
    short: tuple[str, int] = SHORT, seeds: Sequence[int] = SEEDS, jobs: int = 2, log: Any = None
) -> dict[str, Any]:
    """The short arm alone, ``short = (scheme, steps)`` with every seed: its block of the
    results document (``short_arm`` and ``short_runs``; see :func:`run`)."""
    _check_short(short, seeds)
    return _short_block(short, _execute([(short[0], s, short[1]) for s in seeds], jobs, log))


# ---------------------------------------------------------------------- the table

#: The columns of the table: the positions p (tokens read) whose last L/4 end there.
COLUMNS = {"L": 1, "2L": 2, "4L": 4}


def window(values: Sequence[float | None], end: int, width: int) -> float:
    """Mean of ``values`` at positions ``end - width + 1 .. end`` (1-based), skipping None."""
    kept = [v for v in values[end - width : end] if v is not None]
    return statistics.fmean(kept)


def summarise(results: dict[str, Any]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Mean, min and max over seeds, per scheme, of ``valid_loss``, ``steps_needed`` and,
    for every column ``c`` of :data:`COLUMNS`, ``loss@c``, ``accuracy@c`` and
    ``translation@c`` (mean over the last L/4 positions up to there). ``steps_needed``
    is over the runs that reached the target (NaN if none did)."""
    size = results["data"]["train_len"]
    values: dict[str, dict[str, list[float]]] = {}
    for record in results["runs"]:
        row = values.setdefault(record["position_scheme"], {})
        row.setdefault("valid_loss", []).append(record["valid_loss"])
        row.setdefault("steps_needed", []).append(record["steps_needed"])
        for column, multiple in COLUMNS.items():
            for measure, name in (("loss", "loss"), ("accuracy", "accuracy"),
                                  ("translation_accuracy", "translation")):  # fmt: skip
                value = window(record[measure], multiple * size, size // 4)
                row.setdefault(f"{name}@{column}", []).append(value)
    return {
        scheme: {m: _mean_min_max([x for x in v if x is not None]) for m, v in row.items()}
        for scheme, row in values.items()
    }


def _mean_min_max(values: list[float]) -> tuple[float, float, float]:
    if not values:  # no run reached the target
        return math.nan, math.nan, math.nan
    return statistics.fmean(values), min(values), max(values)


def format_table(results: dict[str, Any]) -> str:
    """The summary as text, lines under 76 characters (the book's code box)."""
    summary = summarise(results)
    seeds = sorted({r["seed"] for r in results["runs"]})
    size, rule = results["data"]["train_len"], results["rule"]
    lines = [
        f"{len(seeds)} seeds ({', '.join(map(str, seeds))}), L = {size}, "
        f"{rule['steps']} steps each; mean min max",
        f"in-length validation loss (target {rule['target']:.3f} + {rule['margin']}), "
        "steps to reach it",
        f"{'scheme':<12}{'val loss':<22}steps",
    ]
    for scheme, row in summary.items():
        val = " ".join(f"{x:.3f}" for x in row["valid_loss"])
        steps = " ".join("-" if math.isnan(x) else f"{x:.0f}" for x in row["steps_needed"])
        lines.append(f"{scheme:<12}{val:<22}{steps}")
    for title, name in (("next-token loss (nats)", "loss"),
                        ("translation accuracy", "translation"),
                        ("accuracy, every token", "accuracy")):  # fmt: skip
        lines += ["", f"{title}, mean of the {size // 4} positions up to p"]
        lines.append(f"{'scheme':<12}" + "".join(
            f"{c + f' (p={m * size})':<21}" for c, m in COLUMNS.items()).rstrip())
        for scheme, row in summary.items():
            cells = [" ".join(f"{x:.3f}" for x in row[f"{name}@{c}"]) for c in COLUMNS]
            lines.append(f"{scheme:<12}" + "".join(f"{c:<21}" for c in cells).rstrip())
    return "\n".join(lines)


def dumps(results: dict[str, Any]) -> str:
    """JSON with every list of numbers on one line (the per-position arrays are long)."""
    text = json.dumps(results, indent=1, ensure_ascii=False)
    return re.sub(
        r"\[\s*((?:-?[\d.e+-]+|null)(?:,\s*(?:-?[\d.e+-]+|null))*)\s*\]",
        lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
        text,
    ) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run, write the results file, print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m mha.translator.lm_lengths", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--position-schemes", type=comma_list, default=list(ARMS),
                        help=f"comma-separated schemes (default {','.join(ARMS)})")
    parser.add_argument("--seeds", type=seed_list, default=list(SEEDS),
                        help="comma-separated (default 0-4)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"default {STEPS}")
    parser.add_argument("--short-steps", type=int, default=SHORT[1],
                        help=f"steps of the short {SHORT[0]} arm (default {SHORT[1]}; 0: none)")
    parser.add_argument("--short-only", action="store_true",
                        help="train the short arm alone and write it into --output, keeping "
                        "the file's main runs")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--output", type=Path, default=RESULTS,
                        help=f"results file (default {RESULTS})")  # fmt: skip
    args = parser.parse_args(argv)
    bad = [p for p in args.position_schemes if p not in POSITION_SCHEMES]
    if bad:
        parser.error(f"--position-schemes: {bad} not among {list(POSITION_SCHEMES)}")
    if args.jobs < 1 or args.steps < 1 or args.short_steps < 0 or (
        args.short_only and not args.short_steps
    ):
        parser.error("--jobs and --steps must be at least 1, --short-steps at least 0 "
                     "(1 with --short-only)")  # fmt: skip
    short = (SHORT[0], args.short_steps) if args.short_steps else None
    if args.short_only:
        block = run_short(short, args.seeds, args.jobs, log=sys.stderr)
        results = merge_into(args.output, block)
    else:
        results = run(args.position_schemes, args.seeds, args.steps, short, args.jobs,
                      log=sys.stderr)  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(dumps(results))
    print(f"wrote {args.output}\n")
    if results.get("runs"):
        print(format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

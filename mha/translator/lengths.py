"""``python -m mha.translator.lengths``: does the position scheme change length generalisation?

The tiny translator is trained on the length split of
:func:`~mha.translator.length_split.generate_length_split`: sentences of at most 10
source words (one clause, or two short clauses joined by "and"). It is then scored, by
whole-sentence exact match, on held-out sentences of those same lengths ("has it
learned the task?") and on two-clause sentences of 11 to 15 words, the same number of
each length ("does it generalise in length?"). Each arm (:data:`ARMS`: the position
schemes of :class:`~mha.transformer.Transformer` but NoPE, that is sinusoidal, RoPE,
ALiBi with the symmetric bias in the encoder, and ALiBi with different slopes to the
left and to the right, ``"alibi_directional"``) is trained with the same recipe and
budget for each of five seeds; a seed fixes the split, the initial weights
and the batch order, so the schemes are compared on the same sentences.

Budget: :class:`~mha.translator.training.TrainConfig`'s defaults with ``steps=1000``
(:data:`STEPS`) instead of 500. With 500 steps, RoPE reached 0.97 and ALiBi 0.47 on the
same-length held-out set (seed 0): too early to tell "did not learn" from "does not
generalise". One torch thread per run, as the defaults say, so that a seed gives the same
bits every time on one machine.

The study also trains a short arm (:data:`SHORT`: one scheme, few steps, every seed),
which ``tests/test_translator_lengths.py`` re-runs in seconds to check that the command
still reproduces the file; the Noam schedule and the batch order do not depend on the
number of steps, so its runs are the first steps of that scheme's runs.
``--short-only`` trains the short arm alone and writes its block into an existing
results file, leaving the main runs as they are.

The results (every run's scores, exact match by length, where the first wrong word
of each wrong translation is, the training time, a few translations, and the torch
version and CPU capability they were measured with, for the main runs and for the short
arm) go to a JSON file, ``mha/translator/results/lengths.json`` by default
(:data:`RESULTS`); the command then prints the table of mean, min and max per scheme.
Scores from training differ a little from one CPU to another (see
:mod:`mha.translator.training`): the file says which CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from mha.transformer import POSITION_SCHEMES
from mha.translator.decoding import Translator
from mha.translator.grammar import Example
from mha.translator.length_split import LengthSplit, generate_length_split
from mha.translator.study import comma_list, merge_into, seed_list
from mha.translator.training import TrainConfig, environment, train

__all__ = [
    "ARMS",
    "RESULTS",
    "SEEDS",
    "SHORT",
    "STEPS",
    "check_max_len",
    "first_error",
    "format_table",
    "length_config",
    "main",
    "run",
    "run_one",
    "run_short",
    "score_translations",
    "summarise",
]

#: Where ``python -m mha.translator.lengths`` writes its results by default.
RESULTS = Path(__file__).with_name("results") / "lengths.json"
#: The position schemes compared (of :data:`mha.transformer.POSITION_SCHEMES`: NoPE is left
#: out, since an encoder without positions cannot tell one word order from another).
ARMS = ("sinusoidal", "rope", "alibi", "alibi_directional")
#: The seeds of the recorded results.
SEEDS = (0, 1, 2, 3, 4)
#: Optimizer steps of every run (TrainConfig's default is 500; see the module docstring).
STEPS = 1000
#: The short arm, trained with every seed and re-run by the tests: (scheme, steps). At 150
#: steps both scores still say something (seed 0: 0.97 held-out, 0.12 longer).
SHORT = ("sinusoidal", 150)
# generate_length_split's arguments, spelled out so the file records them.
SPLIT_SETTINGS: dict[str, Any] = {
    "num_train": 10000,
    "num_heldout": 1000,
    "num_longer": 1000,
    "max_train_words": 10,
}


def length_config(seed: int, position_scheme: str, steps: int = STEPS) -> TrainConfig:
    """The recipe of every run: TrainConfig's defaults, ``steps`` optimizer steps."""
    return replace(TrainConfig(), seed=seed, position_scheme=position_scheme, steps=steps)


def check_max_len(config: TrainConfig, split: LengthSplit) -> None:
    """Refuse a config whose model cannot hold the split's longest sentences.

    The model embeds the source (S words) and the decoder input (``<s>`` and T target
    words) at positions ``0 .. max_len - 1``, and greedy decoding writes up to
    ``max_len - 1`` tokens, the last being ``</s>``: so ``max_len`` must be at least
    S and T + 1 for every sentence.

    Raises
    ------
    ValueError
        Naming ``max_len`` and the sentence that does not fit.
    """
    examples = [*split.train, *split.heldout, *split.longer]
    longest_source = max(examples, key=lambda e: len(e.source))
    longest_target = max(examples, key=lambda e: len(e.target))
    need = max(len(longest_source.source), len(longest_target.target) + 1)
    if config.max_len < need:
        culprit = longest_source if len(longest_source.source) == need else longest_target
        raise ValueError(
            f"max_len={config.max_len} is too short for the split: it needs {need} "
            f"positions ({len(culprit.source)} source words, {len(culprit.target)} target "
            f"words + </s>) for {culprit.english!r}"
        )


def first_error(output: Sequence[str], reference: Sequence[str]) -> int | None:
    """Index of the first target word that ``output`` gets wrong, or None if none is.

    A translation that stops early is wrong at the first missing word; one that goes on
    is wrong where the reference would have ended (at its ``</s>``).
    """
    for k, (got, want) in enumerate(zip(output, reference, strict=False)):
        if got != want:
            return k
    if len(output) == len(reference):
        return None
    return min(len(output), len(reference))


def score_translations(outputs: Sequence[str], examples: Sequence[Example]) -> dict[str, Any]:
    """Exact match overall and by source length, and where the wrong ones go wrong.

    Parameters
    ----------
    outputs : sequence of str
        The translations of ``examples``, in order (words joined by spaces).
    examples : sequence of Example

    Returns
    -------
    dict
        ``"exact_match"``: fraction of exact translations; ``"by_length"``: that fraction
        among the sentences of each source length (keys are the lengths as strings,
        JSON's keys); ``"first_error_at"``: for the wrong translations, how many first go
        wrong at each target word index (string keys, ascending).
    """
    if len(outputs) != len(examples) or not examples:
        raise ValueError(
            f"outputs and examples must be equally long and not empty, got "
            f"{len(outputs)} outputs and {len(examples)} examples"
        )
    hits: Counter[int] = Counter()
    totals: Counter[int] = Counter()
    errors: Counter[int] = Counter()
    for output, example in zip(outputs, examples, strict=True):
        size = len(example.source)
        totals[size] += 1
        k = first_error(output.split(), example.target)
        if k is None:
            hits[size] += 1
        else:
            errors[k] += 1
    return {
        "exact_match": sum(hits.values()) / len(examples),
        "by_length": {str(n): hits[n] / totals[n] for n in sorted(totals)},
        "first_error_at": {str(k): errors[k] for k in sorted(errors)},
    }


def _translate(translator: Translator, examples: Sequence[Example]) -> list[str]:
    return list(translator.translate([list(e.source) for e in examples]))


def run_one(
    seed: int,
    position_scheme: str,
    steps: int = STEPS,
    split: LengthSplit | None = None,
    show: Sequence[Example] = (),
    keep_losses: bool = False,
) -> dict[str, Any]:
    """Train one model on the length split of ``seed`` and score it.

    Parameters
    ----------
    seed : int
        Seeds the split (unless ``split`` is given), the weights and the batch order.
    position_scheme : str
        One of :data:`mha.transformer.POSITION_SCHEMES`.
    steps : int
        Optimizer steps.
    split : LengthSplit, optional
        Defaults to ``generate_length_split(seed, **SPLIT_SETTINGS)``.
    show : sequence of Example
        Sentences whose translations go into the record (``"translations"``).
    keep_losses : bool
        Also record the training loss of every step (``"losses"``; the short arm's
        runs do, the long ones would fill the file).

    Returns
    -------
    dict
        ``position_scheme``, ``seed``, ``heldout`` and ``longer`` (each the output of
        :func:`score_translations`), ``final_loss`` (and ``losses``), ``train_seconds``,
        ``eval_seconds`` and ``translations``.
    """
    if split is None:
        split = generate_length_split(seed, **SPLIT_SETTINGS)
    config = length_config(seed, position_scheme, steps)
    check_max_len(config, split)
    result = train(config, corpus=split)
    start = time.perf_counter()
    heldout = score_translations(_translate(result.translator, split.heldout), split.heldout)
    longer = score_translations(_translate(result.translator, split.longer), split.longer)
    eval_seconds = time.perf_counter() - start
    return {
        "position_scheme": position_scheme,
        "seed": seed,
        "heldout": heldout,
        "longer": longer,
        "final_loss": result.losses[-1],
        **({"losses": result.losses} if keep_losses else {}),
        "train_seconds": round(result.seconds, 2),
        "eval_seconds": round(eval_seconds, 2),
        "translations": _translate(result.translator, show) if show else [],
    }


def _recorded_config(position_scheme: str, steps: int) -> dict[str, Any]:
    """The recipe of the runs, as the results file records it: seed and scheme vary
    per run, and the corpus is the split (its sizes are under ``"split"``)."""
    config = asdict(length_config(0, position_scheme, steps))
    config["seed"] = config["position_scheme"] = None  # per run
    for name in ("num_train", "num_heldout", "num_compositional"):
        del config[name]
    return config


def _check_schemes_and_seeds(schemes: Sequence[str], seeds: Sequence[int]) -> None:
    bad = [s for s in schemes if s not in POSITION_SCHEMES]
    if bad or not schemes:
        raise ValueError(f"schemes must be some of {POSITION_SCHEMES}, got {list(schemes)}")
    if not seeds:
        raise ValueError("seeds is empty; give at least one seed")


def _log_record(log: Any, record: dict[str, Any], steps: int) -> None:
    if log is not None:
        print(
            f"{record['position_scheme']:<17} seed {record['seed']}, {steps} steps: held-out "
            f"{record['heldout']['exact_match']:.3f}, longer "
            f"{record['longer']['exact_match']:.3f} ({record['train_seconds']:.1f} s training)",
            file=log,
            flush=True,
        )


def run_short(
    scheme: str, steps: int, seeds: Sequence[int] = SEEDS, log: Any = None
) -> dict[str, Any]:
    """The short arm: ``scheme`` trained ``steps`` steps with every seed.

    Returns
    -------
    dict
        The short arm's block of the results document: ``short_arm`` (``position_scheme``,
        ``steps``, its ``train_config`` and the ``environment`` its runs were measured
        in) and ``short_runs`` (one record of :func:`run_one` each, with the loss of
        every step, the translations left out).
    """
    _check_schemes_and_seeds([scheme], seeds)
    runs = []
    for seed in seeds:
        record = run_one(seed, scheme, steps, keep_losses=True)
        del record["translations"]
        runs.append(record)
        _log_record(log, record, steps)
    arm = {"position_scheme": scheme, "steps": steps,
           "train_config": _recorded_config(scheme, steps),
           "environment": environment(TrainConfig.num_threads)}  # fmt: skip
    return {"short_arm": arm, "short_runs": runs}


def run(
    schemes: Sequence[str] = ARMS,
    seeds: Sequence[int] = SEEDS,
    steps: int = STEPS,
    short: tuple[str, int] | None = SHORT,
    log: Any = None,
) -> dict[str, Any]:
    """Every scheme with every seed, and the short arm; the whole results document
    (see :data:`RESULTS`).

    Parameters
    ----------
    schemes : sequence of str
        Position schemes, from :data:`mha.transformer.POSITION_SCHEMES` (default
        :data:`ARMS`).
    seeds : sequence of int
    steps : int
    short : (str, int), optional
        The short arm's scheme and steps (see :func:`run_short`); None: no short arm.
    log : file, optional
        Gets one line per finished run.

    Returns
    -------
    dict
        ``train_config`` (seed and position_scheme vary per run), ``split`` (settings and
        sizes), ``environment`` (torch version, CPU capability, threads),
        ``runs`` (one record of :func:`run_one` each, the translations left out),
        ``examples`` (the first longer sentence of each length with every scheme's
        translation, from the first seed), and the short arm's ``short_arm`` and
        ``short_runs``.
    """
    _check_schemes_and_seeds(schemes, seeds)
    runs = []
    examples: list[dict[str, Any]] = []
    max_target = 0
    for seed in seeds:
        split = generate_length_split(seed, **SPLIT_SETTINGS)
        max_target = max(max_target, *(len(e.target) for e in split.train))
        per_length = len(split.longer) // len(split.longer_lengths)
        show = split.longer[::per_length] if seed == seeds[0] else []
        if show:
            examples = [{"english": e.english, "reference": e.spanish, "outputs": {}} for e in show]
        for scheme in schemes:
            record = run_one(seed, scheme, steps, split, show)
            translations = record.pop("translations")
            if show:
                for example, output in zip(examples, translations, strict=True):
                    example["outputs"][scheme] = output
            runs.append(record)
            _log_record(log, record, steps)
    config = _recorded_config(schemes[0], steps)
    return {
        "description": (
            "Exact match of the tiny translator on same-length held-out sentences and on "
            "longer ones, per position scheme and seed (python -m mha.translator.lengths)."
        ),
        "train_config": config,
        "split": {
            **SPLIT_SETTINGS,
            "longer_lengths": split.longer_lengths,
            "longer_per_length": per_length,
            "max_train_target_words": max_target,  # over every seed's split
        },
        "environment": environment(config["num_threads"]),
        "runs": runs,
        "examples": examples,
    } | (run_short(*short, seeds, log) if short else {})


def summarise(results: dict[str, Any]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Mean, min and max over seeds of every scheme's scores.

    Returns
    -------
    dict
        ``{scheme: {measure: (mean, min, max)}}`` where the measures are ``"heldout"``,
        ``"longer"`` and one per longer source length (``"11"``, ``"12"``, ...). Schemes
        in the order of their first run.
    """
    scores: dict[str, dict[str, list[float]]] = {}
    for record in results["runs"]:
        row = scores.setdefault(record["position_scheme"], {})
        row.setdefault("heldout", []).append(record["heldout"]["exact_match"])
        row.setdefault("longer", []).append(record["longer"]["exact_match"])
        for size, value in record["longer"]["by_length"].items():
            row.setdefault(size, []).append(value)
    return {
        scheme: {m: (statistics.fmean(v), min(v), max(v)) for m, v in row.items()}
        for scheme, row in scores.items()
    }


def format_table(results: dict[str, Any]) -> str:
    """The summary as text: mean, min and max per scheme, then the mean by length.

    Lines stay under 76 characters (the book's code box).
    """
    summary = summarise(results)
    lengths = [str(n) for n in results["split"]["longer_lengths"]]
    seeds = sorted({r["seed"] for r in results["runs"]})
    same = f"same length (<= {results['split']['max_train_words']} words)"
    longer = f"longer ({lengths[0]}-{lengths[-1]} words)"
    lines = [
        f"exact match over {len(seeds)} seeds ({', '.join(map(str, seeds))}), "
        f"{results['train_config']['steps']} steps each",
        f"{'':<19}{same:<27}{longer}",
        f"{'scheme':<19}{' mean   min   max':<27} mean   min   max",
    ]
    for scheme, row in summary.items():
        cells = [" ".join(f"{x:.3f}" for x in row[m]) for m in ("heldout", "longer")]
        lines.append(f"{scheme:<19}{cells[0]:<27}{cells[1]}")
    lines += ["", "longer, mean exact match by source length (words):"]
    lines.append(f"{'scheme':<19}" + "".join(f"{n:>7}" for n in lengths))
    for scheme, row in summary.items():
        lines.append(f"{scheme:<19}" + "".join(f"{row[n][0]:>7.3f}" for n in lengths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run, write the results file, print the table."""
    parser = argparse.ArgumentParser(
        prog="python -m mha.translator.lengths", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--position-schemes",
        type=comma_list,
        default=list(ARMS),
        help=f"comma-separated schemes (default {','.join(ARMS)})",
    )
    parser.add_argument(
        "--seeds", type=seed_list, default=list(SEEDS), help="comma-separated (default 0-4)"
    )
    parser.add_argument("--steps", type=int, default=STEPS, help=f"default {STEPS}")
    parser.add_argument("--short-steps", type=int, default=SHORT[1],
                        help=f"steps of the short {SHORT[0]} arm (default {SHORT[1]}; 0: none)")
    parser.add_argument("--short-only", action="store_true",
                        help="train the short arm alone and write it into --output, keeping "
                        "the file's main runs")  # fmt: skip
    parser.add_argument(
        "--output", type=Path, default=RESULTS, help=f"results file (default {RESULTS})"
    )
    args = parser.parse_args(argv)
    bad = [p for p in args.position_schemes if p not in POSITION_SCHEMES]
    if bad:
        parser.error(f"--position-schemes: {bad} not among {list(POSITION_SCHEMES)}")
    if args.steps < 1 or args.short_steps < 0 or (args.short_only and not args.short_steps):
        parser.error("--steps must be at least 1, --short-steps at least 0 (1 with --short-only)")
    short = (SHORT[0], args.short_steps) if args.short_steps else None
    if args.short_only:
        results = merge_into(args.output, run_short(*short, args.seeds, log=sys.stdout))
    else:
        results = run(args.position_schemes, args.seeds, args.steps, short, log=sys.stdout)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.output}\n")
    if "runs" in results:
        print(format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

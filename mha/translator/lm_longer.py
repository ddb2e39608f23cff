"""``python -m mha.translator.lm_longer``: the language model past its training length,
read by every scheme, stretched without training, fine-tuned, windowed, and asked for a
token far back.

Chapter 9's study (:mod:`mha.translator.lm_lengths`) trains a tiny causal model on
``L``-token documents and reads ``4 L``. This study takes the same runs further (the
same :class:`~mha.translator.lm_training.LMConfig` and seeds, so the same models on the
same machine) and asks what its documents cannot:

* **every arm to 8 L**, with full attention and with a sliding window of ``L`` keys, the
  window alone or with the first keys kept (attention sinks, Xiao et al. 2024) at the
  same number of keys (:data:`WINDOWS`). The mask keeps each token's position: a sink
  seen from far away is far away, as in a cache that evicts keys and not positions
  (StreamingLLM instead renumbers the keys inside its cache);
* **how much attention the first token takes** within the training length, per layer
  and head, against what a uniform spread would give it (do small models "dump" attention
  there, as large ones do?);
* **RoPE stretched without training**: position interpolation, NTK-aware, YaRN and Llama
  3.1 scaling (:mod:`mha.rope_scaling_torch`) with factors :data:`FACTORS`, and dynamic
  NTK, whose frequencies follow the length read so far (evaluated ``L`` positions at a
  time, each block with the frequencies of its end);
* **RoPE fine-tuned at 2 L** (:data:`FINETUNE`): plain, with interpolation (Chen et al.
  2023's recipe) and with YaRN, the same short schedule for each;
* **a task that needs a token far back** (:mod:`mha.translator.lm_passkey`): every arm
  trained on documents with a passkey and a question at most ``L - 2`` apart, asked at
  distances :data:`DISTANCES` from the end of ``8 L``-token documents.

Per-position measures are kept in blocks of :data:`BIN` positions (loss: the mean over
the block; translation accuracy: right over counted). Runs are spread over ``--jobs``
processes of one torch thread each, with a progress line per finished run; the results
(with the environment and the wall and CPU times) go to :data:`RESULTS`. A short block
(:data:`SHORT`: RoPE, few steps, seed 0, fewer test documents) is re-run by the slow
test to check that the command still reproduces the file.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mha import rope_scaling_torch as scaling
from mha.threads import num_threads
from mha.translator.lm_data import lm_vocab
from mha.translator.lm_lengths import ARMS, SEEDS
from mha.translator.lm_model import CausalLM
from mha.translator.lm_passkey import generate_passkey_data
from mha.translator.lm_training import (
    TRAIN_LEN,
    LMConfig,
    build_lm,
    evaluate_positions,
    lm_data,
    train_lm,
)
from mha.translator.study import comma_list, merge_into, run_tasks, seed_list
from mha.translator.training import environment, fit

__all__ = [
    "BIN",
    "CHECKPOINTS",
    "DISTANCES",
    "FACTORS",
    "FINETUNE",
    "LONG",
    "RESULTS",
    "SAVED",
    "SHORT",
    "WINDOWS",
    "binned",
    "load_lm",
    "main",
    "run",
    "run_arm",
    "run_passkey",
    "seed_curves",
    "write",
    "span_mean",
]

RESULTS = Path(__file__).with_name("results") / "lm_longer.json"
#: The test documents' inputs: 8 L.
LONG = 8 * TRAIN_LEN
#: Positions per block of the stored curves.
BIN = 8
#: (window, sinks) pairs, each ``L`` keys in all: the window alone, with 1 and 4 sinks.
WINDOWS = ((TRAIN_LEN, 0), (TRAIN_LEN - 1, 1), (TRAIN_LEN - 4, 4))
#: Scale factors of the RoPE scalings applied without training.
FACTORS = (2, 4, 8)
#: The fine-tune at 2 L: steps, warm-up, learning-rate scale, documents, and the
#: scalings tried (factor 2).
FINETUNE = {"length": 2 * TRAIN_LEN, "steps": 200, "warmup": 20, "lr_scale": 0.1,
            "num_train": 4000, "methods": ("plain", "linear", "yarn")}  # fmt: skip
#: Asked passkey distances (each test key sits d to d + SLACK positions back).
DISTANCES = (12, 18, 24, 48, 64, 96, 128, 192, 240)
#: Test documents per distance.
PER_DISTANCE = 100
#: The arms whose seed-0 weights ``--checkpoints`` saves (chapter 11 draws NoPE's
#: attention), and where the book keeps them.
SAVED = ("none",)
CHECKPOINTS = Path(__file__).parent / "checkpoints"
#: The short block: RoPE, steps, fine-tune steps, test documents.
SHORT = {"position_scheme": "rope", "steps": 100, "finetune_steps": 20, "num_test": 100}


def binned(measures: dict[str, torch.Tensor], width: int = BIN) -> dict[str, list[float | None]]:
    """Per-position measures of :func:`evaluate_positions` in blocks of ``width``:
    mean loss, accuracy and translation accuracy (None for a block with no target)."""
    size = measures["loss"].shape[0] // width * width

    def blocks(values: torch.Tensor) -> torch.Tensor:
        return values[:size].reshape(-1, width).sum(dim=1)  # (T,) -> (T / width,)

    counted = blocks(measures["translation_count"])
    right = blocks(measures["translation_correct"])
    accuracy = blocks(measures["correct"]) / (measures["count"] * width)
    return {
        "loss": [round(float(v), 4) for v in blocks(measures["loss"]) / width],
        "accuracy": [round(float(v), 4) for v in accuracy],
        "translation_accuracy": [
            None if c == 0 else round(float(r / c), 4) for r, c in zip(right, counted, strict=True)
        ],
    }


def seed_curves(
    results: dict[str, Any], evaluation: str, scheme: str, measure: str = "translation_accuracy"
) -> np.ndarray:
    """One row per seed of ``scheme``: ``measure`` of ``evaluation`` by block (NaN where
    a block had no target), shape ``(seeds, blocks)``; block ``b`` covers positions
    ``b * BIN + 1 .. (b + 1) * BIN``."""
    rows = [r["evaluations"][evaluation][measure] for r in results["runs"]
            if r["position_scheme"] == scheme and evaluation in r["evaluations"]]  # fmt: skip
    if not rows:
        raise ValueError(f"no run of {scheme!r} has the evaluation {evaluation!r}")
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)


def span_mean(curves: np.ndarray, first: int, last: int, width: int = BIN) -> np.ndarray:
    """Per row, the mean over the blocks of positions ``first .. last`` (1-based, each a
    block boundary: ``first - 1`` and ``last`` multiples of ``width``)."""
    if (first - 1) % width or last % width or not 0 < first <= last:
        raise ValueError(f"positions {first}..{last} do not start and end on blocks of {width}")
    return np.nanmean(curves[:, (first - 1) // width : last // width], axis=1)


def load_lm(path: Path, scheme: str) -> CausalLM:
    """A model saved by ``--checkpoints`` (seed 0 of ``scheme``), float32, in eval mode."""
    config = replace(LMConfig(), position_scheme=scheme, test_len=LONG)
    model = build_lm(config, len(lm_vocab()))
    with np.load(path) as arrays:
        state = {name: torch.from_numpy(arrays[name]) for name in arrays.files}
    model.load_state_dict(state)
    return model.eval()


def _first_token_share(model, documents: torch.Tensor) -> dict[str, Any]:
    """Mean attention weight on position 0 from queries ``L/2 .. L - 1``, per layer and
    head, and what a uniform spread over each query's prefix would give."""
    queries = torch.arange(TRAIN_LEN // 2, TRAIN_LEN)
    with torch.no_grad():
        _, weights = model(documents[:, :TRAIN_LEN], need_weights=True)
    share = [w[:, :, queries, 0].mean(dim=(0, 2)).tolist() for w in weights]  # (H,) per layer
    return {"share": [[round(v, 4) for v in layer] for layer in share],
            "uniform": round(float((1.0 / (queries + 1)).mean()), 4)}  # fmt: skip


def _dynamic(model, data, head_dim: int) -> dict[str, torch.Tensor]:
    """Dynamic NTK: each block of L positions read with the frequencies of its end."""
    parts = []
    for end in range(TRAIN_LEN, LONG + 1, TRAIN_LEN):
        rope = scaling.rope_dynamic_ntk(head_dim, 1.0, TRAIN_LEN, end)
        m = evaluate_positions(model, data.test[:, : end + 1], data.test_translation[:, :end],
                               rope_scaling=rope)  # fmt: skip
        parts.append({k: v if v.ndim == 0 else v[-TRAIN_LEN:] for k, v in m.items()})
    return {
        k: parts[0][k] if parts[0][k].ndim == 0 else torch.cat([p[k] for p in parts])
        for k in parts[0]
    }


def _rope(method: str, head_dim: int, factor: float):
    if method == "plain":
        return None
    if method == "linear":
        return scaling.rope_linear(head_dim, factor)
    if method == "ntk":
        return scaling.rope_ntk(head_dim, factor)
    if method == "yarn":
        return scaling.rope_yarn(head_dim, factor, TRAIN_LEN)
    return scaling.rope_llama3(head_dim, factor, TRAIN_LEN)


def _finetune(config: LMConfig, model, method: str, steps: int):
    """The trained model trained on for ``steps`` on 2 L-token documents, its RoPE
    scaled by ``method`` with factor 2 during and after; returns it and the scaling."""
    size = FINETUNE["length"]
    rope = _rope(method, config.d_model // config.num_heads, size / TRAIN_LEN)
    data = lm_data(replace(config, train_len=size, test_len=size, num_train=FINETUNE["num_train"],
                           num_valid=1, num_test=1, seed=config.seed + 1000))  # fmt: skip
    tune = replace(config, steps=steps, warmup=FINETUNE["warmup"], lr_scale=FINETUNE["lr_scale"])

    def batch_loss(m, idx):
        batch = data.train[idx]  # (B, 2L + 1)
        logits = m(batch[:, :-1], rope_scaling=rope)  # (B, 2L, V)
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(),
                               label_smoothing=config.label_smoothing)  # fmt: skip

    done = fit(tune, config.d_model, lambda: copy.deepcopy(model), data.train.shape[0], batch_loss)
    done.model.eval()
    return done.model, rope


def run_arm(
    seed: int,
    scheme: str,
    steps: int | None = None,
    num_test: int = 500,
    finetune_steps: int | None = None,
    checkpoint: Path | None = None,
) -> dict[str, Any]:
    """Train chapter 9's run of ``scheme`` and ``seed``; measure it to 8 L (see the module).

    ``checkpoint``: where to save the trained weights (float32 ``.npz``), if given."""
    cpu_start = time.process_time()
    config = replace(LMConfig(), seed=seed, position_scheme=scheme, test_len=LONG,
                     num_test=num_test, **({} if steps is None else {"steps": steps}))  # fmt: skip
    data = lm_data(config)
    model, curve, seconds = train_lm(config, data)
    if checkpoint is not None:
        arrays = {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}
        np.savez_compressed(checkpoint, **arrays)
    record: dict[str, Any] = {"kind": "arm", "position_scheme": scheme, "seed": seed,
                              "steps": config.steps, "valid_loss": curve[-1][1]}  # fmt: skip
    with num_threads(config.num_threads):
        record["first_token"] = _first_token_share(model, data.valid[:100])
        evaluations = {"full": evaluate_positions(model, data.test, data.test_translation)}
        for window, sinks in WINDOWS:
            evaluations[f"window_{window}_sinks_{sinks}"] = evaluate_positions(
                model, data.test, data.test_translation, window=window, num_sinks=sinks
            )
        if scheme == "rope":
            head_dim = config.d_model // config.num_heads
            for method in ("linear", "ntk", "yarn", "llama3"):
                for factor in FACTORS:
                    evaluations[f"{method}_x{factor}"] = evaluate_positions(
                        model, data.test, data.test_translation,
                        rope_scaling=_rope(method, head_dim, factor))  # fmt: skip
            evaluations["dynamic_ntk"] = _dynamic(model, data, head_dim)
    if scheme == "rope":
        for method in FINETUNE["methods"]:
            tuned, rope = _finetune(config, model, method, finetune_steps or FINETUNE["steps"])
            with num_threads(config.num_threads):
                evaluations[f"finetune_{method}"] = evaluate_positions(
                    tuned, data.test, data.test_translation, rope_scaling=rope
                )
    record["evaluations"] = {name: binned(m) for name, m in evaluations.items()}
    record["train_seconds"] = round(seconds, 2)
    record["cpu_seconds"] = round(time.process_time() - cpu_start, 2)
    return record


def _retrieval(model, documents: torch.Tensor, asks: torch.Tensor, **options) -> torch.Tensor:
    """Whether the most likely token after each question is its passkey: ``(N,)`` bool."""
    with torch.no_grad():
        logits = model(documents[:, :-1], **options)  # (N, T, V)
    rows = torch.arange(documents.shape[0])
    return logits[rows, asks].argmax(dim=-1) == documents[rows, asks + 1]


def run_passkey(seed: int, scheme: str, steps: int | None = None) -> dict[str, Any]:
    """Train ``scheme`` on passkey documents of L + 1 tokens; ask at every distance."""
    cpu_start = time.process_time()
    config = replace(LMConfig(), seed=seed, position_scheme=scheme, test_len=LONG,
                     **({} if steps is None else {"steps": steps}))  # fmt: skip
    data = generate_passkey_data(seed, config.train_len, LONG, DISTANCES, config.num_train,
                                 config.num_valid, PER_DISTANCE)  # fmt: skip
    model, curve, seconds = train_lm(config, data)
    variants = {"full": {}}
    if scheme == "rope":
        head_dim = config.d_model // config.num_heads
        variants |= {
            f"{m}_x8": {"rope_scaling": _rope(m, head_dim, 8)} for m in ("linear", "ntk", "yarn")
        }
    with num_threads(config.num_threads):
        valid = _retrieval(model, data.valid, data.valid_ask)
        retrieval = {
            name: [_mean(_retrieval(model, data.test[d], data.test_ask[d], **opts))
                   for d in DISTANCES]
            for name, opts in variants.items()
        }  # fmt: skip
    return {
        "kind": "passkey", "position_scheme": scheme, "seed": seed, "steps": config.steps,
        "valid_loss": curve[-1][1], "valid_retrieval": _mean(valid),
        "distance_mean": [_mean(data.test_distance[d], 2) for d in DISTANCES],
        "retrieval": retrieval,
        "train_seconds": round(seconds, 2),
        "cpu_seconds": round(time.process_time() - cpu_start, 2),
    }  # fmt: skip


def _mean(values: torch.Tensor, digits: int = 4) -> float:
    return round(float(values.double().mean()), digits)


def _task(task: tuple) -> dict[str, Any]:
    kind, scheme, seed, options = task
    return (
        run_arm(seed, scheme, **options) if kind == "arm" else run_passkey(seed, scheme, **options)
    )


def _execute(tasks: list[tuple], jobs: int, log: Any) -> list[dict[str, Any]]:
    start, records = time.perf_counter(), []

    def report(record: dict[str, Any]) -> None:
        records.append(record)
        if log is not None:
            print(f"[{len(records)}/{len(tasks)}] {record['kind']:<7} "
                  f"{record['position_scheme']:<10} seed {record['seed']}: val "
                  f"{record['valid_loss']:.3f} ({record['cpu_seconds']:.0f} s CPU; "
                  f"{time.perf_counter() - start:.0f} s in all)", file=log, flush=True)  # fmt: skip

    return run_tasks(_task, tasks, jobs, report)


def run(
    schemes: Sequence[str] = ARMS,
    seeds: Sequence[int] = SEEDS,
    jobs: int = 2,
    log: Any = None,
    checkpoints: Path | None = None,
    short_only: bool = False,
) -> dict[str, Any]:
    """Every scheme and seed, both tasks, and the short block: the results document.

    ``checkpoints``: a folder for the seed-0 weights of the arms in :data:`SAVED`
    (``lm_<scheme>.npz``; the book keeps them in :data:`CHECKPOINTS`)."""
    short = ("arm", SHORT["position_scheme"], 0,
             {k: SHORT[k] for k in ("steps", "finetune_steps", "num_test")})  # fmt: skip
    def saved(scheme: str, seed: int) -> Path | None:
        if checkpoints is None or seed != 0 or scheme not in SAVED:
            return None
        return checkpoints / f"lm_{scheme}.npz"

    tasks = [] if short_only else [
        ("arm", p, s, {"checkpoint": saved(p, s)}) for s in seeds for p in schemes
    ] + [("passkey", p, s, {}) for s in seeds for p in schemes]  # fmt: skip
    load_before, start = os.getloadavg()[0], time.perf_counter()
    records = _execute([*tasks, short], jobs, log)
    wall = time.perf_counter() - start
    config = {k: v for k, v in asdict(LMConfig()).items() if k not in ("seed", "position_scheme")}
    return {
        "description": ("Chapter 9's language model past its training length: every arm to 8 L "
                        "(full, windowed, with sinks), RoPE scaled without training and "
                        "fine-tuned at 2 L, and passkey retrieval at a distance "
                        "(python -m mha.translator.lm_longer)."),
        "config": config | {"test_len": LONG},
        "study": {"bin": BIN, "windows": [list(w) for w in WINDOWS], "factors": list(FACTORS),
                  "finetune": FINETUNE | {"methods": list(FINETUNE["methods"])},
                  "distances": list(DISTANCES), "per_distance": PER_DISTANCE, "short": SHORT},
        "environment": environment(config["num_threads"]) | {
            "jobs": jobs, "cpu_count": os.cpu_count(), "wall_seconds": round(wall, 1),
            "cpu_seconds": round(sum(r["cpu_seconds"] for r in records), 1),
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        },
        "runs": [r for r in records[:-1] if r["kind"] == "arm"],
        "passkey_runs": [r for r in records[:-1] if r["kind"] == "passkey"],
        "short_runs": records[-1:],
    }  # fmt: skip


def write(results: dict[str, Any], path: Path, short_only: bool = False) -> None:
    """Write the results document; with ``short_only``, put its short block (and its
    configuration, study settings and environment) into the file at ``path``, keeping
    the file's main runs (a file that does not exist yet gets the block alone)."""
    if short_only:
        block = {k: results[k] for k in ("config", "study", "environment", "short_runs")}
        results = merge_into(path, block)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run, write the results file, print a summary."""
    parser = argparse.ArgumentParser(prog="python -m mha.translator.lm_longer",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("--position-schemes", type=comma_list, default=list(ARMS))
    parser.add_argument("--seeds", type=seed_list, default=list(SEEDS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--checkpoints", type=Path, default=None,
        help=f"folder for the seed-0 weights of {', '.join(SAVED)} (the book's: {CHECKPOINTS})"
    )
    parser.add_argument(
        "--short-only",
        action="store_true",
        help="run the short block alone (what the slow test does)",
    )
    args = parser.parse_args(argv)
    bad = [p for p in args.position_schemes if p not in ARMS]
    if bad or args.jobs < 1:
        parser.error(f"--position-schemes must be among {list(ARMS)}, --jobs at least 1")
    results = run(args.position_schemes, args.seeds, args.jobs, sys.stderr, args.checkpoints,
                  args.short_only)  # fmt: skip
    write(results, args.output, args.short_only)
    print(f"wrote {args.output}")
    for r in results.get("runs", []):
        full = r["evaluations"]["full"]["translation_accuracy"]
        print(f"{r['position_scheme']:<10} seed {r['seed']}: translation accuracy, last block "
              f"{full[-1]}, first-token share {r['first_token']['share']}")  # fmt: skip
    for r in results.get("passkey_runs", []):
        print(
            f"passkey {r['position_scheme']:<10} seed {r['seed']}: in length "
            f"{r['valid_retrieval']}, by distance {r['retrieval']['full']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One run of the language-model length study: its recipe, its training, its measures.

:class:`LMConfig` fixes a run: the seed (documents, initial weights and batch order),
the position scheme, the data sizes (:mod:`mha.translator.lm_data`), the model
(:class:`~mha.translator.lm_model.CausalLM`) and the optimisation, which is the
translator's: :func:`train_lm` trains through :func:`mha.translator.training.fit`, the
loop :func:`mha.translator.train` uses (AdamW, the warm-up schedule, label smoothing,
seeding, one torch thread), so the same seed gives the same bits on the same machine.
:func:`evaluate_positions` measures next-token loss and accuracy at every position, and
:func:`run_one` trains one model and records what the study keeps of it (see
:mod:`mha.translator.lm_lengths` for the study itself).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from mha.threads import num_threads
from mha.translator.lm_data import LMData, generate_lm_data
from mha.translator.lm_model import CausalLM
from mha.translator.training import Recipe, fit

__all__ = [
    "EVAL_EVERY",
    "STEPS",
    "TRAIN_LEN",
    "LMConfig",
    "build_lm",
    "evaluate_positions",
    "lm_data",
    "run_one",
    "train_lm",
]

#: L: the inputs of a training document; the test documents have 4 L.
TRAIN_LEN = 32
#: Optimizer steps of every run (the cap of the study's training rule).
STEPS = 1000
#: Steps between two evaluations of the in-length validation loss.
EVAL_EVERY = 100


@dataclass(frozen=True)
class LMConfig(Recipe):
    """Everything that determines one run: the translator's :class:`Recipe` (with
    :data:`STEPS` steps), the position scheme, the documents and the model."""

    steps: int = STEPS
    eval_every: int = EVAL_EVERY
    position_scheme: str = "none"
    # data (see mha.translator.lm_data.generate_lm_data)
    train_len: int = TRAIN_LEN
    test_len: int = 4 * TRAIN_LEN
    num_train: int = 10000
    num_valid: int = 500
    num_test: int = 500
    # model (see mha.translator.lm_model.CausalLM); the sinusoidal table covers test_len
    d_model: int = 32
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 64


def build_lm(config: LMConfig, vocab_size: int) -> CausalLM:
    """A fresh model for ``config`` (seeded by the caller); its table covers test_len."""
    return CausalLM(vocab_size, config.d_model, config.num_heads, config.num_layers,
                    config.d_ff, config.position_scheme, max_len=config.test_len)  # fmt: skip


def lm_data(config: LMConfig) -> LMData:
    """The documents of ``config``'s seed and sizes."""
    return generate_lm_data(config.seed, config.train_len, config.test_len,
                            config.num_train, config.num_valid, config.num_test)  # fmt: skip


@torch.no_grad()
def evaluate_positions(
    model: CausalLM,
    documents: Tensor,
    translation: Tensor,
    batch_size: int = 250,
    **options: Any,
) -> dict[str, Tensor]:
    """Next-token measures at every position, over a set of documents.

    Parameters
    ----------
    model : CausalLM
    documents : Tensor
        ``(N, T + 1)`` token ids: the model reads the first T, predicts the last T.
    translation : Tensor
        ``(N, T)`` bool: the targets on the translation side.
    batch_size : int
        Documents per forward pass (memory only; the numbers do not depend on it).
    **options
        Passed to the model (:meth:`CausalLM.forward`: ``rope_scaling``, ``window``,
        ``num_sinks``); none: the model as trained.

    Returns
    -------
    dict of Tensor
        ``"loss"`` ``(T,)`` mean cross-entropy (nats) at each position, ``"correct"``
        ``(T,)`` how many argmax predictions were right, ``"translation_correct"`` and
        ``"translation_count"`` ``(T,)`` the same counted over the translation targets
        only, and ``"count"``, the number N of documents.
    """
    was_training = model.training
    model.eval()
    loss = torch.zeros(documents.shape[1] - 1, dtype=torch.float64)
    correct = torch.zeros_like(loss)
    translation_correct = torch.zeros_like(loss)
    for start in range(0, documents.shape[0], batch_size):
        batch = documents[start : start + batch_size]  # (b, T + 1)
        logits = model(batch[:, :-1], **options)  # (b, T) -> (b, T, V)
        targets = batch[:, 1:]  # (b, T)
        nats = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (b, T)
        hits = logits.argmax(dim=-1) == targets  # (b, T)
        loss += nats.sum(dim=0, dtype=torch.float64)
        correct += hits.sum(dim=0)
        translation_correct += (hits & translation[start : start + batch_size]).sum(dim=0)
    model.train(was_training)
    return {
        "loss": loss / documents.shape[0],
        "correct": correct,
        "translation_correct": translation_correct,
        "translation_count": translation.sum(dim=0).to(torch.float64),
        "count": torch.tensor(float(documents.shape[0]), dtype=torch.float64),
    }


def _mean_loss(measures: dict[str, Tensor]) -> float:
    return float(measures["loss"].mean())


def train_lm(
    config: LMConfig, data: LMData
) -> tuple[CausalLM, list[tuple[int, float]], float]:
    """Train one model on ``data.train``; evaluate ``data.valid`` every ``eval_every`` steps.

    Returns
    -------
    model : CausalLM
        Trained, in eval mode.
    curve : list of (int, float)
        ``(step, in-length validation loss)`` after every ``eval_every`` steps (and at
        the last step).
    seconds : float
        Wall time of the loop, evaluations included (machine-dependent).
    """
    train = data.train  # (N, L + 1): the model reads L tokens and predicts the next L

    def batch_loss(model: CausalLM, idx: Tensor) -> Tensor:
        batch = train[idx]  # (B, L + 1)
        logits = model(batch[:, :-1])  # (B, L) -> (B, L, V)
        # No padding in the documents: every target counts.
        return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(),
                               label_smoothing=config.label_smoothing)  # fmt: skip

    curve: list[tuple[int, float]] = []

    def validate(step: int, model: CausalLM, _losses: list[float]) -> None:
        if step % config.eval_every == 0 or step == config.steps:
            valid = evaluate_positions(model, data.valid, data.valid_translation)
            curve.append((step, round(_mean_loss(valid), 6)))

    done = fit(config, config.d_model, lambda: build_lm(config, len(data.vocab)),
               train.shape[0], batch_loss, validate)  # fmt: skip
    return done.model, curve, done.seconds


def _rounded(values: Tensor, digits: int = 4) -> list[float | None]:
    return [None if v != v else round(float(v), digits) for v in values]  # NaN -> None


def run_one(
    seed: int, position_scheme: str, steps: int = STEPS, **overrides: Any
) -> dict[str, Any]:
    """Train one model (``LMConfig(seed, position_scheme, steps, **overrides)``), measure it.

    Returns
    -------
    dict
        ``position_scheme``, ``seed``, ``steps``; ``valid_curve`` (``[step, loss]`` pairs) and
        ``valid_loss`` (the last), ``valid_translation_accuracy``; per test position
        ``p = 1 .. test_len``: ``loss``, ``accuracy``, ``translation_accuracy`` (None
        where no target is on the translation side) and ``translation_count``;
        ``train_seconds`` and ``eval_seconds`` (wall), ``cpu_seconds`` (this process's
        CPU time for the whole run, data included: what a busy machine does not inflate).
    """
    cpu_start = time.process_time()
    config = replace(LMConfig(), seed=seed, position_scheme=position_scheme, steps=steps,
                     **overrides)  # fmt: skip
    data = lm_data(config)
    model, curve, seconds = train_lm(config, data)
    start = time.perf_counter()
    with num_threads(config.num_threads):
        valid = evaluate_positions(model, data.valid, data.valid_translation)
        test = evaluate_positions(model, data.test, data.test_translation)
    count = test["translation_count"]
    return {
        "position_scheme": position_scheme,
        "seed": seed,
        "steps": steps,
        "valid_curve": [list(point) for point in curve],
        "valid_loss": round(_mean_loss(valid), 6),
        "valid_translation_accuracy": round(
            float(valid["translation_correct"].sum() / valid["translation_count"].sum()), 6
        ),
        "loss": _rounded(test["loss"]),
        "accuracy": _rounded(test["correct"] / test["count"]),
        "translation_accuracy": _rounded(test["translation_correct"] / count),
        "translation_count": [int(c) for c in count],
        "train_seconds": round(seconds, 2),
        "eval_seconds": round(time.perf_counter() - start, 2),
        "cpu_seconds": round(time.process_time() - cpu_start, 2),
    }



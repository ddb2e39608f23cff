"""The sequence_loss exercise (chapter 7): the translator's training loss in NumPy.

The reference is the formula of ``mha.translator.training.sequence_loss`` (PyTorch's
``F.cross_entropy`` with ``ignore_index`` and ``label_smoothing``), written here in NumPy
and tested against it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._core import _Case, _Mistake


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)  # no overflow
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _loss(logits: Any, tgt_out: Any, pad_id: int, label_smoothing: float = 0.0, *,
          log_probs: Callable[[np.ndarray], np.ndarray] = _log_softmax,
          skip_pads: bool = True, spread_over: str = "all",
          divide_by: str = "real", pad: int | None = None) -> float:
    logp = log_probs(np.asarray(logits, dtype=np.float64))  # (B, T, V)
    tgt_out = np.asarray(tgt_out)
    vocab = logp.shape[-1]
    nll = -np.take_along_axis(logp, tgt_out[..., None], axis=-1)[..., 0]  # (B, T)
    if spread_over == "all":  # the uniform part covers every word, the target too
        uniform = -logp.mean(axis=-1)
    else:  # "others": only the V - 1 wrong words
        uniform = (-logp.sum(axis=-1) - nll) / (vocab - 1)
    per_token = (1 - label_smoothing) * nll + label_smoothing * uniform  # (B, T)
    # pad: the padding taken to be another id than pad_id (0, whatever pad_id says)
    padding = pad_id if pad is None else pad
    real = tgt_out != padding if skip_pads else np.ones(tgt_out.shape, dtype=bool)
    per_token = np.where(real, per_token, 0.0)
    if divide_by == "sentence":  # the mean of each sentence's mean
        return float(np.mean(per_token.sum(axis=-1) / real.sum(axis=-1)))
    total = per_token.sum()
    if divide_by == "none":  # the sum
        return float(total)
    count = real.sum() if divide_by == "real" else tgt_out.size
    return float(total / count) if count else 0.0


def _sequence_loss(logits: Any, tgt_out: Any, pad_id: int,
                   label_smoothing: float = 0.0) -> float:
    """Mean cross-entropy (nats) over the tokens of tgt_out that are not pad_id."""
    return _loss(logits, tgt_out, pad_id, label_smoothing)


def _loss_model(**change: Any) -> Callable[..., float]:
    def model(logits: Any, tgt_out: Any, pad_id: int, label_smoothing: float = 0.0) -> float:
        return _loss(logits, tgt_out, pad_id, label_smoothing, **change)

    return model


def _naive_log_softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits)  # overflows for logits such as 1000
    return np.log(exp / exp.sum(axis=-1, keepdims=True))


def _shifted_log_softmax(shift: Callable[[np.ndarray], Any]) -> Callable[..., np.ndarray]:
    def log_softmax(logits: np.ndarray) -> np.ndarray:
        z = logits - shift(logits)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))

    return log_softmax


def _log10_softmax(logits: np.ndarray) -> np.ndarray:
    return _log_softmax(logits) / np.log(10.0)  # log10 p = ln p / ln 10


def _loss_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _loss_model(skip_pads=False),
            "The padded positions are counted: their loss is added and they are "
            "counted in the mean.",
            "A pad in tgt_out is not a word to predict: it must count for nothing.",
        ),
        _Mistake(
            _loss_model(divide_by="all"),
            "The pads add no loss, but the mean divides by every position, pads "
            "included: the loss comes out too small for padded batches.",
            "The mean is over the real target tokens only.",
        ),
        _Mistake(
            _loss_model(divide_by="none"),
            "The sum over the real positions instead of their mean: the loss grows "
            "with the number of target tokens in the batch.",
            "Divide by how many positions are not pad_id: the loss of an average token.",
        ),
        _Mistake(
            _loss_model(divide_by="sentence"),
            "The mean of each sentence's mean: a short sentence weighs as much as a "
            "long one, so its tokens count more; the loss is the mean over all the "
            "batch's real tokens.",
            "Put every real token of the batch in one sum, and divide once by their "
            "number.",
        ),
        _Mistake(
            _loss_model(pad=0),
            "Padding is recognised by the id 0, whatever pad_id says.",
            "The padding id is an argument: compare tgt_out with it.",
        ),
        _Mistake(
            _loss_model(log_probs=_log10_softmax),
            "Logarithms in base 10: the loss is ln 10 = 2.303 times too small; the "
            "cross-entropy is measured in nats (np.log, natural logarithms).",
            "np.log is the natural logarithm; np.log10 counts powers of 10.",
        ),
        _Mistake(
            _loss_model(spread_over="others"),
            "The smoothing mass is spread over the V - 1 wrong words only; PyTorch's "
            "label_smoothing spreads it over all V words, the target included.",
            "With smoothing e the target gets 1 - e + e/V, every other word e/V.",
        ),
        _Mistake(
            lambda logits, tgt_out, pad_id, label_smoothing=0.0: _loss(
                logits, tgt_out, pad_id, 0.0),
            "label_smoothing is ignored: the loss is the plain cross-entropy.",
            "Mix e of the uniform distribution into each target: "
            "(1 - e) * (-log p_target) + e * mean over the words of (-log p).",
        ),
        _Mistake(
            _loss_model(log_probs=_naive_log_softmax),
            "inf or NaN for large logits (such as 1000): exp overflows before the log.",
            "log softmax(z) = z - max(z) - log(sum(exp(z - max(z)))) never overflows.",
        ),
        _Mistake(
            _loss_model(log_probs=_shifted_log_softmax(np.max)),
            "inf or NaN when one position's logits lie far below another's: one "
            "maximum, the whole batch's, is subtracted from every position, so exp "
            "underflows to 0 there and its log is -inf.",
            "Each position has its own softmax over the vocabulary: shift each by its "
            "own maximum (axis=-1, keepdims=True).",
        ),
        _Mistake(
            _loss_model(log_probs=_shifted_log_softmax(
                lambda z: z.mean(axis=-1, keepdims=True))),
            "inf for logits that lie far apart (such as 2000, 0 and 1): each position "
            "is shifted by its mean, not its maximum, so exp(z - mean) still overflows.",
            "Only the maximum makes every exp at most 1: log softmax(z) = z - max(z) - "
            "log(sum(exp(z - max(z)))).",
        ),
        _Mistake(
            _loss_model(log_probs=lambda z: z),
            "The logits are used as log-probabilities: they need a log-softmax first.",
            "-log p of the target needs p = softmax(logits) over the vocabulary.",
        ),
    )


def _loss_cases(rng: np.random.Generator) -> list[_Case]:
    def case(batch: int, length: int, vocab: int, pads: list[int], pad_id: int = 0,
             smoothing: float | None = None, scale: float = 1.0, tag: str = "",
             wide: list[float] | None = None) -> _Case:
        logits = rng.normal(size=(batch, length, vocab)) * scale
        if wide is not None:  # one position whose logits lie far apart
            logits[0, 0] = wide
        tgt_out = rng.integers(0, vocab, size=(batch, length))
        tgt_out[tgt_out == pad_id] = (pad_id + 1) % vocab  # no pad before the padding
        for b, count in enumerate(pads):
            if count:
                tgt_out[b, -count:] = pad_id
        kwargs = {} if smoothing is None else {"label_smoothing": smoothing}
        label = ", ".join(filter(None, [
            f"logits {logits.shape}, tgt_out {tgt_out.shape}, pad_id={pad_id}",
            "" if smoothing is None else f"label_smoothing={smoothing}", tag]))
        return _Case(label, (logits, tgt_out, pad_id), kwargs)

    return [
        case(2, 4, 5, [0, 0], tag="no padding"),
        case(3, 5, 6, [2, 0, 3], tag="padded"),
        case(2, 4, 5, [0, 0], smoothing=0.1, tag="no padding"),
        case(2, 6, 7, [3, 1], pad_id=2, smoothing=0.1, tag="padded"),
        case(2, 3, 4, [1, 0], smoothing=0.2, scale=500.0, tag="large logits such as 1000",
             wide=[2000.0, 0.0, 1.0, 3.0]),
    ]

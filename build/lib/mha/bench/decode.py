"""Greedy decoding with and without the KV cache: time per token, and multiply-adds.

The third table times greedy decoding with and without the KV cache, side by side in one
run: a Transformer of the tiny translator's shape with random weights generates exactly N
tokens (``--decode-tokens``) both ways, and the table shows the time per token, the
speed-up, and next to it how many times fewer multiply-adds the cache needs: counted by
``FlopCounterMode`` over the whole model, and from :mod:`mha.cost` for one self-attention.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mha.bench.flops import counted_macs
from mha.bench.timing import time_rows
from mha.cost import decode_macs_with_cache, decode_macs_without_cache
from mha.threads import num_threads
from mha.transformer import Transformer
from mha.translator.decoding import greedy_decode

# The decoded model: the tiny translator's shape.
DECODE_MODEL = {
    "d_model": 32,
    "num_heads": 2,
    "num_encoder_layers": 1,
    "num_decoder_layers": 1,
    "d_ff": 64,
}
DECODE_VOCAB = 100
DECODE_SOURCE_LENGTH = 12
DECODE_BOS = 1
# An id past the vocabulary: argmax never returns it, so every row decodes all N tokens.
DECODE_NEVER_EOS = DECODE_VOCAB


@dataclass(frozen=True)
class DecodeRow:
    """Greedy decoding of ``new_tokens`` tokens, with and without the KV cache."""

    new_tokens: int
    seconds_without: list[float]  # every timed run without the cache
    seconds_with: list[float]  # every timed run with it
    macs_without: int  # counted over the whole model
    macs_with: int
    same_tokens: bool

    @property
    def speedup(self) -> float:
        """Median time without the cache over median time with it."""
        return statistics.median(self.seconds_without) / statistics.median(self.seconds_with)

    @property
    def macs_ratio(self) -> float:
        """Multiply-adds without the cache over with it, counted over the whole model."""
        return self.macs_without / self.macs_with


def decode_model(max_new_tokens: int, batch: int) -> tuple[Transformer, Tensor]:
    """A seeded Transformer of the translator's shape (random weights) and a random
    ``(batch, DECODE_SOURCE_LENGTH)`` source to translate."""
    torch.manual_seed(0)
    max_len = max(max_new_tokens + 1, DECODE_SOURCE_LENGTH)  # <s> + N tokens
    model = Transformer(DECODE_VOCAB, DECODE_VOCAB, max_len=max_len, **DECODE_MODEL).eval()
    generator = torch.Generator().manual_seed(1)
    # ids from 3: not padding (0), <s> (1) or </s> (2)
    src = torch.randint(3, DECODE_VOCAB, (batch, DECODE_SOURCE_LENGTH), generator=generator)
    return model, src


def self_attention_macs_ratio(new_tokens: int) -> float:
    """Multiply-adds of one decoder self-attention over ``new_tokens`` greedy steps,
    without the cache over with it (:mod:`mha.cost`). Step ``p`` computes position
    ``p`` after ``p`` earlier ones; layers and batch size cancel in the ratio."""
    d_model, heads = DECODE_MODEL["d_model"], DECODE_MODEL["num_heads"]
    steps = range(new_tokens)
    without = sum(decode_macs_without_cache(d_model, heads, p) for p in steps)
    return without / sum(decode_macs_with_cache(d_model, heads, p) for p in steps)


def measure_decode(tokens: Sequence[int], batch: int, repeats: int) -> list[DecodeRow]:
    """Time and count greedy decoding of each ``N`` in ``tokens``, with and without the
    cache, on one model. The timed runs take turns (see :func:`time_rows`) after one
    short untimed run each way.

    One torch thread, as :class:`mha.translator.Translator` decodes: at these sizes a
    second thread only adds synchronisation (see :func:`mha.threads.num_threads`).
    """
    with num_threads(1):
        return _measure_decode(tokens, batch, repeats)


def _measure_decode(tokens: Sequence[int], batch: int, repeats: int) -> list[DecodeRow]:
    model, src = decode_model(max(tokens), batch)

    def run(n: int, use_cache: bool) -> Callable[[], Tensor]:
        return lambda: greedy_decode(
            model, src, DECODE_BOS, DECODE_NEVER_EOS, max_new_tokens=n, use_cache=use_cache
        )

    run(min(tokens), False)(), run(min(tokens), True)()  # warm-up
    label = {(n, cache): f"N={n}, {'cache' if cache else 'no cache'}"
             for n in tokens for cache in (False, True)}  # fmt: skip
    times = time_rows({label[key]: run(*key) for key in label}, repeats, warmup=0)
    result = []
    for n in tokens:
        macs_without, without = counted_macs(run(n, False))  # (B, N) token ids
        macs_with, with_cache = counted_macs(run(n, True))
        result.append(
            DecodeRow(
                new_tokens=n,
                seconds_without=times[label[n, False]],
                seconds_with=times[label[n, True]],
                macs_without=macs_without,
                macs_with=macs_with,
                same_tokens=without.shape == (batch, n) and torch.equal(without, with_cache),
            )
        )
    return result

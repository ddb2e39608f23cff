"""mha.exercises: the checkers pass correct code, name each common mistake, and never
print the solution.

Every candidate below is written here, independently of the mistake models inside
``mha.exercises``: correct variants (loops, einsum, logsumexp) that must pass, and one
buggy variant per mistake that must get that mistake's diagnosis and no other's.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import pkgutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mha
from mha import exercises
from mha.exercises._attention import _attend
from mha.exercises._core import _Case
from mha.exercises._multi_head_attention import _multi_head
from tools import workbook


def run(capsys: pytest.CaptureFixture[str], name: str, candidate: Callable) -> tuple[bool, str]:
    """Check ``candidate``; return the verdict and the printed text, whitespace-normalised
    (the report is wrapped for the book's code boxes)."""
    verdict = exercises.check(name, candidate)
    assert isinstance(verdict, exercises.Verdict)
    return bool(verdict), " ".join(capsys.readouterr().out.split())


# --------------------------------------------------------------------------- correct variants


def softmax_loops(x: Any, axis: int = -1) -> np.ndarray:
    """One slice at a time, in Python."""
    moved = np.moveaxis(np.array(x, dtype=np.float64), axis, -1)
    out = np.zeros_like(moved)
    for index in np.ndindex(moved.shape[:-1]):
        row = moved[index]
        top = max(row)
        if top == -math.inf:
            continue  # nothing to attend to: zeros
        exps = [math.exp(value - top) for value in row]
        out[index] = [e / sum(exps) for e in exps]
    return np.moveaxis(out, -1, axis)


def softmax_logsumexp(x: Any, axis: int = -1) -> np.ndarray:
    """exp(x - logsumexp(x)), with the all -inf slices set to zero afterwards."""
    x = np.asarray(x)
    lse = np.logaddexp.reduce(x, axis=axis, keepdims=True)
    return np.where(np.isneginf(lse), 0.0, np.exp(x - lse))


def sdpa_einsum(q: Any, k: Any, v: Any, mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
    scores = np.einsum("...td,...sd->...ts", q, k) / np.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax_logsumexp(scores)
    return np.einsum("...ts,...sv->...tv", weights, v), weights


def sdpa_loops(q: Any, k: Any, v: Any, mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Every query, key and batch/head index by hand."""
    lead, (target_len, head_dim), source_len = q.shape[:-2], q.shape[-2:], k.shape[-2]
    allowed = np.broadcast_to(True if mask is None else mask, (*lead, target_len, source_len))
    weights = np.zeros((*lead, target_len, source_len))
    context = np.zeros((*lead, target_len, v.shape[-1]))
    for index in np.ndindex(lead):
        for t in range(target_len):
            scores = [
                float(np.dot(q[index][t], k[index][s])) / math.sqrt(head_dim)
                if allowed[index][t, s]
                else -math.inf
                for s in range(source_len)
            ]
            weights[index][t] = softmax_loops(scores)
            context[index][t] = sum(w * v[index][s] for s, w in enumerate(weights[index][t]))
    return context, weights


def split_loops(x: np.ndarray, num_heads: int) -> np.ndarray:
    batch, length, d_model = x.shape
    head_dim = d_model // num_heads
    out = np.empty((batch, num_heads, length, head_dim))
    for h in range(num_heads):
        out[:, h] = x[:, :, h * head_dim : (h + 1) * head_dim]
    return out


def merge_concat(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x[:, h] for h in range(x.shape[1])], axis=-1)


def causal_compare(size: int) -> np.ndarray:
    positions = np.arange(size)
    return positions[:, None] >= positions[None, :]


def padding_loops(lengths=None, *, tokens=None, pad_id=None, max_len=None) -> np.ndarray:
    if tokens is not None:
        rows = [[token != pad_id for token in row] for row in np.asarray(tokens).tolist()]
    else:
        width = max(lengths) if max_len is None else max_len
        rows = [[s < n for s in range(width)] for n in lengths]
    return np.array(rows, dtype=bool)[:, None, None, :]


def mha_per_head(query, key, value, params, num_heads, mask=None):
    """One head at a time on slices of the weight matrices, then concatenate."""
    head_dim = params.d_model // num_heads
    def linear(x, w, b):
        return x @ w if b is None else x @ w + b  # biases may be None

    q = linear(query, params.W_q, params.b_q)
    k = linear(key, params.W_k, params.b_k)
    v = linear(value, params.W_v, params.b_v)
    contexts, weights = [], []
    for h in range(num_heads):
        cols = slice(h * head_dim, (h + 1) * head_dim)
        # a 4-D mask (B, 1, T or 1, S) has one entry for all heads: drop that axis
        head_mask = mask[:, 0] if mask is not None and mask.ndim == 4 else mask
        context, w = sdpa_einsum(q[..., cols], k[..., cols], v[..., cols], head_mask)
        contexts.append(context)
        weights.append(w)
    output = linear(np.concatenate(contexts, axis=-1), params.W_o, params.b_o)
    return output, np.stack(weights, axis=1)


def window_loops(size, window, num_keys=None):
    keys = size if num_keys is None else num_keys
    rows = [[0 <= (keys - size + t) - s < window for s in range(keys)] for t in range(size)]
    return np.array(rows, dtype=bool)


def window_shifted(shift=0, absolute=False, top_left=False, square=False):
    def candidate(size, window, num_keys=None):
        keys = size if num_keys is None or square else num_keys
        start = 0 if top_left else keys - size
        rows = []
        for t in range(size):
            gaps = [(start + t) - s for s in range(keys)]
            gaps = [abs(g) for g in gaps] if absolute else gaps
            rows.append([0 <= g < window + shift for g in gaps])
        return np.array(rows, dtype=bool)

    return candidate


def kv_bytes_plain(num_layers, num_kv_heads, head_dim, context_length, *, batch_size=1,
                   bytes_per_value=2, window=None):
    positions = context_length if window is None else min(context_length, window)
    per_position = 2 * num_layers * num_kv_heads * head_dim  # a key and a value
    return per_position * positions * batch_size * bytes_per_value


def kv_bytes_variant(keys_only=False, window_rule=min, batch=True, fixed_bytes=False,
                     bits=False):
    def candidate(num_layers, num_kv_heads, head_dim, context_length, *, batch_size=1,
                  bytes_per_value=2, window=None):
        positions = context_length
        if window is not None and window_rule is not None:
            positions = window_rule(context_length, window)
        size = (1 if keys_only else 2) * num_layers * num_kv_heads * head_dim * positions
        size *= batch_size if batch else 1
        size *= 2 if fixed_bytes else bytes_per_value
        return size * 8 if bits else size

    return candidate


def rope_loops(x, positions, base=10000.0):
    """RoPE pair by pair, with explicit 2 x 2 rotation matrices."""
    x = np.asarray(x)
    out = np.empty_like(x)
    head_dim = x.shape[-1]
    for index in np.ndindex(*x.shape[:-1]):
        position = np.asarray(positions)[index[-1]]
        for i in range(head_dim // 2):
            angle = position * base ** (-2 * i / head_dim)
            rotation = np.array([[np.cos(angle), -np.sin(angle)],
                                 [np.sin(angle), np.cos(angle)]])
            out[(*index, slice(2 * i, 2 * i + 2))] = rotation @ x[(*index, slice(2 * i, 2 * i + 2))]
    return out


def slopes_written_out(num_heads, odd=True):
    def powers(n):
        return [2 ** (-8 * k / n) for k in range(1, n + 1)]

    p = 1
    while 2 * p <= num_heads:
        p *= 2
    start = 0 if odd else 1  # index 0 is k = 1, an odd power
    return np.array(powers(p) + powers(2 * p)[start::2][: num_heads - p])


CORRECT = [
    ("softmax", mha.softmax),
    ("softmax", softmax_loops),
    ("softmax", softmax_logsumexp),
    ("scaled_dot_product_attention", mha.scaled_dot_product_attention),
    ("scaled_dot_product_attention", sdpa_einsum),
    ("scaled_dot_product_attention", sdpa_loops),
    ("split_heads", mha.split_heads),
    ("split_heads", split_loops),
    ("merge_heads", mha.merge_heads),
    ("merge_heads", merge_concat),
    ("causal_mask", mha.causal_mask),
    ("causal_mask", causal_compare),
    ("padding_mask", mha.padding_mask),
    ("padding_mask", padding_loops),
    ("multi_head_attention", mha.multi_head_attention),
    ("multi_head_attention", mha_per_head),
    ("sliding_window_mask", mha.sliding_window_mask),
    ("sliding_window_mask", window_loops),
    ("kv_cache_bytes", mha.kv_cache_bytes),
    ("kv_cache_bytes", kv_bytes_plain),
    ("apply_rope", mha.apply_rope),
    ("apply_rope", rope_loops),
    ("alibi_slopes", mha.alibi_slopes),
    ("alibi_slopes", slopes_written_out),
]


@pytest.mark.parametrize(("name", "candidate"), CORRECT, ids=lambda c: getattr(c, "__name__", c))
def test_correct_implementations_pass(capsys, name: str, candidate: Callable) -> None:
    verdict, out = run(capsys, name, candidate)
    assert verdict is True
    assert out.startswith(f"{name}: correct on ")
    assert "Hint" not in out and "mistake" not in out


# --------------------------------------------------------------------------- buggy variants
# One function per mistake, written the way a learner would write it. Each exercise has a
# table {mistake: phrase}: the phrase must appear in that mistake's diagnosis, and no
# other mistake's phrase may appear with it.


def _exp_normalise(x: np.ndarray, axis: int = -1) -> np.ndarray:
    exps = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return exps / np.sum(exps, axis=axis, keepdims=True)


def softmax_overflows(x, axis=-1):
    exps = np.exp(x)
    return exps / exps.sum(axis=axis, keepdims=True)


def softmax_global_max(x, axis=-1):
    exps = np.exp(x - x.max())
    return exps / exps.sum(axis=axis, keepdims=True)


def softmax_nan_row(x, axis=-1):
    return _exp_normalise(x, axis)


def softmax_ignores_axis(x, axis=-1):
    return mha.softmax(x, axis=-1)


def softmax_axis_zero(x, axis=-1):
    exps = np.exp(x - x.max(axis=0))
    return np.nan_to_num(exps / exps.sum(axis=0))


def softmax_whole_array(x, axis=-1):
    exps = np.exp(x - x.max())
    return exps / exps.sum()


def softmax_global_max_zeros(x, axis=-1):
    """One shift for the whole array; 0 / 0 quietly set to 0."""
    exps = np.exp(x - x.max())
    sums = exps.sum(axis=axis, keepdims=True)
    return np.nan_to_num(exps / sums)


def softmax_mean(x, axis=-1):
    exps = np.exp(x - x.mean(axis=axis, keepdims=True))
    return exps / exps.sum(axis=axis, keepdims=True)


def softmax_finite_mean(x, axis=-1):
    """Shifted by the mean of the finite scores: right for -inf entries and an all -inf
    row, NaN for [2000, 0, 1]."""
    finite = np.where(np.isfinite(x), x, np.nan)
    # an all -inf row has no finite score: its mean is NaN (the checker runs candidates
    # with NumPy's warnings off, as a notebook would show them and go on)
    shift = np.nan_to_num(np.nanmean(finite, axis=axis, keepdims=True))
    exps = np.exp(x - shift)
    sums = exps.sum(axis=axis, keepdims=True)
    return np.divide(exps, sums, out=np.zeros_like(exps), where=sums > 0)


def softmax_float32(x, axis=-1):
    return softmax_loops(x, axis).astype(np.float32)


def softmax_no_keepdims(x, axis=-1):
    exps = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return exps / np.sum(exps, axis=axis)


SOFTMAX = {
    "overflow": (softmax_overflows, "exp overflows"),
    "global max": (softmax_global_max, "one constant is subtracted from the whole array"),
    "nan row": (softmax_nan_row, "NaN for a row with nothing to attend to"),
    "ignores axis": (softmax_ignores_axis, "the axis argument is ignored"),
    "axis 0": (softmax_axis_zero, "the first one (0)"),
    "whole array": (softmax_whole_array, "The whole array sums to 1"),
    "keepdims": (softmax_no_keepdims, "lost its reduced axis"),
    "global max, zeros": (softmax_global_max_zeros,
                          "the whole array's maximum is subtracted from every slice"),
    "mean": (softmax_mean, "shifted by its mean, not its maximum"),
    "finite mean": (softmax_finite_mean, "shifted by its mean, not its maximum"),
    "float32": (softmax_float32, "smaller float type than mha's"),
}


def attention(q, k, v, mask=None, *, scores=None, scale=None, fill=-np.inf, axis=-1):
    """A learner's attention with hooks: every keyword changes one step."""
    s = q @ np.swapaxes(k, -1, -2) if scores is None else scores(q, k)
    s = s / np.sqrt(q.shape[-1]) if scale is None else scale(s, q, k, v)
    if mask is not None:
        s = np.where(mask, s, fill)
    weights = softmax_loops(s, axis=axis)
    return weights @ v, weights


def sdpa_no_transpose(q, k, v, mask=None):
    return attention(q, k, v, mask, scores=lambda q, k: np.matmul(q, k))


def sdpa_dot_t(q, k, v, mask=None):
    return attention(q, k, v, mask, scores=lambda q, k: q @ k.T)


def sdpa_unscaled(q, k, v, mask=None):
    return attention(q, k, v, mask, scale=lambda s, q, k, v: s)


def sdpa_sqrt_t(q, k, v, mask=None):
    return attention(q, k, v, mask, scale=lambda s, q, k, v: s / math.sqrt(q.shape[-2]))


def sdpa_sqrt_s(q, k, v, mask=None):
    return attention(q, k, v, mask, scale=lambda s, q, k, v: s / math.sqrt(k.shape[-2]))


def sdpa_one_over_d(q, k, v, mask=None):
    return attention(q, k, v, mask, scale=lambda s, q, k, v: s * (1.0 / q.shape[-1]))


def sdpa_multiplied(q, k, v, mask=None):
    return attention(q, k, v, mask, scale=lambda s, q, k, v: s * q.shape[-1] ** 0.5)


def sdpa_inverted_mask(q, k, v, mask=None):
    return attention(q, k, v, None if mask is None else ~mask)


def sdpa_mask_transposed(q, k, v, mask=None):
    return attention(q, k, v, None if mask is None else np.swapaxes(mask, -1, -2))


def sdpa_ignores_mask(q, k, v, mask=None):
    return attention(q, k, v)


def sdpa_mask_after_softmax(q, k, v, mask=None):
    _, weights = attention(q, k, v)
    if mask is not None:
        weights = weights * mask
    return weights @ v, weights


def sdpa_finite_fill(q, k, v, mask=None):
    return attention(q, k, v, mask, fill=-1e4)


def sdpa_wrong_axis(q, k, v, mask=None):
    return attention(q, k, v, mask, axis=-2)


def sdpa_overflows(q, k, v, mask=None):
    scores = np.einsum("...td,...sd->...ts", q, k) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax_overflows(scores)
    return weights @ v, weights


def sdpa_normalised_by(normalise):
    """Scaled and masked as it should be; the weights from ``normalise(scores)``."""
    def candidate(q, k, v, mask=None):
        scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        weights = normalise(scores)
        return weights @ v, weights

    return candidate


sdpa_nan_row = sdpa_normalised_by(_exp_normalise)  # a row of -inf gives 0/0


def sdpa_context_only(q, k, v, mask=None):
    return sdpa_einsum(q, k, v, mask)[0]


def sdpa_swapped(q, k, v, mask=None):
    context, weights = sdpa_einsum(q, k, v, mask)
    return weights, context


SDPA = {
    "no transpose": (sdpa_no_transpose, "the scores look like q @ k,"),
    ".T": (sdpa_dot_t, "reverses all its axes"),
    "no scaling": (sdpa_unscaled, "No 1/sqrt(head_dim) scaling"),
    "sqrt(T)": (sdpa_sqrt_t, "sqrt(T), the number of queries"),
    "sqrt(S)": (sdpa_sqrt_s, "sqrt(S), the number of keys"),
    "1/d": (sdpa_one_over_d, "1/d instead of 1/sqrt(d)"),
    "multiplied": (sdpa_multiplied, "multiplied by sqrt(head_dim) instead of divided"),
    "inverted mask": (sdpa_inverted_mask, "An inverted mask"),
    "mask ignored": (sdpa_ignores_mask, "The mask has no effect"),
    "mask transposed": (sdpa_mask_transposed, "applied along the queries (transposed)"),
    "mask after softmax": (sdpa_mask_after_softmax, "applied after the softmax"),
    "finite fill": (sdpa_finite_fill, "a large finite number, not -inf"),
    "zero fill": (lambda q, k, v, mask=None: attention(q, k, v, mask, fill=0.0),
                  "Blocked scores are set to 0 instead of -inf"),
    "wrong axis": (sdpa_wrong_axis, "The softmax runs over the wrong axis"),
    "overflow": (sdpa_overflows, "exp overflows"),
    "nan row": (sdpa_nan_row, "NaN for a row with nothing to attend to"),
    "global max": (sdpa_normalised_by(softmax_global_max),
                   "one constant is subtracted from the whole array"),
    "global max, zeros": (sdpa_normalised_by(softmax_global_max_zeros),
                          "the whole array's maximum is subtracted from every slice"),
    "mean": (sdpa_normalised_by(softmax_finite_mean), "shifted by its mean, not its maximum"),
    "context only": (sdpa_context_only, "Only the context is returned"),
    "swapped": (sdpa_swapped, "wrong order: (weights, context)"),
}


def split_without_transpose(x, num_heads):
    batch, length, d_model = x.shape
    return x.reshape(batch, length, num_heads, d_model // num_heads)


def split_reshape_only(x, num_heads):
    batch, length, d_model = x.shape
    return np.reshape(x, (batch, num_heads, length, -1))


def split_interleaved(x, num_heads):
    batch, length, d_model = x.shape
    return np.einsum("btdh->bhtd", x.reshape(batch, length, -1, num_heads))


def split_last_two_swapped(x, num_heads):
    batch, length, d_model = x.shape
    return x.reshape(batch, length, num_heads, -1).transpose(0, 2, 3, 1)


def split_sizes_confused(x, num_heads):
    batch, length, d_model = x.shape
    head_dim = d_model // num_heads
    return x.reshape(batch, length, head_dim, num_heads).transpose(0, 2, 1, 3)


SPLIT = {
    "no transpose": (split_without_transpose, "split_heads without the transpose"),
    "reshape only": (split_reshape_only, "head 0 gets whole tokens"),
    "interleaved": (split_interleaved, "the heads are interleaved"),
    "last two swapped": (split_last_two_swapped, "the last two axes are swapped"),
    "sizes confused": (split_sizes_confused, "num_heads and head_dim are confused"),
    "list": (lambda x, num_heads: [split_loops(x, num_heads)[:, h] for h in range(num_heads)],
             "A list of the H heads"),
}


def merge_reshape_only(x):
    batch, heads, length, head_dim = x.shape
    return np.reshape(x, (batch, length, -1))


def merge_interleaved(x):
    batch, heads, length, head_dim = x.shape
    return np.moveaxis(x, 1, -1).reshape(batch, length, -1)  # (B, T, Dh, H)


def merge_no_reshape(x):
    return x.transpose(0, 2, 1, 3)


def merge_sum(x):
    return sum(x[:, h] for h in range(x.shape[1]))


def merge_mean(x):
    return np.mean(x, axis=1)


MERGE = {
    "reshape only": (merge_reshape_only, "without moving the head axis"),
    "interleaved": (merge_interleaved, "the features are interleaved"),
    "no reshape": (merge_no_reshape, "moved but not concatenated"),
    "sum": (merge_sum, "added together"),
    "mean": (merge_mean, "averaged instead of concatenated"),
}


CAUSAL = {
    "k=-1": (lambda size: np.tril(np.ones((size, size)), k=-1) > 0, "cannot see itself"),
    "k=1": (lambda size: np.tril(np.ones((size, size)), k=1) > 0, "one step ahead"),
    "inverted": (lambda size: np.triu(np.ones((size, size), dtype=bool), k=1), "An inverted mask"),
    "transposed": (
        lambda size: np.triu(np.ones((size, size), dtype=bool)),
        "The mask is transposed",
    ),
    "float": (lambda size: np.tril(np.ones((size, size))), "not a boolean array"),
    "int": (lambda size: np.tril(np.ones((size, size), dtype=int)), "not a boolean array"),
    "additive": (
        lambda size: np.where(causal_compare(size), 0.0, -np.inf),
        "An additive mask (0 and -inf)",
    ),
}


def padding_inverted(lengths=None, *, tokens=None, pad_id=None, max_len=None):
    return ~padding_loops(lengths, tokens=tokens, pad_id=pad_id, max_len=max_len)


def padding_flat(lengths=None, *, tokens=None, pad_id=None, max_len=None):
    return padding_loops(lengths, tokens=tokens, pad_id=pad_id, max_len=max_len)[:, 0, 0]


def padding_one_too_many(lengths=None, *, tokens=None, pad_id=None, max_len=None):
    if tokens is not None:
        return padding_loops(tokens=tokens, pad_id=pad_id)
    width = max(lengths) if max_len is None else max_len
    return np.array([[s <= n for s in range(width)] for n in lengths])[:, None, None, :]


def padding_ignores_max_len(lengths=None, *, tokens=None, pad_id=None, max_len=None):
    return padding_loops(lengths, tokens=tokens, pad_id=pad_id)


def padding_pad_zero(lengths=None, *, tokens=None, pad_id=None, max_len=None):
    return padding_loops(lengths, tokens=tokens, pad_id=0, max_len=max_len)


def padding_float(lengths=None, *, tokens=None, pad_id=None, max_len=None):
    return padding_loops(lengths, tokens=tokens, pad_id=pad_id, max_len=max_len) * 1.0


def padding_pad_id_falsy(lengths=None, *, tokens=None, pad_id=None, max_len=None):
    if pad_id:  # 0 reads as "no pad_id": falls through to the lengths, which are None
        return padding_loops(tokens=tokens, pad_id=pad_id)
    return padding_loops(lengths, max_len=max_len)


PADDING = {
    "inverted": (padding_inverted, "True marks the padding"),
    "flat": (padding_flat, "Shape (B, S)"),
    "off by one": (padding_one_too_many, "one pad too many"),
    "max_len ignored": (padding_ignores_max_len, "max_len is ignored"),
    "pad id 0": (padding_pad_zero, "recognised by the id 0"),
    "float": (padding_float, "not a boolean array"),
    "pad id falsy": (padding_pad_id_falsy, "Fails for pad_id = 0"),
}


def learner_mha(
    query,
    key,
    value,
    params,
    num_heads,
    mask=None,
    *,
    attend=sdpa_einsum,
    split=split_loops,
    merge=merge_concat,
    biases=True,
    transpose_weights=False,
    project_output=True,
    plain_biases=False,
):
    """A learner's multi-head attention with hooks: every keyword changes one step
    (``plain_biases``: x @ W + b even when b is None)."""

    def linear(x, w, b):
        w = w.T if transpose_weights else w
        if plain_biases:
            return x @ w + b
        return x @ w + b if biases and b is not None else x @ w

    q = split(linear(query, params.W_q, params.b_q), num_heads)
    k = split(linear(key, params.W_k, params.b_k), num_heads)
    v = split(linear(value, params.W_v, params.b_v), num_heads)
    context, weights = attend(q, k, v, mask)
    merged = merge(context)
    return (linear(merged, params.W_o, params.b_o) if project_output else merged), weights


def mha_variant(**changes: Any) -> Callable:
    def candidate(query, key, value, params, num_heads, mask=None):
        return learner_mha(query, key, value, params, num_heads, mask, **changes)

    return candidate


def mha_same_projection(query, key, value, params, num_heads, mask=None):
    def project(x):
        return split_loops(x @ params.W_q + params.b_q, num_heads)

    context, weights = sdpa_loops(project(query), project(key), project(value), mask)
    return merge_concat(context) @ params.W_o + params.b_o, weights


def mha_w_o_per_head(query, key, value, params, num_heads, mask=None):
    """Each head's context through its own diagonal block of W_o, then concatenated."""
    head_dim = params.W_q.shape[0] // num_heads
    q, k, v = (x @ w if b is None else x @ w + b
               for x, w, b in ((query, params.W_q, params.b_q), (key, params.W_k, params.b_k),
                               (value, params.W_v, params.b_v)))
    outs, weights = [], []
    for h in range(num_heads):
        cols = slice(h * head_dim, (h + 1) * head_dim)
        head_mask = mask[:, 0] if mask is not None and mask.ndim == 4 else mask
        context, w = sdpa_einsum(q[..., cols], k[..., cols], v[..., cols], head_mask)
        outs.append(context @ params.W_o[cols, cols])
        weights.append(w)
    merged = np.concatenate(outs, axis=-1)
    return (merged if params.b_o is None else merged + params.b_o), np.stack(weights, axis=1)


def mha_without(bias):
    """Every bias added but ``bias``."""
    def candidate(query, key, value, params, num_heads, mask=None):
        b = getattr(params, bias)
        kept = dataclasses.replace(params, **{bias: None if b is None else 0 * b})
        return learner_mha(query, key, value, kept, num_heads, mask)

    return candidate


def mha_keys_from_query(query, key, value, params, num_heads, mask=None):
    return learner_mha(query, query, value, params, num_heads, mask)


def mha_one_head(query, key, value, params, num_heads, mask=None):
    return learner_mha(query, key, value, params, 1, mask)


def mha_averaged_weights(query, key, value, params, num_heads, mask=None):
    output, weights = learner_mha(query, key, value, params, num_heads, mask)
    return output, weights.mean(axis=1)


def mha_output_only(query, key, value, params, num_heads, mask=None):
    return learner_mha(query, key, value, params, num_heads, mask)[0]


def mha_swapped(query, key, value, params, num_heads, mask=None):
    output, weights = learner_mha(query, key, value, params, num_heads, mask)
    return weights, output


def sqrt_d_model(s, q, k, v):
    return s / math.sqrt(q.shape[1] * q.shape[-1])


MHA = {
    "no W_o": (mha_variant(project_output=False), "W_o forgotten"),
    "W_o per head": (mha_w_o_per_head, "W_o is applied per head before the merge"),
    "mask transposed": (
        mha_variant(attend=sdpa_mask_transposed), "applied along the queries (transposed)"
    ),
    "no biases": (mha_variant(biases=False), "biases b_q, b_k, b_v, b_o are not added"),
    "W.T": (mha_variant(transpose_weights=True), "used transposed"),
    "W_q everywhere": (mha_same_projection, "projected with W_q"),
    "split reshape only": (mha_variant(split=split_reshape_only), "each head gets whole tokens"),
    "interleaved": (
        mha_variant(split=split_interleaved, merge=merge_interleaved),
        "head h gets features h, h+H",
    ),
    "merge reshape only": (mha_variant(merge=merge_reshape_only), "(B, T, D) without moving"),
    "merge interleaved": (mha_variant(merge=merge_interleaved), "(Dh, H) instead of"),
    "one head": (mha_one_head, "num_heads is ignored"),
    "averaged weights": (mha_averaged_weights, "averaged over the heads"),
    "summed weights": (lambda *a, **k: (lambda o, w: (o, w.sum(axis=1)))(*learner_mha(*a, **k)),
                       "summed over the heads"),
    "heads summed": (mha_variant(merge=merge_sum), "reach W_o without being concatenated"),
    "no b_o": (mha_without("b_o"), "b_o is not added"),
    "no b_v": (mha_without("b_v"), "b_v is not added"),
    "no b_q": (mha_without("b_q"), "b_q is not added"),
    "keys from query": (mha_keys_from_query, "The keys are projected from query"),
    "crashes on None": (mha_variant(plain_biases=True), "Fails when the biases are None"),
    "zero fill": (mha_variant(attend=lambda q, k, v, m: attention(q, k, v, m, fill=0.0)),
                  "Blocked scores are set to 0 instead of -inf"),
    "global max": (mha_variant(attend=sdpa_normalised_by(softmax_global_max_zeros)),
                   "the whole array's maximum is subtracted from every slice"),
    "mean": (mha_variant(attend=sdpa_normalised_by(softmax_mean)),
             "shifted by its mean, not its maximum"),
    "no transpose": (mha_variant(attend=sdpa_no_transpose), "the scores look like q @ k in"),
    "sqrt(d_model)": (
        mha_variant(attend=lambda q, k, v, m: attention(q, k, v, m, scale=sqrt_d_model)),
        "divided by sqrt(d_model)",
    ),
    "no scaling": (mha_variant(attend=sdpa_unscaled), "No 1/sqrt(head_dim) scaling"),
    "sqrt(T)": (mha_variant(attend=sdpa_sqrt_t), "sqrt(T), the number of queries"),
    "inverted mask": (mha_variant(attend=sdpa_inverted_mask), "An inverted mask"),
    "mask ignored": (mha_variant(attend=sdpa_ignores_mask), "The mask has no effect"),
    "wrong axis": (mha_variant(attend=sdpa_wrong_axis), "runs over the wrong axis"),
    "overflow": (mha_variant(attend=sdpa_overflows), "exp overflows"),
    "nan row": (mha_variant(attend=sdpa_nan_row), "NaN for a row with nothing to attend to"),
    "finite fill": (mha_variant(attend=sdpa_finite_fill), "a large finite number, not -inf"),
    "output only": (mha_output_only, "Only the output is returned"),
    "swapped": (mha_swapped, "wrong order: (weights, output)"),
}

WINDOW = {
    "wide": (window_shifted(shift=1), "window + 1 positions"),
    "narrow": (window_shifted(shift=-1), "sees window - 1 positions"),
    "symmetric": (window_shifted(absolute=True), "Not causal"),
    "top left": (window_shifted(top_left=True), "Aligned to the top left"),
    "square": (window_shifted(square=True), "num_keys is ignored"),
    "inverted": (lambda size, window, num_keys=None: ~window_loops(size, window, num_keys),
                 "An inverted mask"),
    "float": (lambda size, window, num_keys=None: window_loops(size, window, num_keys) * 1.0,
              "not a boolean array"),
}

KV_BYTES = {
    "keys only": (kv_bytes_variant(keys_only=True), "only the keys are counted"),
    "no window": (kv_bytes_variant(window_rule=None), "The window is ignored"),
    "max": (kv_bytes_variant(window_rule=max), "max instead of min"),
    "no batch": (kv_bytes_variant(batch=False), "batch_size is ignored"),
    "2 bytes": (kv_bytes_variant(fixed_bytes=True), "bytes_per_value is ignored"),
    "bits": (kv_bytes_variant(bits=True), "Bits, not bytes"),
    "w - 1": (kv_bytes_variant(window_rule=lambda n, w: min(n, w - 1)),
              "a window of w keeps w - 1"),
    "window always": (kv_bytes_variant(window_rule=lambda n, w: w),
                      "The window replaces the context length"),
}

def rope_half_split(x, positions, base=10000.0):
    x = np.asarray(x)
    half = x.shape[-1] // 2
    angles = np.asarray(positions)[:, None] * base ** (-2 * np.arange(half) / x.shape[-1])
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * np.cos(angles) - second * np.sin(angles),
                           first * np.sin(angles) + second * np.cos(angles)], axis=-1)


ROPE = {
    "half split": (rope_half_split, "paired with i + Dh/2"),
    "slow frequencies": (
        lambda x, positions, base=10000.0: mha.apply_rope(x, positions, base**0.5),
        "base^(-i/Dh)"),
    "clockwise": (lambda x, positions, base=10000.0: mha.apply_rope(x, -np.asarray(positions),
                                                                    base),
                  "turns clockwise"),
    "base ignored": (lambda x, positions, base=10000.0: rope_loops(x, positions),
                     "base is ignored"),
    "from zero": (lambda x, positions, base=10000.0: mha.apply_rope(
        x, np.arange(np.shape(x)[-2]), base), "positions is ignored"),
}

SLOPES = {
    "from one": (lambda n: 0.5 ** (8 * np.arange(n) / n), "the first slope is 1"),
    "any count": (lambda n: 0.5 ** (8 * np.arange(1, n + 1) / n), "for every head count"),
    "halving": (lambda n: 0.5 ** np.arange(1, n + 1), "halve from head to head"),
    "reversed": (lambda n: slopes_written_out(n)[::-1], "reverse order"),
    "even powers": (lambda n: slopes_written_out(n, odd=False), "the even powers"),
    "sorted": (lambda n: np.array(sorted(slopes_written_out(n), reverse=True)),
               "wrong order for a head count that is not a power of two"),
    "list": (lambda n: slopes_written_out(n).tolist(), "is not a NumPy float64 array"),
    "float32": (lambda n: slopes_written_out(n).astype(np.float32),
                "smaller float type than mha's"),
}

MISTAKES = {
    "softmax": SOFTMAX,
    "scaled_dot_product_attention": SDPA,
    "split_heads": SPLIT,
    "merge_heads": MERGE,
    "causal_mask": CAUSAL,
    "padding_mask": PADDING,
    "multi_head_attention": MHA,
    "sliding_window_mask": WINDOW,
    "kv_cache_bytes": KV_BYTES,
    "apply_rope": ROPE,
    "alibi_slopes": SLOPES,
}


@pytest.mark.parametrize(
    ("name", "mistake"),
    [(name, mistake) for name, table in MISTAKES.items() for mistake in table],
)
def test_each_mistake_gets_its_own_diagnosis(capsys, name: str, mistake: str) -> None:
    table = MISTAKES[name]
    candidate, phrase = table[mistake]
    verdict, out = run(capsys, name, candidate)
    assert verdict is False
    assert out.startswith(f"{name}: case ")
    assert "Likely mistake: " in out and "Hint: " in out
    assert phrase in out, out
    others = [other for other, (_, p) in table.items() if p != phrase and p in out]
    assert not others, f"{mistake} also printed the diagnosis of {others}: {out}"


# --------------------------------------------------------------------------- other reports


@pytest.mark.parametrize("name", exercises.names())
def test_a_stub_is_not_implemented_yet(capsys, name: str) -> None:
    def stub(*args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    verdict, out = run(capsys, name, stub)
    assert verdict is False
    assert out == f"{name}: not implemented yet."


def test_biases_that_are_none_are_among_the_cases(capsys) -> None:
    """The prompt says the biases may be None: a function that crashes on None fails."""

    def crashes_on_none(query, key, value, params, num_heads, mask=None):
        if params.b_q is None:
            raise TypeError("unsupported operand type(s) for +: 'float' and 'NoneType'")
        return mha.multi_head_attention(query, key, value, params, num_heads, mask)

    verdict, out = run(capsys, "multi_head_attention", crashes_on_none)
    assert verdict is False
    assert "biases None" in out and "raised TypeError" in out


def test_positions_given_as_a_list_are_among_the_cases(capsys) -> None:
    def arrays_only(x, positions, base=10000.0):
        positions.shape  # noqa: B018 - a list has no shape: this line raises for one
        return mha.apply_rope(x, positions, base)

    verdict, out = run(capsys, "apply_rope", arrays_only)
    assert verdict is False
    assert "positions as a list [3, 1, 4]" in out and "raised AttributeError" in out


def test_lengths_given_as_a_list_are_among_the_cases(capsys) -> None:
    def arrays_only(lengths=None, *, tokens=None, pad_id=None, max_len=None):
        if tokens is None:
            lengths.max()  # a list has no max: this line raises for one
        return padding_loops(lengths, tokens=tokens, pad_id=pad_id, max_len=max_len)

    verdict, out = run(capsys, "padding_mask", arrays_only)
    assert verdict is False
    assert "lengths as a list [2, 4, 1]" in out and "raised AttributeError" in out


def test_window_one_drawn_from_the_top_left_is_refused(capsys) -> None:
    """np.eye(T, S) is the mask of a window of 1 only when S == T: the queries are the
    last T of the S positions. Only the case with window 1 and more keys than queries
    tells it apart (issue 32: without that case it passed)."""

    def eye_for_window_one(size, window, num_keys=None):
        if window == 1:
            return np.eye(size, size if num_keys is None else num_keys, dtype=bool)
        return window_loops(size, window, num_keys)

    verdict, out = run(capsys, "sliding_window_mask", eye_for_window_one)
    assert verdict is False
    assert "(size=3, window=1, num_keys=5)" in out and "Aligned to the top left" in out


def test_a_case_left_unimplemented_is_named(capsys) -> None:
    def only_last_axis(x, axis=-1):
        if axis != -1:
            raise NotImplementedError("only the last axis")
        return softmax_loops(x)

    verdict, out = run(capsys, "softmax", only_last_axis)
    assert verdict is False
    assert "case 4 of 10" in out and "axis=0" in out
    assert "is not implemented yet (NotImplementedError)" in out


def test_changing_an_input_in_place_is_reported(capsys) -> None:
    def in_place(x, axis=-1):
        x[...] = softmax_loops(x, axis)  # right values, but in the caller's array
        return x

    verdict, out = run(capsys, "softmax", in_place)
    assert verdict is False
    assert "case 1 of 10 (x (3, 5)): your function changed its argument x in place" in out
    assert "Likely mistake" not in out


def test_changing_the_weights_in_place_is_reported(capsys) -> None:
    def folds_scale_into_w_q(query, key, value, params, num_heads, mask=None):
        scale = (params.d_model // num_heads) ** -0.5
        params.W_q *= scale  # right output, but the caller's weights are changed
        params.b_q *= scale
        return learner_mha(query, key, value, params, num_heads, mask, attend=sdpa_unscaled)

    verdict, out = run(capsys, "multi_head_attention", folds_scale_into_w_q)
    assert verdict is False
    assert "case 1 of 9" in out and "changed its argument params.W_q in place" in out


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (None, "returned None (is a return statement missing?)"),
        ("probabilities", "returned str where an array of numbers was expected"),
        ([1.0, [2.0, 3.0]], "returned list where an array of numbers was expected"),
    ],
)
def test_a_result_that_is_not_an_array(capsys, result: Any, message: str) -> None:
    verdict, out = run(capsys, "softmax", lambda x, axis=-1: result)
    assert verdict is False
    assert message in out


def test_a_pair_where_one_array_is_expected(capsys) -> None:
    verdict, out = run(capsys, "softmax", lambda x, axis=-1: (softmax_loops(x, axis), x))
    assert verdict is False
    assert "returned 2 arrays where mha returns one array" in out


def test_a_pair_holding_none(capsys) -> None:
    verdict, out = run(capsys, "scaled_dot_product_attention", lambda q, k, v, mask=None: (q, None))
    assert verdict is False
    assert "returned None where an array of numbers was expected" in out


def test_an_exception_is_reported_with_the_generic_hint(capsys) -> None:
    def two_dims_only(x, axis=-1):
        rows, cols = x.shape
        return softmax_loops(x, axis)

    verdict, out = run(capsys, "softmax", two_dims_only)
    assert verdict is False
    assert "case 3 of 10 (x (2, 3, 5)): raised ValueError: too many values to unpack" in out
    assert "Likely mistake" not in out and "Hint: Check on a small input" in out


def test_an_unknown_mistake_gets_the_largest_deviation(capsys) -> None:
    verdict, out = run(capsys, "softmax", lambda x, axis=-1: softmax_loops(x, axis) + 1e-3)
    assert verdict is False
    assert "case 1 of 10 (x (3, 5)): the result differs from mha's by up to 0.001" in out
    assert "Likely mistake" not in out and "Hint: " in out


@pytest.mark.parametrize(("value", "word"), [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_a_non_number_is_named(capsys, value: float, word: str) -> None:
    def spoiled(q, k, v, mask=None):
        context, weights = sdpa_einsum(q, k, v, mask)
        weights = weights.copy()
        weights[..., -1, -1] = value
        return context, weights

    verdict, out = run(capsys, "scaled_dot_product_attention", spoiled)
    assert verdict is False
    assert f"weights have {word} where a number was expected (at (2, 3))" in out


def test_a_plural_output_is_named_in_the_plural(capsys) -> None:
    verdict, out = run(capsys, "alibi_slopes", lambda n: mha.alibi_slopes(n) * 1.01)
    assert verdict is False
    assert "the slopes differ from mha's by up to" in out


def test_a_list_of_heads_shows_in_the_shape(capsys) -> None:
    """The first case has B != H, so the list of heads, read as (H, B, T, Dh), is named
    by its shape and not by a difference of numbers."""
    verdict, out = run(capsys, "split_heads", SPLIT["list"][0])
    assert verdict is False
    assert "case 1 of 5" in out
    assert "the result has shape (3, 1, 4, 2), expected (1, 3, 4, 2)" in out


def test_a_wrong_shape_is_named(capsys) -> None:
    def three_dims(lengths=None, *, tokens=None, pad_id=None, max_len=None):
        return padding_loops(lengths, tokens=tokens, pad_id=pad_id, max_len=max_len)[:, 0]

    verdict, out = run(capsys, "padding_mask", three_dims)
    assert verdict is False
    assert "the mask has shape (3, 1, 4), expected (3, 1, 1, 4)" in out
    assert "Likely mistake" not in out


def test_two_mistakes_name_the_one_seen_first(capsys) -> None:
    def unscaled_and_overflowing(q, k, v, mask=None):
        weights = softmax_overflows(
            np.where(True if mask is None else mask, q @ k.swapaxes(-1, -2), -np.inf)
        )
        return weights @ v, weights

    verdict, out = run(capsys, "scaled_dot_product_attention", unscaled_and_overflowing)
    assert verdict is False
    assert "case 1 of 10" in out and "No 1/sqrt(head_dim) scaling" in out
    assert "exp overflows" not in out


# --------------------------------------------------------------------------- the interface


@pytest.mark.plumbing
def test_names_lists_every_chapters_functions() -> None:
    """The registry says which chapter owns each checker, the chapters' solutions say
    which checkers they call (``workbook: {check: NAME}``): the two agree, and names()
    lists the checkers in the book's order."""
    used = {chapter: workbook.checks(chapter) for chapter in workbook.chapter_names()}
    owners = {name: exercises.chapter_of(name) for name in exercises.names()}
    problems = workbook.ownership_problems(owners, used)
    assert not problems, "\n".join(problems)
    assert exercises.names() == [name for checks in used.values() for name in checks]
    for chapter in used:
        assert exercises.names(chapter) == used[chapter], chapter
    for name in exercises.names():
        exercise = exercises._EXERCISES[name]
        # mha's own function, or a reference named because mha has none of that name
        assert callable(exercise.reference) != callable(getattr(mha, name, None)), name


def test_the_verdict_is_a_bool_that_a_notebook_does_not_display(capsys) -> None:
    from IPython.core.formatters import DisplayFormatter

    passed = exercises.check("causal_mask", causal_compare)
    failed = exercises.check("causal_mask", CAUSAL["inverted"][0])
    capsys.readouterr()
    assert passed and not failed
    assert passed == True and failed == False  # noqa: E712 - the comparison is the test
    assert repr(passed) == "Verdict(passed=True)"
    # IPython asks the object to display itself, gets nothing, and shows nothing:
    assert DisplayFormatter().format(passed) == ({}, {})
    assert DisplayFormatter().format(True) != ({}, {})  # unlike a plain bool


def test_an_unknown_name_lists_the_known_ones() -> None:
    known = "known: causal_mask, padding_mask, softmax, "
    with pytest.raises(ValueError, match=f"unknown exercise 'sofmax'; {known}"):
        exercises.check("sofmax", mha.softmax)


def test_a_candidate_must_be_callable() -> None:
    with pytest.raises(ValueError, match="candidate must be a function, got ndarray"):
        exercises.check("softmax", np.zeros(3))


def test_the_reference_output_is_never_printed(capsys) -> None:
    for name, candidate in [
        ("softmax", lambda x, axis=-1: softmax_loops(x, axis) * 0.99),
        ("scaled_dot_product_attention", sdpa_unscaled),
        ("multi_head_attention", MHA["no W_o"][0]),
        ("causal_mask", CAUSAL["k=1"][0]),
    ]:
        verdict, out = run(capsys, name, candidate)
        assert verdict is False
        assert "[" not in out and "array(" not in out  # no array was printed
    # spot-check: none of mha's numbers for the failing case appears
    _, out = run(capsys, "softmax", lambda x, axis=-1: softmax_loops(x, axis) * 0.99)
    assert "case 1 of 10" in out
    x = exercises._EXERCISES["softmax"].cases(np.random.default_rng(exercises._SEED))[0].args[0]
    for value in mha.softmax(x).ravel():
        assert f"{value:.4f}" not in out and str(value) not in out


def test_reports_are_repeatable(capsys) -> None:
    first = run(capsys, "multi_head_attention", MHA["inverted mask"][0])
    assert run(capsys, "multi_head_attention", MHA["inverted mask"][0]) == first


def test_a_correct_float32_implementation_passes(capsys) -> None:
    def float32_softmax(x, axis=-1):
        x = np.asarray(x)
        return softmax_loops(x, axis).astype(x.dtype)

    assert run(capsys, "softmax", float32_softmax)[0] is True


# --------------------------------------------------------------------------- the mistake models


@pytest.mark.parametrize("name", exercises.names())
def test_every_mistake_model_is_told_apart(capsys, name: str) -> None:
    """Each private model, run as a candidate, gets its own diagnosis: the cases are
    rich enough to tell every pair of mistakes apart."""
    exercise = exercises._EXERCISES[name]
    for mistake in exercise.mistakes:
        verdict, out = run(capsys, name, mistake.model)
        assert verdict is False
        assert " ".join(f"Likely mistake: {mistake.what}".split()) in out, out


def test_a_broken_case_is_an_error_of_the_checker(monkeypatch) -> None:
    exercise = exercises._EXERCISES["causal_mask"]
    broken = dataclasses.replace(exercise, cases=lambda rng: [_Case("size=0", (0,))])
    monkeypatch.setitem(exercises._EXERCISES, "causal_mask", broken)
    with pytest.raises(RuntimeError, match="mha.causal_mask failed on a checker case"):
        exercises.check("causal_mask", causal_compare)


def test_the_models_start_from_mha(capsys) -> None:
    """The models' unchanged steps are mha's: with no change they pass the checker."""
    assert run(capsys, "scaled_dot_product_attention", _attend)[0] is True
    assert run(capsys, "multi_head_attention", _multi_head)[0] is True


@pytest.mark.plumbing
@pytest.mark.slow
def test_the_module_imports_neither_torch_nor_matplotlib() -> None:
    code = (
        "import sys, mha.exercises; "
        "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def reaches_below_mha(source: str) -> list[str]:
    """What ``source`` imports besides the standard library, NumPy and ``import mha``,
    and each ``mha.<submodule>`` it names: the checkers use mha's top-level names."""
    submodules = {m.name for m in pkgutil.iter_modules(mha.__path__)} | {"functional"}

    def allowed(module: str) -> bool:
        return module in ("mha", "numpy") or module.split(".")[0] in sys.stdlib_module_names

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if not allowed(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found += [] if node.module != "mha" and allowed(node.module) else [node.module]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "mha" and node.attr in submodules:
                found.append(f"mha.{node.attr}")
    return found


@pytest.mark.plumbing
def test_the_package_uses_only_numpy_and_mhas_top_level_names() -> None:
    bad = "import torch\nimport mha\nfrom mha import attention\nmha.attention.softmax\n"
    assert reaches_below_mha(bad) == ["torch", "mha", "mha.attention"]
    assert reaches_below_mha("import math\nimport numpy\nimport mha\nmha.softmax\n") == []
    package = Path(exercises.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) > 1  # the package, not a single module
    for path in modules:
        assert reaches_below_mha(path.read_text()) == [], path.name

"""The multi_head_attention exercise: its cases, and models of the usual mistakes.

:func:`_multi_head` is ``mha``'s multi-head attention with each step replaceable; a
mistake model replaces one step or runs it on changed weights. Mistakes inside the
attention of each head come from :mod:`._attention`, mistakes in splitting and merging
the heads from :mod:`._heads`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import mha

from ._attention import _attend, _attention_mistakes, _attention_output_mistakes
from ._core import _Case, _label, _Mistake, _mixed_mask
from ._heads import (
    _HEAD_BLOCK_HINT,
    _merge_interleaved,
    _merge_reshape_only,
    _split_interleaved,
    _split_reshape_only,
)

# --------------------------------------------------------------------------- mistake models
# Each model is mha's computation with one step done the usual wrong way. The correct
# steps come from mha itself (split_heads, merge_heads, softmax, ...).


def _split(x: np.ndarray, num_heads: int) -> np.ndarray:
    return mha.split_heads(x, num_heads)


def _merge(x: np.ndarray) -> np.ndarray:
    return mha.merge_heads(x)


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x @ w  # (B, L, D_in) @ (D_in, D_out) -> (B, L, D_out)
    return y if b is None else y + b


def _multi_head(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: mha.AttentionParams,
    num_heads: int,
    mask: np.ndarray | None = None,
    *,
    attend: Callable[..., tuple[np.ndarray, np.ndarray]] = _attend,
    split: Callable[[np.ndarray, int], np.ndarray] = _split,
    merge: Callable[[np.ndarray], np.ndarray] = _merge,
    project_output: bool = True,
    average_weights: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention with each step replaceable; defaults are correct."""
    q = split(_linear(query, params.W_q, params.b_q), num_heads)  # (B, H, T, Dh)
    k = split(_linear(key, params.W_k, params.b_k), num_heads)  # (B, H, S, Dh)
    v = split(_linear(value, params.W_v, params.b_v), num_heads)  # (B, H, S, Dh)
    context, weights = attend(q, k, v, mask)  # (B, H, T, Dh), (B, H, T, S)
    merged = merge(context)  # (B, H, T, Dh) -> (B, T, D)
    output = _linear(merged, params.W_o, params.b_o) if project_output else merged
    return output, weights.mean(axis=1) if average_weights else weights


def _with_params(change: Callable[[mha.AttentionParams], dict[str, Any]]) -> Callable:
    """A model that runs correct multi-head attention on changed weights."""

    def model(
        query: Any, key: Any, value: Any, params: Any, num_heads: int, mask: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        changed = dataclasses.replace(params, **change(params))
        return _multi_head(query, key, value, changed, num_heads, mask)

    return model


def _one_head(
    query: Any, key: Any, value: Any, params: Any, num_heads: int, mask: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    return _multi_head(query, key, value, params, 1, mask)


# --------------------------------------------------------------------------- diagnoses


def _mha_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            partial(_multi_head, project_output=False),
            "W_o forgotten: the output is the merged heads, without the output "
            "projection (merged @ W_o + b_o).",
            "Revisit MultiHead = Concat(head_1, ..., head_H) W_o: what mixes the heads?",
        ),
        _Mistake(
            _with_params(lambda p: {n: None for n in ("b_q", "b_k", "b_v", "b_o")}),
            "The biases b_q, b_k, b_v, b_o are not added.",
            "Each projection is a linear layer, x @ W + b.",
        ),
        _Mistake(
            _with_params(lambda p: {n: getattr(p, n).T for n in ("W_q", "W_k", "W_v", "W_o")}),
            "The weight matrices are used transposed (x @ W.T, PyTorch's layout).",
            "Revisit AttentionParams' convention: W has shape (D_in, D_out) and a layer "
            "computes x @ W + b.",
        ),
        _Mistake(
            _with_params(lambda p: {"W_k": p.W_q, "b_k": p.b_q, "W_v": p.W_q, "b_v": p.b_q}),
            "Keys and values are projected with W_q (and b_q) too.",
            "Queries, keys and values each have their own projection.",
        ),
        _Mistake(
            partial(_multi_head, split=_split_reshape_only),
            "split_heads without the transpose: (B, T, D) reshaped straight to "
            "(B, H, T, Dh), so each head gets whole tokens.",
            _HEAD_BLOCK_HINT,
        ),
        _Mistake(
            partial(_multi_head, split=_split_interleaved, merge=_merge_interleaved),
            "The heads are interleaved: head h gets features h, h+H, h+2H, ... instead "
            "of the block h*Dh:(h+1)*Dh.",
            _HEAD_BLOCK_HINT,
        ),
        _Mistake(
            partial(_multi_head, merge=_merge_reshape_only),
            "Heads merged in the wrong order: the context (B, H, T, Dh) was reshaped "
            "straight to (B, T, D) without moving the head axis.",
            "Before concatenating, the H heads of one token must sit next to each other.",
        ),
        _Mistake(
            partial(_multi_head, merge=_merge_interleaved),
            "Heads merged in the wrong order: the features are interleaved, (Dh, H) "
            "instead of head 0's Dh features, then head 1's, ...",
            "Merging must undo the split exactly: head h goes back to features h*Dh:(h+1)*Dh.",
        ),
        _Mistake(
            _one_head,
            "num_heads is ignored: one head of width D attends instead of H heads of width D / H.",
            "Each head computes its own attention weights over its own Dh features.",
        ),
        _Mistake(
            partial(_multi_head, average_weights=True),
            "The weights are averaged over the heads, (B, T, S); mha returns every head's "
            "weights, (B, H, T, S).",
            "The weights of each head are part of the result (a chapter draws them).",
        ),
        *_attention_mistakes(multi_head=_multi_head),
        *_attention_output_mistakes(("output", "weights"), _multi_head),
    )


# --------------------------------------------------------------------------- cases


def _params(rng: np.random.Generator, d_model: int, dtype: Any = np.float64) -> Any:
    """Seeded weights with non-zero biases (init's are zero, which would hide bias bugs)."""
    params = mha.AttentionParams.init(d_model, seed=int(rng.integers(1000)), dtype=dtype)
    biases = {
        name: (rng.normal(size=d_model) * 0.5).astype(dtype)
        for name in ("b_q", "b_k", "b_v", "b_o")
    }
    return dataclasses.replace(params, **biases)


def _mha_case(
    rng: np.random.Generator,
    sizes: tuple[int, int, int],
    num_heads: int,
    mask: np.ndarray | None = None,
    tag: str = "",
    scale: float = 1.0,
    dtype: Any = np.float64,
) -> _Case:
    batch, target_len, source_len = sizes
    d_model = 12
    query = (rng.normal(size=(batch, target_len, d_model)) * scale).astype(dtype)
    if source_len:
        key = (rng.normal(size=(batch, source_len, d_model)) * scale).astype(dtype)
        value = rng.normal(size=(batch, source_len, d_model)).astype(dtype)
    else:  # self-attention: the same array three times
        key = value = query
    kwargs = {} if mask is None else {"mask": mask}
    parts = [_label(query=query, key=key, value=value), f"num_heads={num_heads}", _label(**kwargs)]
    label = ", ".join(filter(None, [*parts, tag]))
    args = (query, key, value, _params(rng, d_model, dtype), num_heads)
    return _Case(label, args, kwargs, loose=dtype == np.float32)


def _mha_cases(rng: np.random.Generator) -> list[_Case]:
    empty = mha.causal_mask(4) & _mixed_mask(rng, 2, 1, 4, 4)
    empty[1, 0, 2] = False
    return [
        # S == head_dim == 4: a missing transpose still runs, and gives wrong numbers
        _mha_case(rng, (2, 3, 4), 3),
        _mha_case(rng, (2, 5, 0), 4),
        _mha_case(rng, (2, 5, 0), 3, mha.causal_mask(5), "causal"),
        _mha_case(rng, (2, 3, 6), 3, mha.padding_mask([6, 4]), "padding"),
        _mha_case(rng, (2, 3, 5), 3, tag="large scores such as 1000", scale=40.0),
        _mha_case(rng, (2, 4, 0), 2, empty, "a row with nothing to attend to"),
        _mha_case(rng, (1, 4, 0), 3, mha.causal_mask(4), "float32", dtype=np.float32),
    ]

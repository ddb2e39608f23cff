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
    output_per_head: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention with each step replaceable; defaults are correct."""
    q = split(_linear(query, params.W_q, params.b_q), num_heads)  # (B, H, T, Dh)
    k = split(_linear(key, params.W_k, params.b_k), num_heads)  # (B, H, S, Dh)
    v = split(_linear(value, params.W_v, params.b_v), num_heads)  # (B, H, S, Dh)
    context, weights = attend(q, k, v, mask)  # (B, H, T, Dh), (B, H, T, S)
    if output_per_head:  # head h times only its own block of W_o, then merged
        head_dim = context.shape[-1]
        blocks = [
            context[:, h] @ params.W_o[h * head_dim:(h + 1) * head_dim,
                                       h * head_dim:(h + 1) * head_dim]
            for h in range(num_heads)
        ]  # H x (B, T, Dh)
        merged = merge(np.stack(blocks, axis=1))  # (B, H, T, Dh) -> (B, T, D)
        output = merged if params.b_o is None else merged + params.b_o
        return output, weights
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
            partial(_multi_head, output_per_head=True),
            "W_o is applied per head before the merge: each head's context is "
            "multiplied only by its own Dh x Dh block of W_o, so the heads never mix.",
            "W_o takes the whole concatenation, D features from all heads, to each of "
            "the D outputs: merge first, then project.",
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


def _params(rng: np.random.Generator, d_model: int, dtype: Any = np.float64,
            biases: bool = True, kv_width: int | None = None) -> Any:
    """Seeded weights with non-zero biases (init's are zero, which would hide bias bugs);
    ``biases=False``: all four None. ``kv_width``: keys and values of another width."""
    params = mha.AttentionParams.init(d_model, seed=int(rng.integers(1000)), dtype=dtype)
    if kv_width is not None:
        scale = kv_width**-0.5
        params = dataclasses.replace(
            params,
            W_k=(rng.normal(size=(kv_width, d_model)) * scale).astype(dtype),
            W_v=(rng.normal(size=(kv_width, d_model)) * scale).astype(dtype),
        )
    names = ("b_q", "b_k", "b_v", "b_o")
    if not biases:
        return dataclasses.replace(params, **{name: None for name in names})
    values = {name: (rng.normal(size=d_model) * 0.5).astype(dtype) for name in names}
    return dataclasses.replace(params, **values)


def _mha_case(
    rng: np.random.Generator,
    sizes: tuple[int, int, int],
    num_heads: int,
    mask: np.ndarray | None = None,
    tag: str = "",
    scale: float = 1.0,
    dtype: Any = np.float64,
    biases: bool = True,
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
    args = (query, key, value, _params(rng, d_model, dtype, biases), num_heads)
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
        _mha_case(rng, (2, 5, 0), 2, mha.padding_mask([5, 3]), "padding, self-attention"),
        _mha_case(rng, (2, 4, 0), 3, tag="biases None", biases=False),
        _mha_case(rng, (2, 3, 5), 3, tag="large scores such as 1000", scale=40.0),
        _mha_case(rng, (2, 4, 0), 2, empty, "a row with nothing to attend to"),
        _mha_case(rng, (1, 4, 0), 3, mha.causal_mask(4), "float32", dtype=np.float32),
    ]


# --------------------------------------------------------------------------- cross_attention
# Chapter 5: the decoder's queries read an encoder memory whose width may differ from
# d_model (PyTorch's kdim and vdim): W_k and W_v are (D_mem, D).


def _cross_attention(x: Any, memory: Any, params: Any, num_heads: int,
                     mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Queries from x (B, T, D); keys and values from memory (B, S, D_mem)."""
    return mha.multi_head_attention(x, memory, memory, params, num_heads, mask)


def _cross_model(**change: Any) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    roles = change.pop("roles", "cross")
    causal = change.pop("causal", False)
    values_with_w_k = change.pop("values_with_w_k", False)

    def model(x: Any, memory: Any, params: Any, num_heads: int, mask: Any = None) -> Any:
        query, source = (memory, x) if roles == "swapped" else (x, memory)
        if roles == "self":
            source = x
        if causal:
            top_left = np.tril(np.ones((x.shape[1], memory.shape[1]), dtype=bool))
            mask = top_left if mask is None else mask & top_left
        if values_with_w_k:
            params = dataclasses.replace(params, W_v=params.W_k, b_v=params.b_k)
        return _multi_head(query, source, source, params, num_heads, mask, **change)

    return model


def _cross_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _cross_model(roles="self"),
            "Self-attention: the keys and values come from x instead of the memory "
            "(the shapes only fit when the memory is as wide as x).",
            "In cross-attention the decoder asks (queries from x) and the source "
            "answers (keys and values from memory).",
        ),
        _Mistake(
            _cross_model(roles="swapped"),
            "The roles are swapped: the queries come from the memory and the keys and "
            "values from x.",
            "The output has one row per query: a decoder position, so T rows.",
        ),
        _Mistake(
            _cross_model(causal=True),
            "A causal mask is added: cross-attention may read the whole source, every "
            "target position every source word.",
            "The causal mask hides future *target* words; the source is all known.",
        ),
        _Mistake(
            _cross_model(project_output=False),
            "W_o forgotten: the output is the merged heads, without the output "
            "projection (merged @ W_o + b_o).",
            "Cross-attention ends like every multi-head attention: Concat(heads) W_o.",
        ),
        _Mistake(
            _cross_model(values_with_w_k=True),
            "The values are projected with W_k (and b_k): keys and values share the "
            "memory but not the projection.",
            "Queries, keys and values each have their own projection.",
        ),
        *_attention_output_mistakes(("output", "weights"), _cross_attention),
    )


def _cross_cases(rng: np.random.Generator) -> list[_Case]:
    d_model = 12

    def case(batch: int, target_len: int, source_len: int, mem_width: int, num_heads: int,
             mask: np.ndarray | None = None, tag: str = "", biases: bool = True,
             dtype: Any = np.float64) -> _Case:
        x = rng.normal(size=(batch, target_len, d_model)).astype(dtype)
        memory = rng.normal(size=(batch, source_len, mem_width)).astype(dtype)
        params = _params(rng, d_model, dtype, biases,
                         None if mem_width == d_model else mem_width)
        kwargs = {} if mask is None else {"mask": mask}
        label = ", ".join(filter(None, [_label(x=x, memory=memory, **kwargs),
                                        f"num_heads={num_heads}", tag]))
        return _Case(label, (x, memory, params, num_heads), kwargs, loose=dtype == np.float32)

    return [
        case(2, 3, 5, 8, 3, tag="memory narrower than x"),
        case(1, 4, 4, 12, 2, tag="memory as wide as x"),
        case(2, 3, 6, 12, 3, tag="memory as wide as x, T != S"),
        case(2, 4, 5, 20, 4, mha.padding_mask([5, 3]), "source padding, wider memory"),
        case(2, 2, 4, 6, 2, tag="biases None", biases=False),
        case(1, 3, 4, 8, 3, mha.padding_mask([2], max_len=4), "float32", dtype=np.float32),
    ]

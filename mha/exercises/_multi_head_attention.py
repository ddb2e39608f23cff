"""The multi_head_attention exercise: its cases, and models of the usual mistakes.

:func:`_multi_head` is ``mha``'s multi-head attention with each step replaceable; a
mistake model replaces one step or runs it on changed weights. Mistakes inside the
attention of each head come from :mod:`._attention`, mistakes in splitting and merging
the heads from :mod:`._heads`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import mha

from ._attention import _attend, _attention_mistakes, _attention_output_mistakes, _scaled_by
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
    sum_weights: bool = False,
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
    if average_weights or sum_weights:  # (B, H, T, S) -> (B, T, S)
        weights = weights.mean(axis=1) if average_weights else weights.sum(axis=1)
    return output, weights


def _with_params(change: Callable[[mha.AttentionParams], dict[str, Any]]) -> Callable:
    """A model that runs correct multi-head attention on changed weights."""

    def model(
        query: Any, key: Any, value: Any, params: Any, num_heads: int, mask: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        changed = dataclasses.replace(params, **change(params))
        return _multi_head(query, key, value, changed, num_heads, mask)

    return model


def _keys_from_query(
    query: Any, key: Any, value: Any, params: Any, num_heads: int, mask: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    return _multi_head(query, query, value, params, num_heads, mask)  # key never read


_NONE_BIASES = ("b_q", "b_k", "b_v", "b_o")


def _fails_on_none(model: Callable[..., Any]) -> Callable[..., Any]:
    """``model``, except that it raises as ``x @ W + None`` does when a bias is None."""

    def fails(*args: Any, **kwargs: Any) -> Any:
        params = next(a for a in args if isinstance(a, mha.AttentionParams))
        if any(getattr(params, name) is None for name in _NONE_BIASES):
            raise TypeError("unsupported operand type(s) for +: 'float' and 'NoneType'")
        return model(*args, **kwargs)

    return fails


_NONE_BIAS_MISTAKE = (
    "Fails when the biases are None: x @ W + None raises, and the exercise allows "
    "biases of None (they add nothing).",
    "Add a bias only when there is one: x @ W when b is None, x @ W + b otherwise.",
)


def _without(bias: str) -> Callable[[mha.AttentionParams], dict[str, Any]]:
    """One bias left out (a zero bias: AttentionParams has all four biases or none)."""

    def change(params: mha.AttentionParams) -> dict[str, Any]:
        b = getattr(params, bias)
        return {bias: None if b is None else np.zeros_like(b)}

    return change


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
            _with_params(_without("b_o")),
            "b_o is not added: the output projection is merged @ W_o without its bias.",
            "The output projection is a linear layer too, merged @ W_o + b_o.",
        ),
        _Mistake(
            _with_params(_without("b_v")),
            "b_v is not added: the values are value @ W_v without their bias.",
            "Each of the three input projections is a linear layer, x @ W + b.",
        ),
        _Mistake(
            _with_params(_without("b_q")),
            "b_q is not added: the queries are query @ W_q without their bias.",
            "Each of the three input projections is a linear layer, x @ W + b.",
        ),
        _Mistake(_fails_on_none(_multi_head), *_NONE_BIAS_MISTAKE),
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
            _keys_from_query,
            "The keys are projected from query instead of key: right in self-attention, "
            "where the two are the same array, but with another key the scores are "
            "(T, T) and do not fit the S values.",
            "Each of the three inputs has its own role: queries from query, keys from "
            "key, values from value.",
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
        _Mistake(
            partial(_multi_head, sum_weights=True),
            "The weights are summed over the heads, (B, T, S), so each row sums to H; "
            "mha returns every head's weights, (B, H, T, S).",
            "The weights of each head are part of the result (a chapter draws them).",
        ),
        *_attention_mistakes(multi_head=_multi_head),
        *_attention_output_mistakes(("output", "weights"), _multi_head),
    )


# The heads summed (or averaged, or left on an axis of their own) reach W_o with Dh
# features where it takes D: the product raises on every case, so only its error tells
# it apart. Every case has d_model = 12 (see _mha_case): the messages of NumPy's @ and
# np.dot for a (..., Dh) array times the (12, 12) W_o.
_NOT_CONCATENATED_ERRORS = ("(size 12 is different from", "!= 12 (dim 0)")


def _mha_raised() -> tuple[tuple[tuple[str, ...], _Mistake], ...]:
    return (
        (
            _NOT_CONCATENATED_ERRORS,
            _Mistake(
                partial(_multi_head, merge=lambda x: x.sum(axis=1)),
                "The heads reach W_o without being concatenated: merged @ W_o needs "
                "D = H * Dh features per token and gets Dh (the heads summed or "
                "averaged, or left on an axis of their own).",
                "Concat(head_1, ..., head_H) puts the heads side by side: H * Dh = D "
                "features per token, what W_o takes.",
            ),
        ),
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
    d_model = 12  # _NOT_CONCATENATED_ERRORS looks for this width in NumPy's messages
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
    scale = change.pop("scale", "head_dim")  # or "none", "memory" (sqrt(D_mem)), "model"
    use_mask = change.pop("use_mask", True)

    def model(x: Any, memory: Any, params: Any, num_heads: int, mask: Any = None) -> Any:
        query, source = (memory, x) if roles == "swapped" else (x, memory)
        if roles == "self":
            source = x
        if causal:
            top_left = np.tril(np.ones((x.shape[1], memory.shape[1]), dtype=bool))
            mask = top_left if mask is None else mask & top_left
        if values_with_w_k:
            params = dataclasses.replace(params, W_v=params.W_k, b_v=params.b_k)
        steps = dict(change)
        if scale == "none":
            steps["attend"] = partial(_attend, scale=lambda s, q, k, v: s)
        elif scale in ("memory", "model"):  # sqrt(D_mem) or sqrt(D)
            width = math.sqrt(np.shape(memory if scale == "memory" else x)[-1])
            steps["attend"] = partial(_attend, scale=_scaled_by(lambda q, k, v: width))
        return _multi_head(query, source, source, params, num_heads,
                           mask if use_mask else None, **steps)

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
        _Mistake(
            _cross_model(scale="none"),
            "No 1/sqrt(head_dim) scaling: the scores are not divided by sqrt(head_dim) "
            "in each head.",
            "Cross-attention is scaled dot-product attention too: "
            "softmax(q k^T / sqrt(Dh)) v in every head.",
        ),
        _Mistake(
            _cross_model(scale="memory"),
            "The scores are divided by sqrt(D_mem), the memory's width, instead of "
            "sqrt(head_dim): after the projections every key is Dh wide in each head.",
            "The scale comes from the length of the vectors in one dot product: a "
            "query and a key of one head, Dh numbers each.",
        ),
        _Mistake(
            _cross_model(scale="model"),
            "The scores are divided by sqrt(D), the width of x, instead of "
            "sqrt(head_dim), the width of one head's queries and keys.",
            "The scale comes from the length of the vectors in one dot product: a "
            "query and a key of one head, Dh numbers each.",
        ),
        _Mistake(
            _cross_model(use_mask=False),
            "The mask has no effect: the source's padding still gets weight.",
            "Pass the mask on to the attention of every head: blocked keys must get "
            "exactly zero weight.",
        ),
        _Mistake(_fails_on_none(_cross_attention), *_NONE_BIAS_MISTAKE),
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

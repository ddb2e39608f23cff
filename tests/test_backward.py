"""mha.backward: attention's gradients by hand, equal to torch.autograd's.

Oracles: autograd through plain torch ops written here (matmul, a masked softmax,
``repeat_interleave`` for grouped-query heads), ``F.scaled_dot_product_attention``,
``nn.MultiheadAttention`` with our weights copied in, and PyTorch's own CPU flash
backward, ``aten._scaled_dot_product_flash_attention_for_cpu_backward``. All in float64,
to ``1e-12`` times the magnitude of the gradient compared. The multiply-add counts of
:mod:`mha.cost` are checked against ``torch.utils.flop_counter``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count

import mha
from mha import (
    AttentionParams,
    TileTrace,
    causal_mask,
    combine_masks,
    flash_attention,
    merge_heads,
    multi_head_attention_steps,
    padding_mask,
    peak_memory_bytes,
    scaled_dot_product_attention,
    sliding_window_mask,
    softmax,
    split_heads,
)
from mha.attention_cost import attention_backward_bytes, attention_backward_macs, attention_macs
from mha.backward import (
    attention_backward,
    attention_backward_steps,
    merge_heads_backward,
    softmax_backward,
    split_heads_backward,
)
from mha.convert import params_to_torch
from mha.layer_backward import AttentionGradients, multi_head_attention_backward
from mha.tiled_backward import BackwardTileTrace, flash_attention_backward

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RTOL = 1e-12  # of the largest magnitude in the gradient compared


def assert_close(actual, expected, name=""):
    expected = expected.detach().numpy() if isinstance(expected, torch.Tensor) else expected
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    assert not np.isnan(actual).any(), name  # (assert_allclose takes NaN == NaN)
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=RTOL * scale, err_msg=name)


def random(shape, seed, scale=1.0):
    return np.random.default_rng(seed).normal(size=shape) * scale


def qkv(lead=(2, 3), T=7, S=9, Dh=4, Dv=5, seed=0):
    return (random((*lead, T, Dh), seed), random((*lead, S, Dh), seed + 1),
            random((*lead, S, Dv), seed + 2), random((*lead, T, Dv), seed + 3))  # fmt: skip


def leaves(*arrays):
    return [torch.tensor(a, requires_grad=True) for a in arrays]


def torch_attention(q, k, v, mask=None, score_bias=None):
    """Attention in plain torch ops; a row with nothing allowed gets zero weights."""
    scaled = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (..., T, S)
    if score_bias is not None:
        scaled = scaled + score_bias
    if mask is None:
        return torch.softmax(scaled, -1) @ v
    allowed = torch.from_numpy(np.asarray(mask))
    weights = torch.softmax(scaled.masked_fill(~allowed, -math.inf), -1)
    # softmax gives NaN in a row of -inf; where() sends it no gradient
    weights = torch.where(allowed.any(-1, keepdim=True), weights, 0.0)
    return weights @ v


def autograd(f, inputs, d_out):
    out = f(*inputs)
    return torch.autograd.grad(out, inputs, torch.from_numpy(d_out))


# ---------------------------------------------------------------------------- softmax


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_backward_equals_autograd(axis) -> None:
    z = random((4, 5, 6), 0, scale=3.0)
    z[random(z.shape, 1) > 1.0] = -np.inf  # blocked entries
    d_p = random(z.shape, 2)
    p = softmax(z, axis=axis)
    (tz,) = leaves(z)
    (expected,) = torch.autograd.grad(torch.softmax(tz, axis), tz, torch.from_numpy(d_p))
    defined = np.isfinite(z).any(axis=axis, keepdims=True) & np.ones(z.shape, bool)
    got = softmax_backward(p, d_p, axis=axis)
    assert_close(got[defined], expected.numpy()[defined])
    assert np.all(got[np.isneginf(z)] == 0)  # exact: p = 0 there


def test_softmax_backward_is_the_jacobian_product() -> None:
    p = softmax(random(6, 3))
    d_p = random(6, 4)
    jacobian = np.diag(p) - np.outer(p, p)  # J = diag(p) - p p^T, symmetric
    assert_close(softmax_backward(p, d_p), jacobian @ d_p)
    # A row with nothing to attend to: p = 0, so no gradient, not NaN.
    empty = softmax(np.full((2, 5), -np.inf))
    assert np.all(softmax_backward(empty, random((2, 5), 5)) == 0)  # exact


# --------------------------------------------------------------------------- one head


def masks_for(kind, lead, T, S):
    """A mask of each kind tested; "padding" and "random" leave rows with nothing to
    attend to, "random" a key that no query may see too."""
    if kind == "none":
        return None
    if kind == "causal":
        return causal_mask(T, num_keys=S)
    if kind == "window":
        return sliding_window_mask(T, 3, num_keys=S)
    if kind == "padding":  # (B, 1, 1, S); the last sequence has no key at all
        mask = padding_mask(np.linspace(S, 0, lead[0]).astype(int))
        return mask.reshape(lead[0], *[1] * (len(lead) - 1), 1, S)
    mask = np.random.default_rng(7).random((*lead, T, S)) < 0.5  # "random"
    mask[(0,) * len(lead) + (min(1, T - 1),)] = False  # a row with nothing to attend to
    mask[..., 2] = False  # a key no query may see
    return mask


SHAPES = [((2, 3), 7, 9), ((2, 3), 9, 9), ((3,), 1, 6), ((2, 2), 11, 13)]
MASKS = ["none", "causal", "window", "padding", "random"]


@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize(("lead", "T", "S"), SHAPES)
def test_attention_backward_equals_autograd(kind, lead, T, S) -> None:
    q, k, v, d_context = qkv(lead, T, S, seed=T * S)
    mask = masks_for(kind, lead, T, S)
    dq, dk, dv = attention_backward(q, k, v, d_context, mask)
    expected = autograd(lambda *x: torch_attention(*x, mask), leaves(q, k, v), d_context)
    for name, got, want in zip("qkv", (dq, dk, dv), expected, strict=True):
        assert_close(got, want, f"d{name}")
    # PyTorch's own attention agrees, and gives those rows zeros too.
    allowed = None if mask is None else torch.from_numpy(mask)
    fused = autograd(lambda *x: F.scaled_dot_product_attention(*x, attn_mask=allowed),
                     leaves(q, k, v), d_context)  # fmt: skip
    for name, got, want in zip("qkv", (dq, dk, dv), fused, strict=True):
        assert_close(got, want, f"d{name} against F.sdpa")
    # The saved weights give the same computation, hence the same bits.
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    for a, b in zip(attention_backward(q, k, v, d_context, mask, weights=weights),
                    (dq, dk, dv), strict=True):  # fmt: skip
        assert np.array_equal(a, b)


def test_blocked_entries_get_exactly_zero_gradient_and_no_nan() -> None:
    lead, T, S = (2, 3), 6, 8
    q, k, v, d_context = qkv(lead, T, S, seed=11)
    mask = masks_for("random", lead, T, S)
    bias = random((*lead, T, S), 12)
    dq, dk, dv, d_bias = attention_backward(q, k, v, d_context, mask, score_bias=bias)
    for grad in (dq, dk, dv, d_bias):
        assert not np.isnan(grad).any()
    # exact by construction: the weights are 0 there, and so is everything they scale
    assert np.all(d_bias[~np.broadcast_to(mask, d_bias.shape)] == 0)
    assert np.all(dq[0, 0, 1] == 0)  # the row with nothing to attend to
    assert np.all(dk[..., 2, :] == 0) and np.all(dv[..., 2, :] == 0)  # the unseen key
    context, lse = flash_attention(q, k, v, mask, tile_size=3)
    fdq, fdk, fdv = flash_attention_backward(q, k, v, context, lse, d_context, mask, tile_size=3)
    for grad in (fdq, fdk, fdv):
        assert not np.isnan(grad).any()
    assert np.all(fdq[0, 0, 1] == 0) and np.all(fdk[..., 2, :] == 0) and np.all(fdv[..., 2, :] == 0)


@pytest.mark.parametrize("kind", ["none", "random"])
def test_backward_steps_are_the_backward_and_its_intermediates(kind) -> None:
    lead, T, S = (2, 3), 5, 7
    q, k, v, d_context = qkv(lead, T, S, seed=21)
    mask = masks_for(kind, lead, T, S)
    steps = attention_backward_steps(q, k, v, d_context, mask)
    # The same code as attention_backward's and the forward's: the same bits.
    for got, want in zip((steps.dq, steps.dk, steps.dv),
                         attention_backward(q, k, v, d_context, mask), strict=True):  # fmt: skip
        assert np.array_equal(got, want)
    context, weights = scaled_dot_product_attention(q, k, v, mask)
    assert np.array_equal(steps.context, context) and np.array_equal(steps.weights, weights)
    assert np.array_equal(steps.d_context, d_context)
    # The intermediates, each written out here from its formula.
    scaled = q @ np.swapaxes(k, -1, -2) / math.sqrt(4)  # (..., T, S)
    allowed = np.ones(scaled.shape, bool) if mask is None else np.broadcast_to(mask, scaled.shape)
    assert np.all(np.isneginf(steps.masked[~allowed]))  # exact: blocked
    np.testing.assert_allclose(steps.masked[allowed], scaled[allowed], rtol=0, atol=1e-12)
    d_weights = d_context @ np.swapaxes(v, -1, -2)  # (..., T, Dv) @ (..., Dv, S)
    assert_close(steps.d_weights, d_weights, "dP")
    row_dot = np.einsum("...ts,...ts->...t", d_weights, weights)
    assert_close(steps.row_dot, row_dot, "rowsum(dP * P)")
    assert_close(steps.d_masked, weights * (d_weights - row_dot[..., None]), "dZ")
    assert np.all(steps.d_masked[~allowed] == 0)  # exact: P = 0 there
    assert_close(steps.d_masked.sum(-1), np.zeros((*lead, T)), "rows of dZ sum to 0")
    bias = random((T, S), 22)
    with_bias = attention_backward_steps(q, k, v, d_context, mask, score_bias=bias)
    _, _, _, d_bias = attention_backward(q, k, v, d_context, mask, score_bias=bias)
    assert np.array_equal(with_bias.d_masked.sum(axis=(0, 1)), d_bias)
    with pytest.raises(ValueError, match=r"d_context must have the shape of .*\(2, 3, 5, 5\)"):
        attention_backward_steps(q, k, v, d_context[..., :4], mask)


def test_no_keys_and_no_queries() -> None:
    q, k, v, d_context = qkv((2,), 4, 0)  # every row has nothing to attend to
    context, lse = flash_attention(q, k, v)
    for grads in (attention_backward(q, k, v, d_context),
                  flash_attention_backward(q, k, v, context, lse, d_context)):  # fmt: skip
        assert [g.shape for g in grads] == [(2, 4, 4), (2, 0, 4), (2, 0, 5)]
        assert np.all(grads[0] == 0)  # exact: no key, no gradient
    q, k, v, d_context = qkv((2,), 0, 3)
    context, lse = flash_attention(q, k, v, causal=True)
    grads = flash_attention_backward(q, k, v, context, lse, d_context, causal=True)
    assert np.all(grads[1] == 0) and np.all(grads[2] == 0)  # exact: no query, no gradient


@pytest.mark.parametrize("bias_shape", [(2, 3, 6, 8), (3, 6, 8), (1, 3, 1, 8), (6, 8)])
def test_score_bias_gradient_equals_autograd(bias_shape) -> None:
    lead, T, S = (2, 3), 6, 8
    q, k, v, d_context = qkv(lead, T, S, seed=21)
    mask = causal_mask(T, num_keys=S)
    bias = random(bias_shape, 22)
    *grads, d_bias = attention_backward(q, k, v, d_context, mask, score_bias=bias)
    inputs = leaves(q, k, v, bias)
    expected = autograd(lambda q, k, v, b: torch_attention(q, k, v, mask, b), inputs, d_context)
    for name, got, want in zip(("dq", "dk", "dv", "d_score_bias"), (*grads, d_bias), expected,
                               strict=True):  # fmt: skip
        assert_close(got, want, name)


# ----------------------------------------------------------------------------- heads


def test_split_and_merge_backward_are_each_others_reshape() -> None:
    x = random((2, 5, 12), 30)  # (B, T, D)
    heads = random((2, 3, 5, 4), 31)  # (B, H, T, Dh)
    (tx,) = leaves(x)
    (expected,) = torch.autograd.grad(
        tx.reshape(2, 5, 3, 4).transpose(1, 2), tx, torch.from_numpy(heads)
    )
    assert np.array_equal(split_heads_backward(heads), expected.numpy())  # exact: a copy
    assert np.array_equal(split_heads_backward(heads), merge_heads(heads))
    (th,) = leaves(heads)
    (expected,) = torch.autograd.grad(th.transpose(1, 2).reshape(2, 5, 12), th,
                                      torch.from_numpy(x))  # fmt: skip
    assert np.array_equal(merge_heads_backward(x, 3), expected.numpy())
    assert np.array_equal(merge_heads_backward(x, 3), split_heads(x, 3))


# ----------------------------------------------------------------------------- layer

WEIGHTS = ("W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o")


def torch_layer(query, key, value, weights, num_heads, mask, score_bias=None):
    """Multi-head attention in plain torch ops, our ``x @ W + b`` convention; grouped
    query heads read their key/value head through ``repeat_interleave``."""
    w = dict(zip(WEIGHTS, weights, strict=True))

    def linear(x, name):
        y = x @ w[f"W_{name}"]
        return y if w[f"b_{name}"] is None else y + w[f"b_{name}"]

    def heads(x, n):  # (B, L, n Dh) -> (B, n, L, Dh)
        return x.reshape(x.shape[0], x.shape[1], n, -1).transpose(1, 2)

    head_dim = w["W_q"].shape[1] // num_heads
    num_kv_heads = w["W_k"].shape[1] // head_dim
    q = heads(linear(query, "q"), num_heads)
    k = heads(linear(key, "k"), num_kv_heads).repeat_interleave(num_heads // num_kv_heads, 1)
    v = heads(linear(value, "v"), num_kv_heads).repeat_interleave(num_heads // num_kv_heads, 1)
    context = torch_attention(q, k, v, mask, score_bias)  # (B, H, T, Dh)
    merged = context.transpose(1, 2).reshape(query.shape[0], query.shape[1], -1)
    return linear(merged, "o")


LAYERS = {  # name: (T, S, num_heads, num_kv_heads, bias, kind)
    "self": (7, 7, 4, 4, True, "causal"),
    "self-no-bias": (6, 6, 2, 2, False, "window"),
    "cross": (5, 9, 4, 4, True, "padding"),
    "gqa": (7, 7, 4, 2, True, "causal"),
    "mqa-cross": (5, 8, 4, 1, False, "random"),
    "one-head": (4, 6, 1, 1, True, "none"),
}


@pytest.mark.parametrize("case", sorted(LAYERS))
def test_layer_backward_equals_autograd(case) -> None:
    T, S, num_heads, num_kv_heads, bias, kind = LAYERS[case]
    d_model = 12
    params = AttentionParams.init(d_model, seed=1, bias=bias,
                                  kv_dim=d_model // num_heads * num_kv_heads)  # fmt: skip
    if bias:  # init leaves biases at zero: their gradient would not meet them
        for i, name in enumerate(("b_q", "b_k", "b_v", "b_o")):
            setattr(params, name, random(getattr(params, name).shape, 40 + i))
    query = random((2, T, d_model), 50)
    key = query if S == T else random((2, S, d_model), 51)
    value = key if case != "mqa-cross" else random((2, S, d_model), 52)
    mask = masks_for(kind, (2, num_heads), T, S)
    d_output = random((2, T, d_model), 53)
    grads = multi_head_attention_backward(query, key, value, params, num_heads, d_output, mask)

    weights = [getattr(params, n) for n in WEIGHTS]
    inputs = leaves(query, key, value, *(w for w in weights if w is not None))
    tensors = iter(inputs[3:])
    torch_weights = [None if w is None else next(tensors) for w in weights]
    expected = autograd(
        lambda *x: torch_layer(*x[:3], torch_weights, num_heads, mask), inputs, d_output
    )
    present = [n for n, w in zip(WEIGHTS, weights, strict=True) if w is not None]
    for name, want in zip(("query", "key", "value", *present), expected, strict=True):
        assert_close(getattr(grads, name), want, name)
    assert all(getattr(grads, n) is None for n in WEIGHTS if n not in present)
    # The forward's saved steps give the same computation, hence the same bits.
    steps = multi_head_attention_steps(query, key, value, params, num_heads, mask)
    again = multi_head_attention_backward(query, key, value, params, num_heads, d_output, mask,
                                          steps=steps)  # fmt: skip
    for name in ("query", "key", "value", *present):
        assert np.array_equal(getattr(again, name), getattr(grads, name)), name
    assert isinstance(grads.params, AttentionParams) and grads.params.kv_dim == params.kv_dim


def test_layer_backward_equals_nn_multihead_attention() -> None:
    d_model, num_heads, T, S = 12, 3, 5, 7
    params = AttentionParams.init(d_model, seed=2)
    for i, name in enumerate(("b_q", "b_k", "b_v", "b_o")):
        setattr(params, name, random((d_model,), 60 + i))
    query, memory = random((2, T, d_model), 64), random((2, S, d_model), 65)
    d_output = random((2, T, d_model), 66)
    lengths = np.array([7, 4])
    mask = padding_mask(lengths)  # (B, 1, 1, S)
    grads = multi_head_attention_backward(query, memory, memory, params, num_heads, d_output,
                                          mask)  # fmt: skip
    module = params_to_torch(params, num_heads)
    tq, tm = leaves(query, memory)
    out, _ = module(tq, tm, tm, key_padding_mask=torch.from_numpy(~mask[:, 0, 0]),
                    need_weights=False)  # fmt: skip
    out.backward(torch.from_numpy(d_output))
    assert_close(grads.query, tq.grad, "query")
    assert_close(grads.key + grads.value, tm.grad, "memory")  # key = value = memory
    w_in, b_in = module.in_proj_weight.grad, module.in_proj_bias.grad  # (3D, D), (3D,)
    for i, role in enumerate("qkv"):
        rows = slice(i * d_model, (i + 1) * d_model)
        assert_close(getattr(grads, f"W_{role}"), w_in[rows].T, f"W_{role}")  # (out, in)
        assert_close(getattr(grads, f"b_{role}"), b_in[rows], f"b_{role}")
    assert_close(grads.W_o, module.out_proj.weight.grad.T, "W_o")
    assert_close(grads.b_o, module.out_proj.bias.grad, "b_o")


def test_layer_score_bias_and_grouped_heads_match_f_sdpa() -> None:
    d_model, num_heads, num_kv_heads, T = 12, 4, 2, 6
    params = AttentionParams.init(d_model, seed=3, bias=False, kv_dim=6)
    x = random((2, T, d_model), 70)
    d_output = random((2, T, d_model), 71)
    bias = mha.alibi_bias(num_heads, T)  # (H, T, S)
    grads = multi_head_attention_backward(x, x, x, params, num_heads, d_output,
                                          causal_mask(T), score_bias=bias)  # fmt: skip
    tx, tb = leaves(x, bias)
    w = {n: torch.from_numpy(getattr(params, n)) for n in ("W_q", "W_k", "W_v", "W_o")}

    def layer(x, b):
        q = (x @ w["W_q"]).reshape(2, T, num_heads, 3).transpose(1, 2)
        k = (x @ w["W_k"]).reshape(2, T, num_kv_heads, 3).transpose(1, 2)
        v = (x @ w["W_v"]).reshape(2, T, num_kv_heads, 3).transpose(1, 2)
        additive = b.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=additive, enable_gqa=True)
        return context.transpose(1, 2).reshape(2, T, d_model) @ w["W_o"]

    dx, d_bias = autograd(layer, [tx, tb], d_output)
    assert_close(grads.query + grads.key + grads.value, dx, "x")  # self-attention
    assert_close(grads.score_bias, d_bias, "score_bias")
    assert np.all(grads.score_bias[~np.broadcast_to(causal_mask(T), bias.shape)] == 0)  # exact


# ------------------------------------------------------------------------------ tiled

TILED = [((2, 3), 10, 10, False), ((2, 3), 7, 13, True), ((2, 3), 7, 13, False),
         ((), 13, 13, True), ((3,), 1, 9, True), ((2, 2), 9, 5, False)]  # fmt: skip


@pytest.mark.parametrize("tile_size", [1, 3, 4, 64])
@pytest.mark.parametrize(("lead", "T", "S", "causal"), TILED)
def test_flash_backward_equals_the_plain_backward(tile_size, lead, T, S, causal) -> None:
    q, k, v, d_context = qkv(lead, T, S, seed=T + S)
    mask = np.random.default_rng(T).random((*lead, T, S)) < 0.7
    mask[(0,) * len(lead) + (T // 2,)] = False  # a row with nothing to attend to
    context, lse = flash_attention(q, k, v, mask, causal=causal, tile_size=5)
    got = flash_attention_backward(q, k, v, context, lse, d_context, mask, tile_size=tile_size,
                                   causal=causal)  # fmt: skip
    full = mask if not causal else combine_masks(mask, causal_mask(T, num_keys=S))
    expected = autograd(lambda *x: torch_attention(*x, full), leaves(q, k, v), d_context)
    for name, a, b in zip("qkv", got, expected, strict=True):
        assert_close(a, b, f"d{name}")
        assert not np.isnan(a).any()
    assert np.all(got[0][(0,) * len(lead) + (T // 2,)] == 0)  # exact: p = 0 in that row


@pytest.mark.parametrize(("lead", "T", "S", "causal", "tile_size"),
                         [((2, 3), 7, 13, True, 3), ((), 10, 10, True, 4),
                          ((2,), 9, 5, False, 2), ((), 5, 5, False, 64)])  # fmt: skip
def test_flash_backward_trace_holds_what_each_tile_added(lead, T, S, causal, tile_size) -> None:
    q, k, v, d_context = qkv(lead, T, S, seed=40 + T)
    mask = np.random.default_rng(S).random((*lead, T, S)) < 0.8
    context, lse = flash_attention(q, k, v, mask, causal=causal, tile_size=4)
    trace = BackwardTileTrace()
    got = flash_attention_backward(q, k, v, context, lse, d_context, mask, causal=causal,
                                   tile_size=tile_size, trace=trace)  # fmt: skip
    # Order: a column of key tiles at a time, its query tiles top to bottom.
    tiles = [((q0, min(q0 + tile_size, T)), (k0, min(k0 + tile_size, S)))
             for k0 in range(0, S, tile_size) for q0 in range(0, T, tile_size)]  # fmt: skip
    assert [(st.queries, st.keys) for st in trace.steps] == tiles
    assert (trace.tile_size, trace.num_queries, trace.num_keys) == (tile_size, T, S)
    assert (trace.lead, trace.head_dim, trace.value_dim) == (lead, 4, 5)
    full = mask if not causal else combine_masks(mask, causal_mask(T, num_keys=S))
    plain = attention_backward_steps(q, k, v, d_context, full)
    scale = 1 / math.sqrt(4)
    for st in trace.steps:
        (q0, q1), (k0, k1) = st.queries, st.keys
        assert st.skipped == (causal and k0 > q1 - 1 + S - T)
        # Each tile's additions, from the plain backward's whole P and dZ cut to the tile.
        p, d_z = plain.weights[..., q0:q1, k0:k1], plain.d_masked[..., q0:q1, k0:k1]
        assert_close(st.dq, scale * d_z @ k[..., k0:k1, :], f"dq of {st.queries} x {st.keys}")
        assert_close(st.dk, scale * np.swapaxes(d_z, -1, -2) @ q[..., q0:q1, :], "dk")
        assert_close(st.dv, np.swapaxes(p, -1, -2) @ d_context[..., q0:q1, :], "dv")
        if st.skipped:  # exact: it added nothing
            assert not st.dq.any() and not st.dk.any() and not st.dv.any()
    assert trace.num_computed + trace.num_skipped == len(tiles)
    assert trace.num_skipped == sum(causal and k0 > q1 - 1 + S - T
                                    for (_, q1), (k0, _) in tiles)  # fmt: skip
    # Summed, the additions are the gradients: the same additions in the same order as
    # flash_attention_backward's (exact), the plain backward's up to rounding.
    for name, summed, returned, want in zip(
        "qkv", trace.accumulated(), got, (plain.dq, plain.dk, plain.dv), strict=True
    ):
        assert np.array_equal(summed, returned), name
        assert_close(summed, want, f"d{name}")
    assert all(not g.any() for g in trace.accumulated(0))  # exact: nothing added yet
    # A second call starts the trace afresh.
    flash_attention_backward(q, k, v, context, lse, d_context, mask, tile_size=S, trace=trace)
    assert len(trace.steps) == math.ceil(T / S) and trace.tile_size == S


def test_flash_backward_trace_errors() -> None:
    q, k, v, d_context = qkv((), 4, 4)
    context, lse = flash_attention(q, k, v)
    with pytest.raises(ValueError, match="trace must be a BackwardTileTrace, got TileTrace"):
        flash_attention_backward(q, k, v, context, lse, d_context, trace=TileTrace())
    trace = BackwardTileTrace()
    flash_attention_backward(q, k, v, context, lse, d_context, tile_size=2, trace=trace)
    for bad in (-1, 5, 1.0, True):
        with pytest.raises(ValueError, match=r"num_steps must be an int in \[0, 4\]"):
            trace.accumulated(bad)


def torch_flash(q, k, v, d_context, additive=None, is_causal=False):
    """PyTorch's CPU flash attention forward and backward (dropout 0, default scale)."""
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        tq, tk, tv, 0.0, is_causal, attn_mask=additive
    )
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        torch.from_numpy(d_context), tq, tk, tv, out, lse, 0.0, is_causal, attn_mask=additive
    )


@pytest.mark.parametrize("tile_size", [3, 64])
@pytest.mark.parametrize(("T", "S", "causal"), [(10, 10, True), (10, 10, False), (6, 11, True)])
def test_flash_backward_equals_torch_cpu_flash_backward(tile_size, T, S, causal) -> None:
    q, k, v, d_context = qkv((2, 3), T, S, Dh=8, Dv=8, seed=80 + S)
    mask = np.random.default_rng(S).random((2, 3, T, S)) < 0.8
    mask[1, 2, 3] = False  # nothing to attend to: torch's kernel gives zeros too
    context, lse = flash_attention(q, k, v, mask, causal=causal, tile_size=tile_size)
    got = flash_attention_backward(q, k, v, context, lse, d_context, mask, causal=causal,
                                   tile_size=tile_size)  # fmt: skip
    # The kernel takes an additive float mask only. Its is_causal aligns the diagonal
    # top left, ours bottom right: the same for T = S; for T < S the mask carries it.
    full = mask if not causal or T == S else combine_masks(mask, causal_mask(T, num_keys=S))
    additive = torch.zeros(full.shape, dtype=torch.float64).masked_fill(
        ~torch.from_numpy(full), -math.inf
    )
    expected = torch_flash(q, k, v, d_context, additive, is_causal=causal and T == S)
    for name, a, b in zip("qkv", got, expected, strict=True):
        assert_close(a, b, f"d{name}")
    if causal and T == S:  # the flag alone, no mask
        context, lse = flash_attention(q, k, v, causal=True, tile_size=tile_size)
        got = flash_attention_backward(q, k, v, context, lse, d_context, causal=True,
                                       tile_size=tile_size)  # fmt: skip
        for a, b in zip(got, torch_flash(q, k, v, d_context, is_causal=True), strict=True):
            assert_close(a, b)


def test_flash_backward_needs_no_more_than_the_lse_whatever_the_tiles() -> None:
    # Scores around +-100: exp(score) alone overflows nothing only if the saved lse is
    # subtracted first; the forward's tiles (4) differ from the backward's (3).
    q, k, v, d_context = qkv((2,), 9, 9, seed=90)
    q *= 100
    context, lse = flash_attention(q, k, v, tile_size=4, causal=True)
    got = flash_attention_backward(q, k, v, context, lse, d_context, tile_size=3, causal=True)
    expected = attention_backward(q, k, v, d_context, causal_mask(9))
    for a, b in zip(got, expected, strict=True):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-9 * max(1.0, np.abs(b).max()))


def test_peak_memory_of_the_tiled_backward_grows_linearly() -> None:
    flash, plain = [], []
    for T in (256, 1024):  # 4x
        q, k, v, d_context = qkv((), T, T, Dh=16, Dv=16, seed=T)
        context, lse = flash_attention(q, k, v, tile_size=64)
        flash.append(peak_memory_bytes(flash_attention_backward, q, k, v, context, lse,
                                       d_context, tile_size=64))  # fmt: skip
        plain.append(peak_memory_bytes(attention_backward, q, k, v, d_context))
    # The plain backward holds (T, S) weights (8 MB at T = 1024) and their gradients.
    assert plain[1] >= attention_backward_bytes(1024, 1024, bytes_per_value=8)
    assert plain[1] / plain[0] > 12  # quadratic: 16x
    assert flash[1] / flash[0] < 4.5  # linear: the gradients (T, Dh), the tiles fixed
    assert flash[1] < plain[1] / 20


# ----------------------------------------------------------------------------- errors


def test_errors_name_the_argument_and_the_shapes() -> None:
    q, k, v, d_context = qkv((2, 3), 4, 6)
    with pytest.raises(ValueError, match=r"d_context must have the shape of .*\(2, 3, 4, 5\)"):
        attention_backward(q, k, v, d_context[..., :4])
    with pytest.raises(ValueError, match=r"weights must have the shape of .*\(2, 3, 4, 6\)"):
        attention_backward(q, k, v, d_context, weights=np.zeros((2, 3, 4, 5)))
    with pytest.raises(ValueError, match="mask must be a boolean array"):
        attention_backward(q, k, v, d_context, np.ones((4, 6)))
    with pytest.raises(ValueError, match=r"k and v must have the same length S"):
        attention_backward(q, k, v[..., :5, :], d_context)
    with pytest.raises(ValueError, match=r"d_weights must have the shape of weights \(3, 4\)"):
        softmax_backward(np.zeros((3, 4)), np.zeros((4, 3)))
    with pytest.raises(ValueError, match="axis=2 is out of range"):
        softmax_backward(np.zeros((3, 4)), np.zeros((3, 4)), axis=2)
    context, lse = flash_attention(q, k, v)
    with pytest.raises(ValueError, match=r"logsumexp must have the shape of .*\(2, 3, 4\)"):
        flash_attention_backward(q, k, v, context, lse[..., :3], d_context)
    with pytest.raises(ValueError, match=r"context must have the shape of .*\(2, 3, 4, 5\)"):
        flash_attention_backward(q, k, v, context[:1], lse, d_context)
    with pytest.raises(ValueError, match=r"d_context must have the shape of context"):
        flash_attention_backward(q, k, v, context, lse, d_context.T)
    with pytest.raises(ValueError, match="tile_size must be a positive integer"):
        flash_attention_backward(q, k, v, context, lse, d_context, tile_size=0)
    with pytest.raises(ValueError, match="causal must be True or False"):
        flash_attention_backward(q, k, v, context, lse, d_context, causal=1)
    with pytest.raises(ValueError, match="causal=True needs at least as many keys"):
        q2, k2, v2, d2 = qkv((2, 3), 6, 4)
        flash_attention_backward(q2, k2, v2, *flash_attention(q2, k2, v2), d2, causal=True)


def test_layer_errors() -> None:
    params = AttentionParams.init(8)
    x = random((2, 5, 8), 0)
    with pytest.raises(ValueError, match=r"d_output must have the shape of the output .*8\)"):
        multi_head_attention_backward(x, x, x, params, 2, np.zeros((2, 4, 8)))
    with pytest.raises(ValueError, match="steps must be mha.AttentionSteps, got dict"):
        multi_head_attention_backward(x, x, x, params, 2, x, steps={})
    cache = mha.KVCache()
    multi_head_attention_steps(x, x, x, params, 2, causal_mask(5), cache=cache)
    cached = multi_head_attention_steps(x, x, x, params, 2, causal_mask(5, num_keys=10),
                                        cache=cache)  # fmt: skip
    with pytest.raises(ValueError, match="a forward with a cache"):
        multi_head_attention_backward(x, x, x, params, 2, x, steps=cached)
    with pytest.raises(ValueError, match=r"query has 7 features"):
        multi_head_attention_backward(x[..., :7], x, x, params, 2, x)
    with pytest.raises(ValueError, match="params must be an AttentionParams"):
        multi_head_attention_backward(x, x, x, {}, 2, x, steps=cached)


# ------------------------------------------------------------------------------ cost


def counted_macs(run) -> int:
    """Multiply-adds of the matrix products ``run()`` makes torch execute."""
    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops() // 2  # 2 FLOPs a multiply-add


@pytest.mark.parametrize(("B", "H", "T", "S", "Dh", "Dv"), [(1, 1, 3, 5, 4, 2), (2, 3, 7, 7, 8, 8)])
def test_macs_match_the_flop_counter(B, H, T, S, Dh, Dv) -> None:
    q, k, v, d_context = qkv((B, H), T, S, Dh, Dv)
    inputs = leaves(q, k, v)
    kwargs = {"value_dim": Dv, "num_heads": H, "batch_size": B}
    forward = counted_macs(lambda: torch_attention(*inputs, causal_mask(T, num_keys=S)))
    assert forward == attention_macs(T, S, Dh, **kwargs) == B * H * T * S * (Dh + Dv)
    out = torch_attention(*inputs, causal_mask(T, num_keys=S))
    backward = counted_macs(lambda: torch.autograd.grad(out, inputs, torch.from_numpy(d_context)))
    assert backward == attention_backward_macs(T, S, Dh, **kwargs)
    # PyTorch's count for a fused backward recomputes the scores, as the tiles do.
    fused = sdpa_backward_flop_count((B, H, T, Dv), (B, H, T, Dh), (B, H, S, Dh), (B, H, S, Dv))
    assert fused // 2 == attention_backward_macs(T, S, Dh, tile_size=4, **kwargs)


def test_backward_costs_twice_the_forward_and_the_tiles_a_half_more() -> None:
    plain = attention_backward_macs(100, 100, 64)
    assert plain == 2 * attention_macs(100, 100, 64) == 4 * 100 * 100 * 64
    tiled = attention_backward_macs(100, 100, 64, tile_size=16)
    assert 2 * tiled == 5 * attention_macs(100, 100, 64)
    # by hand, Dv != Dh: dV and dP are (T, S, Dv) each, dQ, dK and the recomputation Dh each
    assert attention_backward_macs(3, 5, 4, value_dim=2) == 3 * 5 * (2 + 2 + 4 + 4)
    assert attention_backward_macs(3, 5, 4, value_dim=2, tile_size=2) == 3 * 5 * (2 + 2 + 4 + 4 + 4)


@pytest.mark.parametrize(("T", "S", "tile_size"),
                         [(16, 16, 4), (7, 13, 3), (10, 10, 64), (5, 9, 1)])  # fmt: skip
def test_causal_tiles_count_only_the_tiles_computed(T, S, tile_size) -> None:
    trace = TileTrace()
    flash_attention(*qkv((), T, S)[:3], causal=True, tile_size=tile_size, trace=trace)
    pairs = sum((s.queries[1] - s.queries[0]) * (s.keys[1] - s.keys[0])
                for s in trace.steps if not s.skipped)  # fmt: skip
    assert attention_macs(T, S, 4, tile_size=tile_size, causal=True) == pairs * 8
    assert attention_backward_macs(T, S, 4, tile_size=tile_size, causal=True) == pairs * 20
    assert attention_macs(T, S, 4, causal=True) == T * S * 8  # no tiles: the whole square


def test_backward_bytes() -> None:
    # weights: T * S per head; tiles: lse and D, T each
    assert attention_backward_bytes(4096, 4096, num_heads=32) == 32 * 4096 * 4096 * 2
    assert attention_backward_bytes(4096, 4096, num_heads=32, tiled=True) == 32 * 2 * 4096 * 2
    assert attention_backward_bytes(3, 5, batch_size=2, bytes_per_value=8) == 2 * 15 * 8
    assert attention_backward_bytes(0, 5, tiled=True) == 0


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: attention_macs(-1, 4, 4), "num_queries"),
        (lambda: attention_macs(4, 4, 0), "head_dim"),
        (lambda: attention_backward_macs(4, 4, 4, value_dim=1.5), "value_dim"),
        (lambda: attention_backward_macs(4, 4, 4, tile_size=0), "tile_size"),
        (lambda: attention_backward_macs(5, 4, 4, tile_size=2, causal=True), "causal=True"),
        (lambda: attention_macs(4, 4, 4, causal=1), "causal"),
        (lambda: attention_backward_bytes(4, 4, num_heads=0), "num_heads"),
        (lambda: attention_backward_bytes(4, 4, tiled="yes"), "tiled"),
    ],
)
def test_cost_refuses_bad_arguments(call, name) -> None:
    with pytest.raises(ValueError, match=name):
        call()


def test_gradients_name_the_forward_parameters() -> None:
    fields = AttentionGradients.__dataclass_fields__
    assert set(WEIGHTS) | {"query", "key", "value", "score_bias"} == set(fields)

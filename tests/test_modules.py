"""MultiHeadAttention (PyTorch) == NumPy spec == nn.MultiheadAttention == SDPA.

Every equivalence test runs four independent computations on the same weights and
inputs: the NumPy function ``mha.attention.multi_head_attention``, our module on both
paths (explicit softmax and ``F.scaled_dot_product_attention``), ``nn.MultiheadAttention``
with its own (opposite) mask convention, and a hand-written projections + SDPA pipeline.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mha import convert
from mha.attention import multi_head_attention
from mha.masks import (
    causal_mask,
    combine_masks,
    padding_mask,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)
from mha.modules import MultiHeadAttention
from mha.params import AttentionParams

# Tiny tensors: a second thread made each test ~20x slower when the other core was busy.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
NP_DTYPE = {torch.float64: np.float64, torch.float32: np.float32}

# (B, T, S): self-attention shapes (T == S) and cross-attention shapes (S != T).
SHAPES = [(1, 1, 1), (2, 5, 5), (3, 4, 7), (2, 6, 3)]
# (D, H): one head, several heads, odd head_dim.
WIDTHS = [(8, 1), (8, 2), (12, 3), (16, 4)]
MASK_KINDS = ["none", "causal", "padding", "both"]


def random_params(d_model: int, seed: int, dtype: type, bias: bool = True) -> AttentionParams:
    """Seeded Xavier weights plus random (not zero) biases, so bias bugs show up."""
    params = AttentionParams.init(d_model, seed=seed, dtype=dtype, bias=bias)
    if bias:
        rng = np.random.default_rng(seed + 1000)
        for name in ("b_q", "b_k", "b_v", "b_o"):
            setattr(params, name, rng.normal(0, 0.5, size=d_model).astype(dtype))
    return params


def make_mask(kind: str, B: int, T: int, S: int, rng: np.random.Generator) -> dict:
    """The same mask in every convention the four implementations need.

    Returns a dict with ``ours`` (bool, True = may attend, or None), the
    ``nn.MultiheadAttention`` keyword arguments (True = blocked) and ``sdpa`` (bool
    broadcastable to (B, H, T, S) — SDPA shares our convention).
    """
    causal = causal_mask(T) if T == S else np.tril(np.ones((T, S), dtype=bool))  # (T, S)
    lengths = rng.integers(1, S + 1, size=B)  # >= 1 real key, so no empty rows here
    lengths[0] = max(1, S - 1) if S > 1 else 1  # make sure some padding exists
    padding = padding_mask(lengths=lengths, max_len=S)  # (B, 1, 1, S)
    if kind == "none":
        return {"ours": None, "torch": {}}
    if kind == "causal":
        return {
            "ours": causal,
            "torch": {"attn_mask": torch.from_numpy(to_torch_attn_mask(causal))},
        }
    if kind == "padding":
        kpm = torch.from_numpy(to_torch_key_padding_mask(padding))
        return {"ours": padding, "torch": {"key_padding_mask": kpm}}
    both = combine_masks(causal, padding)  # (B, 1, T, S)
    # nn.MultiheadAttention combines the two masks itself: give it both separately.
    return {
        "ours": both,
        "torch": {
            "attn_mask": torch.from_numpy(to_torch_attn_mask(causal)),
            "key_padding_mask": torch.from_numpy(to_torch_key_padding_mask(padding)),
        },
    }


def sdpa_reference(
    module: nn.MultiheadAttention, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Projections + F.scaled_dot_product_attention, written independently of ours."""
    B, T, D = query.shape
    S = key.shape[1]
    H = module.num_heads
    w_q, w_k, w_v = module.in_proj_weight.chunk(3)  # (3D, D) -> 3 x (D, D)
    b_q, b_k, b_v = module.in_proj_bias.chunk(3)
    q = F.linear(query, w_q, b_q).view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, Dh)
    k = F.linear(key, w_k, b_k).view(B, S, H, D // H).transpose(1, 2)  # (B, H, S, Dh)
    v = F.linear(key, w_v, b_v).view(B, S, H, D // H).transpose(1, 2)  # (B, H, S, Dh)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, Dh)
    merged = context.transpose(1, 2).reshape(B, T, D)  # (B, H, T, Dh) -> (B, T, D)
    return module.out_proj(merged)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("d_model,num_heads", WIDTHS)
@pytest.mark.parametrize("B,T,S", SHAPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_four_implementations_agree(
    seed: int, B: int, T: int, S: int, d_model: int, num_heads: int, mask_kind: str, dtype
) -> None:
    rng = np.random.default_rng(seed)
    np_dtype = NP_DTYPE[dtype]
    params = random_params(d_model, seed, np_dtype)
    query_np = rng.normal(size=(B, T, d_model)).astype(np_dtype)
    key_np = rng.normal(size=(B, S, d_model)).astype(np_dtype)  # key = value (cross-attention)
    masks = make_mask(mask_kind, B, T, S, rng)

    # 1. The NumPy specification.
    out_np, weights_np = multi_head_attention(
        query_np, key_np, key_np, params, num_heads, mask=masks["ours"]
    )

    # 2. Our module, both paths.
    ours = convert.params_to_module(params, num_heads).eval()
    query, key = torch.from_numpy(query_np), torch.from_numpy(key_np)
    mask = None if masks["ours"] is None else torch.from_numpy(masks["ours"])
    with torch.no_grad():
        out, weights = ours(query, key, key, mask=mask)
        out_fast, no_weights = ours(query, key, key, mask=mask, need_weights=False)

        # 3. nn.MultiheadAttention with the same weights and the converted masks.
        reference = convert.module_to_torch(ours).eval()
        out_torch, weights_torch = reference(
            query, key, key, average_attn_weights=False, **masks["torch"]
        )

        # 4. Projections + SDPA, written independently.
        out_sdpa = sdpa_reference(reference, query, key, mask)

    tol = TOL[dtype]
    assert out.dtype == dtype and out.shape == (B, T, d_model)
    assert weights.shape == (B, num_heads, T, S)
    assert no_weights is None
    np.testing.assert_allclose(out.numpy(), out_np, rtol=tol, atol=tol)
    np.testing.assert_allclose(weights.numpy(), weights_np, rtol=tol, atol=tol)
    torch.testing.assert_close(out_fast, out, rtol=tol, atol=tol)
    torch.testing.assert_close(out_torch, out, rtol=tol, atol=tol)
    torch.testing.assert_close(weights_torch, weights, rtol=tol, atol=tol)
    torch.testing.assert_close(out_sdpa, out, rtol=tol, atol=tol)
    if mask is not None:  # blocked weights are exactly zero, not merely small
        assert torch.all(weights.masked_select(~mask.expand_as(weights)) == 0)


# ------------------------------------------------------------ fully masked query rows


def empty_row_setup(dtype=torch.float64):
    torch.manual_seed(0)
    module = MultiHeadAttention(8, 2).to(dtype).eval()
    nn.init.normal_(module.W_o.bias)  # zero context must show up as output == b_o
    x = torch.randn(2, 4, 8, dtype=dtype)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[0, :, 2, :] = False  # query 2 of sequence 0 may attend to nothing
    return module, x, mask


@pytest.mark.parametrize("need_weights", [True, False])
def test_fully_masked_row_gives_zero_context_not_nan(need_weights: bool) -> None:
    module, x, mask = empty_row_setup()
    out, weights = module(x, x, x, mask=mask, need_weights=need_weights)
    assert torch.isfinite(out).all()
    # zero context -> the output row is W_o(0) = b_o
    torch.testing.assert_close(out[0, 2], module.W_o.bias, rtol=0, atol=1e-12)
    if need_weights:
        assert torch.all(weights[0, :, 2] == 0)
        torch.testing.assert_close(weights[0, :, 3].sum(-1), torch.ones(2, dtype=x.dtype))
    # Rows that can attend are untouched: same result as attending without the mask.
    out_unmasked, _ = module(x, x, x, need_weights=need_weights)
    torch.testing.assert_close(out[1], out_unmasked[1])
    # ... and the gradient is finite (a NaN forward would poison it).
    x = x.clone().requires_grad_()
    module(x, x, x, mask=mask, need_weights=need_weights)[0].sum().backward()
    assert torch.isfinite(x.grad).all()


def test_fast_path_zeroes_rows_even_if_sdpa_returns_nan(monkeypatch) -> None:
    """Some SDPA backends return NaN for a row with nothing to attend to (torch 2.13's
    CPU kernels return 0); ours must give 0 whatever the backend does."""
    original = F.scaled_dot_product_attention

    def nan_for_empty_rows(q, k, v, attn_mask=None, **kwargs):
        context = original(q, k, v, attn_mask=attn_mask, **kwargs)
        if attn_mask is not None:
            context = context.masked_fill(~attn_mask.any(-1, keepdim=True), float("nan"))
        return context

    monkeypatch.setattr(F, "scaled_dot_product_attention", nan_for_empty_rows)
    module, x, mask = empty_row_setup()
    out, _ = module(x, x, x, mask=mask, need_weights=False)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0, 2], module.W_o.bias, rtol=0, atol=1e-12)


def test_nn_multihead_attention_empty_rows_depend_on_the_path() -> None:
    """Documents the difference from PyTorch that mha deliberately does not copy, and
    pins torch 2.13's three answers for a row with nothing to attend to, which the
    docstrings and chapter 5 describe: a torch upgrade that changes them fails here.

    - ``need_weights=True``: NaN;
    - ``need_weights=False`` under ``torch.no_grad()`` in eval mode, self-attention:
      the fused fast path, NaN;
    - ``need_weights=False`` with autograd on: the path through
      ``F.scaled_dot_product_attention``, zeros (output ``b_o``).
    """
    module, x, mask = empty_row_setup()
    reference = convert.module_to_torch(module).eval()
    attn_mask = torch.from_numpy(to_torch_attn_mask(mask.numpy(), num_heads=2))
    ours, _ = module(x, x, x, mask=mask)
    b_o = module.W_o.bias.detach()

    out, weights = reference(x, x, x, attn_mask=attn_mask, average_attn_weights=False)
    assert torch.isnan(weights[0, :, 2]).all() and torch.isnan(out[0, 2]).all()
    torch.testing.assert_close(out[1], ours[1])

    with torch.no_grad():
        out_fast, _ = reference(x, x, x, attn_mask=attn_mask, need_weights=False)
    assert torch.isnan(out_fast[0, 2]).all()
    torch.testing.assert_close(out_fast[1], ours[1])

    out_sdpa, _ = reference(x, x, x, attn_mask=attn_mask, need_weights=False)
    assert out_sdpa.requires_grad  # autograd was on: not the fast path
    torch.testing.assert_close(out_sdpa[0, 2], b_o, rtol=0, atol=1e-12)
    torch.testing.assert_close(out_sdpa, ours, rtol=1e-10, atol=1e-10)

    # Off the fast path under no_grad, need_weights=False gives zeros as well: in
    # training mode, and for cross-attention (key is another tensor than query).
    with torch.no_grad():
        cross, _ = reference(x, x.clone(), x.clone(), attn_mask=attn_mask, need_weights=False)
        training, _ = reference.train()(x, x, x, attn_mask=attn_mask, need_weights=False)
    for out in (cross, training):
        torch.testing.assert_close(out[0, 2], b_o, rtol=0, atol=1e-12)


def test_inf_or_an_overflowing_sum_takes_the_explicit_path(monkeypatch) -> None:
    """The fast path's finiteness check sums q and k: an inf must send the call to the
    explicit path, and so must finite values whose sum overflows float32 (the result
    is then the explicit path's, the same numbers)."""
    module, x, _ = empty_row_setup()
    module = module.float()
    calls = []
    explicit = module._attend_explicit

    def spy(*args, **kwargs):
        calls.append(1)
        return explicit(*args, **kwargs)

    monkeypatch.setattr(module, "_attend_explicit", spy)
    x = x.float()
    module(x, x, x, need_weights=False)
    assert not calls  # finite: the fused kernel
    with torch.no_grad():
        module.W_q.bias.fill_(3e37)  # every q finite, their sum not (float32 max 3.4e38)
    out, _ = module(x, x, x, need_weights=False)
    assert calls and torch.isfinite(out).all()
    calls.clear()
    with torch.no_grad():
        module.W_q.bias.zero_()
    big = x.clone()
    big[0, 0, 0] = float("inf")
    module(big, x, x, need_weights=False)
    assert calls


def test_nan_in_a_query_propagates_on_both_paths() -> None:
    """A NaN query row must not come out as the finite b_o of an empty row."""
    module, x, mask = empty_row_setup()
    query = x.clone()
    query[1, 1, 0] = float("nan")
    partial = mask.clone()
    partial[1, :, 1, 3] = False  # the NaN row has a blocked key, and allowed ones
    for need_weights in (True, False):
        for m in (None, partial):
            out, weights = module(query, x, x, mask=m, need_weights=need_weights)
            assert torch.isnan(out[1, 1]).all()
            if need_weights:
                assert torch.isnan(weights[1, :, 1]).all()
            clean, _ = module(x, x, x, mask=m, need_weights=need_weights)
            rows = torch.ones(2, 4, dtype=torch.bool)
            rows[1, 1] = False
            torch.testing.assert_close(out[rows], clean[rows])


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("need_weights", [True, False])
def test_no_keys_gives_b_o_like_nn_multihead_attention(need_weights, with_mask) -> None:
    """S = 0: every query has nothing to attend to: zero weights (B, H, T, 0), output b_o."""
    module, x, _ = empty_row_setup()
    source = x[:, :0]  # (B, 0, D)
    mask = torch.ones(2, 1, 1, 0, dtype=torch.bool) if with_mask else None
    out, weights = module(x, source, source, mask=mask, need_weights=need_weights)
    torch.testing.assert_close(out, module.W_o.bias.detach().expand(2, 4, 8), rtol=0, atol=0)
    if need_weights:
        assert weights.shape == (2, 2, 4, 0)
    reference = convert.module_to_torch(module).eval()
    expected, expected_weights = reference(
        x, source, source, need_weights=need_weights, average_attn_weights=False
    )
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    if need_weights:
        assert expected_weights.shape == weights.shape
    # NumPy specification: the same
    params = convert.params_from_module(module)
    out_np, weights_np = multi_head_attention(
        x.numpy(), source.numpy(), source.numpy(), params, 2, None if mask is None else mask.numpy()
    )
    assert weights_np.shape == (2, 2, 4, 0)
    np.testing.assert_allclose(out_np, out.detach().numpy(), rtol=0, atol=1e-12)


# -------------------------------------------------------------------- conversions


def random_torch_mha(d_model: int, num_heads: int, bias: bool = True, **kwargs):
    torch.manual_seed(d_model * 100 + num_heads)
    module = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True, **kwargs)
    if bias:  # torch initialises biases to zero: make them count
        with torch.no_grad():
            module.in_proj_bias.normal_()
            module.out_proj.bias.normal_()
    return module.eval()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_from_torch_and_back(bias: bool, dtype) -> None:
    reference = random_torch_mha(12, 3, bias=bias).to(dtype)
    ours = convert.module_from_torch(reference)
    assert ours.W_q.weight.dtype == dtype and ours.bias is bias and not ours.training
    query = torch.randn(2, 5, 12, dtype=dtype)
    key = torch.randn(2, 3, 12, dtype=dtype)
    with torch.no_grad():
        expected, expected_weights = reference(query, key, key, average_attn_weights=False)
        got, got_weights = ours.eval()(query, key, key)
    torch.testing.assert_close(got, expected, rtol=TOL[dtype], atol=TOL[dtype])
    torch.testing.assert_close(got_weights, expected_weights, rtol=TOL[dtype], atol=TOL[dtype])
    back = convert.module_to_torch(ours)
    assert back.batch_first and back.num_heads == 3
    for name, tensor in reference.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


@pytest.mark.parametrize("bias", [True, False])
def test_params_round_trip_transposes(bias: bool) -> None:
    params = random_params(8, seed=3, dtype=np.float64, bias=bias)
    ours = convert.params_to_module(params, num_heads=2)
    assert ours.W_q.weight.dtype == torch.float64 and ours.bias is bias
    # nn.Linear stores (out, in): the NumPy (in, out) matrix transposed.
    np.testing.assert_array_equal(ours.W_k.weight.detach().numpy(), params.W_k.T)
    back = convert.params_from_module(ours)
    for name in ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o"):
        if bias or name.startswith("W"):
            np.testing.assert_array_equal(getattr(back, name), getattr(params, name))
        else:
            assert getattr(back, name) is None
    assert back.num_parameters == sum(p.numel() for p in ours.parameters())


def test_numpy_to_torch_agrees_with_ours() -> None:
    """AttentionParams.to_torch and MultiHeadAttention.to_torch build the same module."""
    params = random_params(8, seed=5, dtype=np.float64)
    theirs = convert.params_to_torch(params, num_heads=4)
    ours = convert.module_to_torch(convert.params_to_module(params, num_heads=4))
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], tensor), name


def test_from_torch_rejects_unsupported_modules() -> None:
    with pytest.raises(ValueError, match="nn.MultiheadAttention"):
        convert.module_from_torch(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="add_bias_kv"):
        convert.module_from_torch(nn.MultiheadAttention(4, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match=r"params.W_k must have shape \(4, 4\)"):
        convert.module_from_torch(nn.MultiheadAttention(4, 2, kdim=3, vdim=3))


def test_from_params_rejects_non_square_key_projection() -> None:
    with pytest.raises(ValueError, match="params must be an AttentionParams, got dict"):
        convert.params_to_module({"W_q": np.eye(4)}, num_heads=2)
    rng = np.random.default_rng(0)
    params = AttentionParams(
        W_q=rng.normal(size=(4, 4)), b_q=None, W_k=rng.normal(size=(3, 4)), b_k=None,
        W_v=rng.normal(size=(3, 4)), b_v=None, W_o=rng.normal(size=(4, 4)), b_o=None,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"params.W_k must have shape \(4, 4\).*got \(3, 4\)"):
        convert.params_to_module(params, num_heads=2)


# ---------------------------------------------------------------------- properties


@pytest.mark.parametrize("d_model", [8, 24])
def test_parameter_count_does_not_depend_on_num_heads(d_model: int) -> None:
    counts = {
        h: sum(p.numel() for p in MultiHeadAttention(d_model, h).parameters()) for h in (1, 2, 4, 8)
    }
    assert set(counts.values()) == {4 * d_model**2 + 4 * d_model}


def test_heads_are_single_head_attentions_on_sliced_weights() -> None:
    """The 'logical split': head h is single-head attention with columns h*Dh:(h+1)*Dh."""
    torch.manual_seed(1)
    D, H = 12, 3
    Dh = D // H
    module = MultiHeadAttention(D, H).double().eval()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    _, weights = module(x, x, x)
    for h in range(H):
        rows = slice(h * Dh, (h + 1) * Dh)
        q = F.linear(x, module.W_q.weight[rows], module.W_q.bias[rows])  # (B, T, Dh)
        k = F.linear(x, module.W_k.weight[rows], module.W_k.bias[rows])  # (B, T, Dh)
        expected = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(Dh), -1)  # (B, T, T)
        torch.testing.assert_close(weights[:, h], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("d_model,num_heads", [(64, 4), (96, 3)])
def test_init_is_xavier_uniform_with_zero_biases(d_model: int, num_heads: int) -> None:
    """Each (D, D) projection is drawn from xavier_uniform's U(-a, a), a = sqrt(6 / (D + D)),
    the bound AttentionParams.init uses; biases start at 0 (as nn.MultiheadAttention's).
    nn.Linear's own default would be U(-1/sqrt(D), 1/sqrt(D)) with random biases."""
    torch.manual_seed(0)
    module = MultiHeadAttention(d_model, num_heads)
    bound = math.sqrt(6 / (d_model + d_model))
    fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(module.W_q.weight)
    assert bound == nn.init.calculate_gain("linear") * math.sqrt(6 / (fan_in + fan_out))
    spec = AttentionParams.init(d_model, seed=0)
    assert np.abs(spec.W_q).max() <= bound

    def check(module: MultiHeadAttention) -> None:
        for linear in (module.W_q, module.W_k, module.W_v, module.W_o):
            w = linear.weight.detach()
            assert w.abs().max() <= bound
            assert w.abs().max() > 0.99 * bound  # D^2 draws fill the whole range
            # uniform(-a, a) has standard deviation a / sqrt(3) = 1 / sqrt(D)
            assert abs(w.std().item() * math.sqrt(d_model) - 1.0) < 0.05
            assert torch.equal(linear.bias.detach(), torch.zeros(d_model))
        assert not torch.equal(module.W_q.weight, module.W_k.weight)  # separate draws

    check(module)
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(1.0)
    module.reset_parameters()
    check(module)


def test_dropout_only_in_training_and_weights_stay_distributions() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(8, 2, dropout=0.5).double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    module.train()
    out_train, weights = module(x, x, x)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 6, dtype=torch.float64))
    module.eval()
    out_eval, _ = module(x, x, x)
    out_eval_fast, _ = module(x, x, x, need_weights=False)
    assert not torch.allclose(out_train, out_eval)
    torch.testing.assert_close(out_eval_fast, out_eval)


def test_paths_have_equal_gradients() -> None:
    torch.manual_seed(0)
    module = MultiHeadAttention(8, 2).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mask = torch.from_numpy(causal_mask(5))
    grads = []
    for need_weights in (True, False):
        module.zero_grad()
        module(x, x, x, mask=mask, need_weights=need_weights)[0].pow(2).sum().backward()
        grads.append([p.grad.clone() for p in module.parameters()])
    for slow, fast in zip(*grads, strict=True):
        torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------- bad input


@pytest.fixture
def module() -> MultiHeadAttention:
    return MultiHeadAttention(8, 2)


def test_d_model_not_divisible_by_heads() -> None:
    with pytest.raises(ValueError, match="d_model=10 is not divisible by num_heads=3"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="dropout"):
        MultiHeadAttention(8, 2, dropout=1.0)


@pytest.mark.parametrize(
    "args,match",
    [
        ((8, 2.0), r"num_heads must be a positive integer, got 2\.0"),
        ((8, True), r"num_heads must be a positive integer, got True"),
        ((8, 0), r"num_heads must be a positive integer, got 0"),
        ((8.0, 2), r"d_model must be a positive integer, got 8\.0"),
        ((True, 1), r"d_model must be a positive integer, got True"),
        ((-4, 2), r"d_model must be a positive integer, got -4"),
    ],
)
def test_integer_arguments_must_be_integers(args, match) -> None:
    """As the NumPy side (mha._checks): a float or a bool is not a number of heads."""
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(*args)
    assert MultiHeadAttention(np.int64(8), np.int64(2)).num_heads == 2


@pytest.mark.parametrize(
    "shapes,match",
    [
        (((5, 8), (2, 5, 8), (2, 5, 8)), r"query must have shape .* got \(5, 8\)"),
        (((2, 5, 8), (2, 5, 6), (2, 5, 8)), r"key must have shape .* got \(2, 5, 6\)"),
        (((2, 5, 8), (2, 5, 8), (3, 5, 8)), r"same batch size.*value \(3, 5, 8\)"),
        (((2, 5, 8), (2, 4, 8), (2, 3, 8)), r"key and value .* key \(2, 4, 8\), value \(2, 3, 8\)"),
    ],
)
def test_bad_input_shapes(module, shapes, match) -> None:
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        module(q, k, v)


@pytest.mark.parametrize(
    "mask,match",
    [
        (torch.ones(5, 4), r"bool tensor .* torch.float32"),
        (torch.ones(4, dtype=torch.bool), r"mask of shape \(4,\) does not broadcast"),
        (torch.ones(5, 5, dtype=torch.bool), r"\(5, 5\) does not broadcast to .* \(2, 2, 5, 4\)"),
        (torch.ones(3, 1, 1, 4, dtype=torch.bool), r"\(3, 1, 1, 4\) does not broadcast"),
        (torch.ones(1, 2, 2, 5, 4, dtype=torch.bool), r"\(1, 2, 2, 5, 4\) does not broadcast"),
    ],
)
@pytest.mark.parametrize("need_weights", [True, False])
def test_bad_masks(module, mask, match, need_weights) -> None:
    q, k = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=match):
        module(q, k, k, mask=mask, need_weights=need_weights)


def test_inputs_must_be_tensors(module) -> None:
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match="value must be a torch.Tensor, got ndarray"):
        module(x, x, x.numpy())
    assert "d_model=8, num_heads=2" in repr(module)


def test_good_mask_shapes_broadcast(module) -> None:
    q, k = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    for shape in [(5, 4), (1, 4), (2, 1, 1, 4), (2, 2, 5, 4), (1, 5, 4)]:
        out, weights = module(q, k, k, mask=torch.ones(shape, dtype=torch.bool))
        assert out.shape == (2, 5, 8) and weights.shape == (2, 2, 5, 4)


"""Multi-head latent attention: the NumPy specification (mha.mla) against the torch
module (mha.mla_torch), the absorbed form against the plain form, cached decoding
against the full forward, both RoPE layouts, with and without a query latent, and the
arguments each refuses. Hugging Face's DeepSeek-V3 attention is the outside oracle, in
tests/test_hf_oracles.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mha.masks import causal_mask
from mha.mla import (
    MLACache,
    absorb,
    mla_absorbed_steps,
    mla_steps,
    multi_head_latent_attention,
)
from mha.mla_params import MLAParams, mla_rope, mla_softmax_scale, rms_norm
from mha.mla_torch import MLACache as TorchCache
from mha.mla_torch import MultiHeadLatentAttention, module_from_params, params_fields
from mha.positional import rope_permutation

pytestmark = pytest.mark.usefixtures("one_torch_thread")
# Two float64 code paths over a handful of sums of ~10 terms: errors of a few 1e-16.
CLOSE = {"rtol": 1e-12, "atol": 1e-12}
H, D, RQ, RKV, DN, DR, DV = 3, 10, 6, 5, 4, 6, 3  # every width different, to catch a swap
B, T = 2, 5
LAYOUTS = ["interleaved", "rotate_half"]
Q_RANKS = [None, RQ]


def params(layout="interleaved", q_lora_rank=RQ, seed=0) -> MLAParams:
    return MLAParams.init(D, H, kv_lora_rank=RKV, qk_nope_head_dim=DN, qk_rope_head_dim=DR,
                          v_head_dim=DV, q_lora_rank=q_lora_rank, rope_layout=layout,
                          seed=seed)  # fmt: skip


def base_fields(p: MLAParams) -> dict:
    """The fields that rebuild ``p``: its sizes, settings and weights."""
    return {"num_heads": p.num_heads, "qk_nope_head_dim": p.qk_nope_head_dim,
            "qk_rope_head_dim": p.qk_rope_head_dim, "v_head_dim": p.v_head_dim,
            "rope_base": p.rope_base, "rope_layout": p.rope_layout, "eps": p.eps,
            "softmax_scale": p.softmax_scale, **p.weights()}  # fmt: skip


def tokens(batch=B, length=T, seed=1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(batch, length, D))


def padding() -> np.ndarray:
    """(B, 1, 1, S): the second sequence's first token is padding."""
    keep = np.ones((B, T), dtype=bool)
    keep[1, 0] = False
    return keep[:, None, None, :]


def close(got, want) -> None:
    got = got.detach().numpy() if isinstance(got, torch.Tensor) else got
    np.testing.assert_allclose(got, want, **CLOSE)


# ---------------------------------------------------------- the two forms agree


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("q_lora_rank", Q_RANKS)
def test_absorbed_form_equals_plain_form(layout, q_lora_rank):
    p, x = params(layout, q_lora_rank), tokens()
    plain = mla_steps(x, p, mask=padding())
    absorbed = mla_absorbed_steps(x, p, mask=padding())
    for name in ("scores", "scaled", "weights", "output"):
        close(getattr(absorbed, name), getattr(plain, name))
    # The absorbed keys are the cache itself, one per token for all heads, and the
    # queries live in the latent's space.
    assert absorbed.keys.shape == (B, 1, T, RKV + DR)
    assert absorbed.queries.shape == (B, H, T, RKV + DR)
    assert plain.keys.shape == (B, H, T, DN + DR) and plain.v_heads.shape == (B, H, T, DV)
    # The RoPE part of every head's key is the one shared key (a broadcast: exact).
    assert np.array_equal(plain.keys[..., DN:], np.broadcast_to(plain.k_rope[:, None],
                                                                (B, H, T, DR)))  # fmt: skip
    # The folded output, head by head, is the plain context through W_o.
    heads = absorbed.context_latent @ absorb(p).W_uv_o  # (B, H, T, D)
    per_head_plain = plain.context @ p.W_o.reshape(H, DV, D)  # (B, H, T, D)
    close(heads, per_head_plain)
    out, weights = multi_head_latent_attention(x, p, mask=padding(), absorbed=True)
    close(out, plain.output)
    close(weights, plain.weights)


def test_scores_and_the_scale():
    p, x = params(), tokens()
    steps = mla_steps(x, p, causal=False)
    assert p.softmax_scale == 1 / math.sqrt(DN + DR)  # the default: the same formula
    close(steps.scaled, steps.scores / math.sqrt(DN + DR))
    np.testing.assert_allclose(steps.weights.sum(-1), 1.0, rtol=0, atol=1e-15)
    causal = mla_steps(x, p)
    assert np.all(causal.weights[..., ~causal_mask(T)] == 0)  # blocked: exactly 0
    # DeepSeek-V3's published YaRN settings: factor 40, mscale_all_dim 1.
    mscale = 0.1 * math.log(40) + 1
    assert math.isclose(mla_softmax_scale(128, 64, yarn_factor=40, mscale_all_dim=1.0),
                        mscale**2 / math.sqrt(192), rel_tol=1e-15)  # fmt: skip
    assert mla_softmax_scale(128, 64, yarn_factor=1.0, mscale_all_dim=1.0) == 1 / math.sqrt(192)
    assert mla_softmax_scale(128, 64, yarn_factor=40, mscale_all_dim=0.0) == 1 / math.sqrt(192)


def test_rms_norm_gives_unit_root_mean_square_times_the_weight():
    x = np.random.default_rng(3).normal(size=(4, 7)) * 5
    weight = np.linspace(0.5, 1.5, 7)
    y = rms_norm(x, weight, eps=1e-12)
    np.testing.assert_allclose(np.sqrt(np.mean((y / weight) ** 2, axis=-1)), 1.0, rtol=1e-12)
    np.testing.assert_allclose(y / x, (y / x)[:, :1] * weight / weight[0], rtol=1e-12)


# ------------------------------------------------------------- NumPy vs torch


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("q_lora_rank", Q_RANKS)
def test_torch_module_equals_the_specification(layout, q_lora_rank):
    p, x = params(layout, q_lora_rank), tokens()
    module = module_from_params(p)
    want = mla_steps(x, p, mask=padding())
    for absorbed in (False, True):
        out, weights = module(torch.from_numpy(x), mask=torch.from_numpy(padding()),
                              absorbed=absorbed)  # fmt: skip
        close(out, want.output)
        close(weights, want.weights)
    # And back: the module's weights rebuild the same params (copies: exact).
    again = MLAParams(**params_fields(module))
    for name, array in p.weights().items():
        assert (array is None and again.weights()[name] is None) or np.array_equal(
            again.weights()[name], array), name  # fmt: skip
    assert again.config() == p.config()


def test_torch_module_trains_its_own_weights_and_the_specification_follows():
    """A module with torch's own initialisation (not from params), one gradient step:
    the specification, given its weights, still agrees (plain and absorbed)."""
    torch.manual_seed(0)
    module = MultiHeadLatentAttention(D, H, kv_lora_rank=RKV, qk_nope_head_dim=DN,
                                      qk_rope_head_dim=DR, v_head_dim=DV, q_lora_rank=RQ,
                                      rope_layout="rotate_half").double()  # fmt: skip
    x = torch.from_numpy(tokens())
    out, _ = module(x, absorbed=True)
    out.square().sum().backward()  # gradients reach every weight through the fold
    assert all(w.grad is not None and w.grad.abs().sum() > 0 for w in module.parameters())
    with torch.no_grad():
        for w in module.parameters():
            w -= 0.1 * w.grad
    p = MLAParams(**params_fields(module))
    close(module(x)[0], mla_steps(x.numpy(), p).output)
    close(module(x, absorbed=True)[0], mla_absorbed_steps(x.numpy(), p).output)


# ------------------------------------------------------------ the latent cache


@pytest.mark.parametrize("sizes", [[1] * T, [2, 3]])
@pytest.mark.parametrize("absorbed", [False, True])
def test_cached_decoding_equals_the_full_forward(sizes, absorbed):
    p, x = params(), tokens()
    full = mla_steps(x, p)
    module = module_from_params(p)
    cache, torch_cache, outs, torch_outs, start = MLACache(), TorchCache(), [], [], 0
    for size in sizes:
        new = x[:, start : start + size]
        out, weights = multi_head_latent_attention(new, p, cache=cache, absorbed=absorbed)
        close(weights, full.weights[:, :, start : start + size, : start + size])
        outs.append(out)
        torch_outs.append(module(torch.from_numpy(new), cache=torch_cache, absorbed=absorbed)[0])
        start += size
    close(np.concatenate(outs, axis=1), full.output)
    close(torch.cat(torch_outs, dim=1), full.output)
    # Only the latent and the shared RoPE key, one of each per token: no head axis.
    assert cache.latent.shape == (B, T, RKV) and cache.k_rope.shape == (B, T, DR)
    assert cache.values_per_token == p.cached_values_per_token == RKV + DR
    close(cache.latent, full.latent)
    close(cache.k_rope, full.k_rope)
    close(torch_cache.latent, full.latent)
    close(torch_cache.k_rope, full.k_rope)


def test_positions_per_sequence_and_after_the_cache():
    """(B, T) positions give each sequence its own; default positions follow the cache."""
    p, x = params(), tokens()
    starts = np.array([[0], [3]])
    positions = starts + np.arange(T)  # (B, T)
    both = mla_steps(x, p, positions=positions)
    for b in range(B):
        alone = mla_steps(x[b : b + 1], p, positions=positions[b])
        close(both.output[b], alone.output[0])
    torch_out, _ = module_from_params(p)(torch.from_numpy(x), positions=torch.from_numpy(positions))
    close(torch_out, both.output)
    # RoPE depends on position differences only: shifting every position changes nothing
    # in the scores, and the shared key is turned to its own position.
    shifted = mla_steps(x, p, positions=np.arange(T) + 3)
    close(shifted.scores, mla_steps(x, p).scores)
    assert not np.allclose(shifted.k_rope, mla_steps(x, p).k_rope)
    cache = MLACache()
    mla_steps(x[:, :2], p, cache=cache)
    later = mla_steps(x[:, 2:], p, cache=cache, causal=False)  # positions 2, 3, 4 by default
    close(later.k_rope[:, 2:], mla_rope(x[:, 2:] @ p.W_kr, np.arange(2, T)))


def test_the_two_rope_layouts_are_one_computation_on_reordered_features():
    """Interleaved weights, their RoPE columns reordered by rope_permutation, give the
    rotate_half layer the same output: the layouts differ only in feature order."""
    p = params("interleaved")
    back = np.argsort(rope_permutation(DR))  # rotate_half feature j <- interleaved back[j]
    w_qr = p.W_qr.reshape(-1, H, DR)[..., back].reshape(p.W_qr.shape)
    fields = {**p.weights(), "W_qr": w_qr, "W_kr": p.W_kr[:, back]}
    q = MLAParams(num_heads=H, qk_nope_head_dim=DN, qk_rope_head_dim=DR, v_head_dim=DV,
                  rope_layout="rotate_half", **fields)  # fmt: skip
    x = tokens()
    close(mla_steps(x, q).output, mla_steps(x, p).output)
    torch_q = module_from_params(q)(torch.from_numpy(x))[0]
    close(torch_q, mla_steps(x, p).output)
    # Not the same layer with the layout ignored: the same weights, other pairing, differ.
    same_weights = MLAParams(**{**base_fields(p), "rope_layout": "rotate_half"})
    assert not np.allclose(mla_steps(x, same_weights).output, mla_steps(x, p).output)


def test_a_query_with_nothing_to_attend_to_gets_zero_weights():
    p, x = params(), tokens()
    mask = np.ones((B, 1, 1, T), dtype=bool)
    mask[0] = False  # the first sequence may attend to nothing
    for absorbed in (False, True):
        out, weights = multi_head_latent_attention(x, p, mask=mask, absorbed=absorbed)
        torch_out, torch_weights = module_from_params(p)(
            torch.from_numpy(x), mask=torch.from_numpy(mask), absorbed=absorbed)
        assert np.all(weights[0] == 0) and np.all(out[0] == 0)  # no bias: exactly zero
        assert torch.all(torch_weights[0] == 0) and torch.all(torch_out[0] == 0)
        assert not np.any(np.isnan(out)) and not torch.any(torch.isnan(torch_out))


def test_params_sizes():
    p = params()
    assert (p.d_model, p.q_lora_rank, p.kv_lora_rank, p.qk_head_dim) == (D, RQ, RKV, DN + DR)
    assert p.num_parameters == (D * RQ + RQ + RQ * H * (DN + DR) + D * (RKV + DR) + RKV
                                + RKV * H * (DN + DV) + H * DV * D)  # fmt: skip
    assert params(q_lora_rank=None).q_lora_rank is None
    assert np.array_equal(params(seed=4).W_uk, params(seed=4).W_uk)  # same seed, same draw
    assert not np.array_equal(params(seed=4).W_uk, params(seed=5).W_uk)
    absorbed = absorb(p)
    assert absorbed.W_uq_uk.shape == (H, RQ, RKV) and absorbed.W_uv_o.shape == (H, RKV, D)
    assert absorb(params(q_lora_rank=None)).W_uq_uk.shape == (H, D, RKV)


# -------------------------------------------------------------- bad arguments


def _spec_calls():
    p, x = params(), tokens()
    full_cache = MLACache()
    mla_steps(x, p, cache=full_cache)
    base = {k: v for k, v in base_fields(p).items()
            if k not in ("rope_base", "rope_layout", "eps", "softmax_scale")}
    return [
        (lambda: mla_steps(x[0], p), "x must have shape"),
        (lambda: mla_steps(x[..., :-1], p), "d_model"),
        (lambda: mla_steps(x, "p"), "params"),
        (lambda: mla_steps(x, p, positions=np.arange(T) * 1.0), "positions must be integers"),
        (lambda: mla_steps(x, p, positions=np.arange(T + 1)), "positions must have shape"),
        (lambda: mla_steps(x, p, positions=np.arange(T) - 1), "positions"),
        (lambda: mla_steps(x, p, mask=np.ones((T, T))), "mask must be a boolean"),
        (lambda: mla_steps(x, p, mask=np.ones((T, T + 1), bool)), "mask with shape"),
        (lambda: mla_steps(x, p, causal=1), "causal"),
        (lambda: mla_steps(x, p, cache={}), "cache must be"),
        (lambda: mla_steps(x[:1], p, cache=full_cache), "batch size"),
        (lambda: mla_absorbed_steps(x, p, absorbed=p), "absorbed must be"),
        (lambda: multi_head_latent_attention(x, p, absorbed="yes"), "absorbed must be"),
        (lambda: absorb(None), "params"),
        (lambda: MLAParams(**{**base, "W_uk": p.W_uk[:, :-1]}), "W_uk must have shape"),
        (lambda: MLAParams(**{**base, "W_dq": None}), "W_dq and q_norm"),
        (lambda: MLAParams(**{**base, "kv_norm": p.kv_norm[None]}), "kv_norm must have shape"),
        (lambda: MLAParams(**{**base, "qk_rope_head_dim": 5}), "must be even"),
        (lambda: MLAParams(**base, rope_layout="halves"), "rope_layout"),
        (lambda: MLAParams(**base, eps=0.0), "eps"),
        (lambda: MLAParams(**base, softmax_scale=-1.0), "softmax_scale"),
        (lambda: MLAParams(**base, rope_base=float("inf")), "rope_base"),
        (lambda: MLAParams(**{**base, "num_heads": 2}), "must have shape"),
        (lambda: MLAParams.init(D, 0, kv_lora_rank=RKV, qk_nope_head_dim=DN,
                                qk_rope_head_dim=DR, v_head_dim=DV), "num_heads"),
        (lambda: MLAParams.init(D, H, kv_lora_rank=RKV, qk_nope_head_dim=DN,
                                qk_rope_head_dim=DR, v_head_dim=DV, q_lora_rank=2.5),
         "q_lora_rank"),
        (lambda: mla_softmax_scale(0, 64), "qk_nope_head_dim"),
        (lambda: mla_softmax_scale(128, 64, yarn_factor=0.0), "yarn_factor"),
        (lambda: mla_softmax_scale(128, 64, mscale_all_dim=-1.0), "mscale_all_dim"),
        (lambda: rms_norm(x, np.ones(D + 1)), "weight must have shape"),
        (lambda: rms_norm(x, np.ones(D), eps=-1.0), "eps"),
        (lambda: mla_rope(x, np.arange(T), layout="halves"), "layout"),
        (lambda: full_cache.append(np.zeros((B, 1, RKV + 1)), np.zeros((B, 1, DR))), "fit"),
    ]  # fmt: skip


def _torch_calls():
    p, x = params(), torch.from_numpy(tokens())
    module = module_from_params(p)
    full_cache = TorchCache()
    module(x, cache=full_cache)
    sizes = {"kv_lora_rank": RKV, "qk_nope_head_dim": DN, "qk_rope_head_dim": DR,
             "v_head_dim": DV}  # fmt: skip
    return [
        (lambda: module(x.numpy()), "x must be a float tensor"),
        (lambda: module(x[0]), "x must be a float tensor"),
        (lambda: module(x[..., :-1]), "d_model"),
        (lambda: module(x, positions=torch.arange(T) * 1.0), "positions must be an integer"),
        (lambda: module(x, positions=torch.arange(T + 1)), "positions must have shape"),
        (lambda: module(x, positions=torch.arange(T) - 1), "positions must be >= 0"),
        (lambda: module(x, mask=torch.ones(T, T)), "mask must be a boolean"),
        (lambda: module(x, mask=torch.ones(T, T + 1, dtype=torch.bool)), "does not broadcast"),
        (lambda: module(x, causal=None), "causal"),
        (lambda: module(x, absorbed=1), "absorbed"),
        (lambda: module(x, cache=MLACache()), "cache must be"),
        (lambda: module(x[:1], cache=full_cache), "batch size"),
        (lambda: MultiHeadLatentAttention(D, H, **{**sizes, "qk_rope_head_dim": 5}), "even"),
        (lambda: MultiHeadLatentAttention(D, H, **sizes, rope_layout="x"), "rope_layout"),
        (lambda: MultiHeadLatentAttention(D, H, **sizes, eps=0), "eps"),
        (lambda: MultiHeadLatentAttention(D, H, **sizes, softmax_scale=True), "softmax_scale"),
        (lambda: MultiHeadLatentAttention(D, 2.0, **sizes), "num_heads"),
        (lambda: MultiHeadLatentAttention(D, H, **sizes, q_lora_rank=0), "q_lora_rank"),
        (lambda: params_fields(torch.nn.Linear(2, 2)), "module must be"),
        (lambda: full_cache.append(torch.zeros(B, 1, RKV), torch.zeros(B, 1, DR + 2)), "fit"),
    ]  # fmt: skip


@pytest.mark.parametrize("layer", ["numpy", "torch"])
def test_bad_arguments_raise_value_error_naming_them(layer):
    for call, match in _spec_calls() if layer == "numpy" else _torch_calls():
        with pytest.raises(ValueError, match=match):
            call()

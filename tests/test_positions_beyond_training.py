"""Positions beyond the training length: RoPE's scalings (:mod:`mha.rope_scaling` and its
torch twin) and T5's bucketed relative bias (:mod:`mha.positional`), against Hugging
Face ``transformers``.

Oracles:

* ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (linear, dynamic, yarn,
  llama3), called with a minimal ``LlamaConfig``. They compute ``inv_freq`` in float32
  even under float64, so agreement is ~1e-7 relative (``RTOL_HF``); their attention
  factors are Python floats (``ATOL_FACTOR``);
* static NTK scaling, which ``transformers`` lacks: its formula, written here;
* ``T5Attention._relative_position_bucket`` and ``T5Attention.compute_bias``: integers
  and a table look-up, compared exactly;
* T5's attention ``softmax(q . k + bias) v``, written here, against
  ``mha.scaled_dot_product_attention`` with the queries times ``sqrt(Dh)``.

``transformers`` is imported on first use (:func:`hf`), as in ``test_hf_oracles.py``.
"""

from __future__ import annotations

import functools
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from numerics import EPS32

import mha
from mha import positional_torch, rope_scaling
from mha import rope_scaling_torch as rst

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RTOL_HF = 1e-6  # float32 frequencies: a few ulps of 1.2e-7 (seen: up to 6e-7)
ATOL_FACTOR = 1e-12  # attention factors: the same float64 formula in another order
CLOSE = {"rtol": 1e-13, "atol": 0.0}  # NumPy against torch, both float64

BASES = [10000.0, 500000.0]
HEAD_DIMS = [8, 64, 128]
FACTORS = [2.0, 4.0, 8.0, 32.0]
TRAINING_LENGTH = 4096


@functools.cache
def hf() -> SimpleNamespace:
    """The pieces of ``transformers`` used here, imported on first use (it takes
    seconds): only the process that runs these tests pays, once."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never download
    from transformers import LlamaConfig, T5Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.t5.modeling_t5 import T5Attention

    return SimpleNamespace(
        LlamaConfig=LlamaConfig,
        ROPE_INIT_FUNCTIONS=ROPE_INIT_FUNCTIONS,
        T5Attention=T5Attention,
        T5Config=T5Config,
    )


def hf_rope(rope_type, head_dim, base, max_position_embeddings, seq_len=None, **params):
    """``transformers``' inverse frequencies (as float64) and attention factor, from a
    one-head ``LlamaConfig`` whose ``head_dim`` is the rotary width."""
    config = hf().LlamaConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_type": rope_type, "rope_theta": base, **params},
    )
    inv_freq, factor = hf().ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)
    assert inv_freq.dtype == torch.float32  # hence RTOL_HF
    return inv_freq.double().numpy(), factor


def assert_matches_hf(ours, theirs, rtol=RTOL_HF):
    inv_freq, factor = theirs
    assert ours.inv_freq.shape == inv_freq.shape
    np.testing.assert_allclose(ours.inv_freq, inv_freq, rtol=rtol, atol=0)
    assert ours.attention_factor == pytest.approx(factor, abs=ATOL_FACTOR, rel=0)


grid = pytest.mark.parametrize(
    ("base", "head_dim", "factor"),
    [(b, d, f) for b in BASES for d in HEAD_DIMS for f in FACTORS],
)


# ===================================================== RoPE scalings against transformers


@grid
def test_linear_matches_transformers(base, head_dim, factor):
    ours = rope_scaling.rope_linear(head_dim, factor, base)
    assert_matches_hf(ours, hf_rope("linear", head_dim, base, TRAINING_LENGTH, factor=factor))


@grid
def test_dynamic_ntk_matches_transformers_below_and_above_the_training_length(
    base, head_dim, factor
):
    """Up to the training length RoPE is as trained; past it the base grows."""
    default = rope_scaling.rope_default(head_dim, base).inv_freq
    for seq_len in [
        1,
        TRAINING_LENGTH // 2,
        TRAINING_LENGTH,
        TRAINING_LENGTH + 1,
        3 * TRAINING_LENGTH,
        40 * TRAINING_LENGTH,
    ]:
        ours = rope_scaling.rope_dynamic_ntk(head_dim, factor, TRAINING_LENGTH, seq_len, base)
        theirs = hf_rope("dynamic", head_dim, base, TRAINING_LENGTH, seq_len=seq_len, factor=factor)
        assert_matches_hf(ours, theirs)
        if seq_len <= TRAINING_LENGTH:
            np.testing.assert_allclose(ours.inv_freq, default, rtol=1e-15)
        else:  # slower, all but the first pair
            assert np.all(ours.inv_freq[1:] < default[1:])


@grid
def test_yarn_matches_transformers(base, head_dim, factor):
    """The paper's defaults, other betas, DeepSeek's mscale pair, a given attention
    factor; and gpt-oss's ``truncate=False``, whose float32 ramp position in
    transformers is off by ~1e-7 of a pair, which the blend turns into a relative error
    of up to ~factor times that on the slow pairs (seen: 1e-6 at factor 32)."""
    length = TRAINING_LENGTH
    variants = [
        {},
        {"beta_fast": 64.0, "beta_slow": 2.0},
        {"mscale": 1.0, "mscale_all_dim": 1.0},
        {"mscale": 0.707, "mscale_all_dim": 1.0},
        {"mscale": 0.707},  # alone, ignored: transformers' rule
        {"attention_factor": 1.25},
        {"truncate": False},
        {"truncate": False, "beta_fast": 16.0, "beta_slow": 0.5},
    ]
    for params in variants:
        ours = rope_scaling.rope_yarn(head_dim, factor, length, base, **params)
        theirs = hf_rope(
            "yarn",
            head_dim,
            base,
            int(length * factor),
            factor=factor,
            original_max_position_embeddings=length,
            **params,
        )
        exact_ramp = params.get("truncate", True)
        assert_matches_hf(ours, theirs, rtol=RTOL_HF if exact_ramp else 2 * EPS32 * factor)


@grid
def test_llama3_matches_transformers(base, head_dim, factor):
    for length, low, high in [(TRAINING_LENGTH, 1.0, 4.0), (8192, 1.0, 4.0), (1024, 2.0, 8.0)]:
        ours = rope_scaling.rope_llama3(
            head_dim, factor, length, base, low_freq_factor=low, high_freq_factor=high
        )
        theirs = hf_rope(
            "llama3",
            head_dim,
            base,
            int(length * factor) + 1,
            factor=factor,
            original_max_position_embeddings=length,
            low_freq_factor=low,
            high_freq_factor=high,
        )
        assert_matches_hf(ours, theirs)


def test_the_comparisons_reach_every_part_of_the_ramps():
    """The cases above include pairs kept, pairs interpolated and pairs on the ramp, for
    YaRN and Llama 3.1 alike: a ramp turned around or a threshold swapped changes some
    frequency by a factor, not by rounding."""
    default = rope_scaling.rope_default(128, 500000.0).inv_freq
    for scaled in (
        rope_scaling.rope_yarn(128, 8.0, 8192, 500000.0),
        rope_scaling.rope_llama3(128, 8.0, 8192, 500000.0),
    ):
        ratio = default / scaled.inv_freq  # 1 kept, 8 interpolated, between on the ramp
        assert np.sum(np.isclose(ratio, 1.0, rtol=1e-12)) >= 10
        assert np.sum(np.isclose(ratio, 8.0, rtol=1e-12)) >= 10
        assert np.sum((ratio > 1.01) & (ratio < 7.99)) >= 2
        assert np.all(np.diff(ratio) >= 0)  # the slower the pair, the more it is slowed


def test_published_llama_3_1_scaling_matches_transformers():
    """Llama 3.1 8B: Dh 128, base 500000, factor 8, 8192 positions, factors 1 and 4."""
    ours = rope_scaling.rope_llama3(128, 8.0, 8192, 500000.0)
    theirs = hf_rope(
        "llama3",
        128,
        500000.0,
        131072,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    assert_matches_hf(ours, theirs)


@pytest.mark.parametrize("factor", [1.0, 2.0, 40.0])
def test_yarn_mscale_is_the_papers_formula(factor):
    """``sqrt(1 / t) = 0.1 ln(s) + 1``; 1 at ``s = 1``; DeepSeek's weighted variant."""
    assert rope_scaling.yarn_mscale(factor) == pytest.approx(0.1 * math.log(factor) + 1, abs=1e-15)
    assert rope_scaling.yarn_mscale(factor, 0.707) == pytest.approx(
        0.0707 * math.log(factor) + 1, abs=1e-15
    )
    assert rst.yarn_mscale(factor, 0.707) == rope_scaling.yarn_mscale(factor, 0.707)


# ============================================================ static NTK, by its formula


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("base", BASES)
def test_static_ntk_is_its_formula(base, head_dim, factor):
    """``theta_i = (base * s^(Dh/(Dh-2)))^(-2i/Dh)``, written here with ``**``: the
    fastest pair keeps its frequency and the slowest is divided by exactly ``s``."""
    ours = rope_scaling.rope_ntk(head_dim, factor, base)
    new_base = base * factor ** (head_dim / (head_dim - 2))
    expected = np.array([new_base ** (-2 * i / head_dim) for i in range(head_dim // 2)])
    np.testing.assert_allclose(ours.inv_freq, expected, rtol=1e-13)
    assert ours.attention_factor == 1.0
    default = rope_scaling.rope_default(head_dim, base).inv_freq
    assert ours.inv_freq[0] == 1.0 == default[0]  # base^0, exact
    assert ours.inv_freq[-1] == pytest.approx(default[-1] / factor, rel=1e-13)


def test_dynamic_ntk_at_a_length_is_static_ntk_at_its_factor():
    """At ``l = 3L`` with ``s = 4`` the NTK factor is ``4 * 3 - 3 = 9``."""
    dynamic = rope_scaling.rope_dynamic_ntk(64, 4.0, 1000, 3000)
    np.testing.assert_allclose(
        dynamic.inv_freq, rope_scaling.rope_ntk(64, 9.0).inv_freq, rtol=1e-14
    )


# ================================================================= apply_rope(inv_freq=)


def test_default_frequencies_leave_apply_rope_unchanged():
    """The same computation twice: exact."""
    x = np.random.default_rng(0).normal(size=(2, 3, 7, 8))  # (B, H, L, Dh)
    positions = np.arange(7)
    inv_freq = rope_scaling.rope_default(8).inv_freq
    np.testing.assert_array_equal(
        mha.apply_rope(x, positions, inv_freq=inv_freq), mha.apply_rope(x, positions)
    )
    xt, pt = torch.from_numpy(x), torch.from_numpy(positions)
    inv_t = rst.rope_default(8).inv_freq
    assert torch.equal(
        positional_torch.apply_rope(xt, pt, inv_freq=inv_t), positional_torch.apply_rope(xt, pt)
    )


@pytest.mark.parametrize("factor", [2, 4])
def test_position_interpolation_turns_position_m_as_m_over_s(factor):
    """Linear scaling at position ``s * m`` is RoPE as trained at ``m``: the longer
    sequence is squeezed into the trained positions."""
    x = np.random.default_rng(1).normal(size=(2, 5, 16))
    positions = np.array([0, 1, 3, 100, 2047])
    stretched = mha.apply_rope(
        x, factor * positions, inv_freq=rope_scaling.rope_linear(16, factor).inv_freq
    )
    np.testing.assert_allclose(stretched, mha.apply_rope(x, positions), rtol=0, atol=1e-12)


def test_apply_rope_with_scaled_frequencies_numpy_equals_torch():
    x = np.random.default_rng(2).normal(size=(1, 2, 6, 64))
    positions = np.array([0, 5, 4095, 4096, 20000, 131071])
    numpy_freq = rope_scaling.rope_yarn(64, 32.0, 4096, 500000.0).inv_freq
    torch_freq = rst.rope_yarn(64, 32.0, 4096, 500000.0).inv_freq
    expected = mha.apply_rope(x, positions, inv_freq=numpy_freq)
    got = positional_torch.apply_rope(
        torch.from_numpy(x), torch.from_numpy(positions), inv_freq=torch_freq
    )
    # angles up to 1.3e5 rad: float64 leaves them ~1e-11 apart (eps * angle)
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"inv_freq": np.ones(3)}, r"inv_freq must have shape \(Dh/2,\) = \(4,\)"),
        ({"inv_freq": np.ones((4, 1))}, r"inv_freq must have shape"),
        ({"inv_freq": np.array([1.0, -1.0, 0.5, 0.1])}, "inv_freq must be finite and >= 0"),
        ({"inv_freq": np.array([1.0, np.nan, 0.5, 0.1])}, "inv_freq must be finite"),
        ({"inv_freq": np.ones(4), "base": 500000.0}, "base=500000.0 is not used with inv_freq"),
    ],
)
def test_apply_rope_refuses_bad_frequencies(kwargs, message):
    x, positions = np.zeros((3, 8)), np.arange(3)
    with pytest.raises(ValueError, match=message):
        mha.apply_rope(x, positions, **kwargs)
    torch_kwargs = {k: torch.from_numpy(v) if k == "inv_freq" else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=message):
        positional_torch.apply_rope(torch.zeros(3, 8), torch.arange(3), **torch_kwargs)


# ====================================================================== NumPy vs torch


SCALINGS = {  # name -> (arguments, keyword arguments) shared by both twins
    "rope_default": ((64, 500000.0), {}),
    "rope_linear": ((64, 4.0, 10000.0), {}),
    "rope_ntk": ((8, 8.0, 10000.0), {}),
    "rope_dynamic_ntk": ((128, 8.0, 4096, 50000, 500000.0), {}),
    "rope_yarn": (
        (64, 32.0, 4096, 10000.0),
        {"truncate": False, "mscale": 0.707, "mscale_all_dim": 1.0},
    ),
    "rope_llama3": ((128, 8.0, 8192, 500000.0), {"low_freq_factor": 2.0}),
}


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_numpy_and_torch_twins_agree(name):
    args, kwargs = SCALINGS[name]
    ours = getattr(rope_scaling, name)(*args, **kwargs)
    theirs = getattr(rst, name)(*args, **kwargs)
    assert theirs.inv_freq.dtype == torch.float64
    np.testing.assert_allclose(theirs.inv_freq.numpy(), ours.inv_freq, **CLOSE)
    assert theirs.attention_factor == pytest.approx(ours.attention_factor, abs=1e-15)


# ============================================================================ bad input


BAD_SCALINGS = [
    ("rope_linear", (64, 0.5), {}, "factor must be a finite number >= 1"),
    ("rope_ntk", (64, 0.99), {}, "factor must be"),
    ("rope_ntk", (2, 2.0), {}, "head_dim must be at least 4"),
    ("rope_linear", (63, 2.0), {}, "head_dim must be even"),
    ("rope_default", (64, 1.0), {}, "base must be a finite number > 1"),
    ("rope_default", (0,), {}, "head_dim must be a positive integer"),
    ("rope_dynamic_ntk", (64, 2.0, 0, 10), {}, "training_length must be a positive integer"),
    ("rope_dynamic_ntk", (64, 2.0, 10, 0), {}, "seq_len must be a positive integer"),
    (
        "rope_yarn",
        (64, 4.0, 4096),
        {"beta_fast": 1.0, "beta_slow": 1.0},
        "beta_slow must be smaller than beta_fast",
    ),
    (
        "rope_yarn",
        (64, 4.0, 4096),
        {"beta_fast": 1.0, "beta_slow": 32.0},
        "beta_slow must be smaller than beta_fast",
    ),
    ("rope_yarn", (64, 4.0, 4096), {"beta_slow": 0.0}, "beta_slow must be a finite number > 0"),
    ("rope_yarn", (64, float("nan"), 4096), {}, "factor must be a finite number"),
    ("rope_yarn", (64, 4.0, 4096), {"mscale": -1.0}, "mscale must be a finite number >= 0"),
    ("rope_yarn", (64, 4.0, 4096), {"mscale": 1.0, "mscale_all_dim": True}, "mscale_all_dim"),
    ("rope_yarn", (64, 4.0, 4096), {"attention_factor": 0.0}, "attention_factor must be"),
    ("rope_yarn", (64, 4.0, 4096), {"truncate": 1}, "truncate must be True or False"),
    (
        "rope_llama3",
        (64, 8.0, 8192),
        {"low_freq_factor": 4.0, "high_freq_factor": 4.0},
        "low_freq_factor must be smaller than high_freq_factor",
    ),
    (
        "rope_llama3",
        (64, 8.0, 8192),
        {"low_freq_factor": 0.0},
        "low_freq_factor must be a finite number > 0",
    ),
    ("yarn_mscale", (0.5,), {}, "factor must be"),
]


@pytest.mark.parametrize(("name", "args", "kwargs", "message"), BAD_SCALINGS)
def test_bad_scaling_arguments_are_refused_by_both_twins(name, args, kwargs, message):
    for module in (rope_scaling, rst):
        with pytest.raises(ValueError, match=message):
            getattr(module, name)(*args, **kwargs)


# ================================================================ T5's relative buckets


# (bidirectional, num_buckets, max_distance): T5's own, others, and the smallest allowed
T5_LAYOUTS = [
    (direction, num_buckets, max_distance)
    for direction in (True, False)
    for num_buckets, max_distance in [(32, 128), (16, 64), (8, 20), (33, 100), (64, 256), (4, 3)]
] + [(False, 2, 2)]


@pytest.mark.parametrize(("bidirectional", "num_buckets", "max_distance"), T5_LAYOUTS)
def test_t5_buckets_equal_transformers(bidirectional, num_buckets, max_distance):
    """Integers: exact, for every relative position from -300 to 300."""
    offset = np.arange(-300, 301)
    ours = mha.t5_relative_position_bucket(
        offset, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    theirs = hf().T5Attention._relative_position_bucket(
        torch.from_numpy(offset),
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, theirs.numpy())
    twin = positional_torch.t5_relative_position_bucket(
        torch.from_numpy(offset),
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    )
    np.testing.assert_array_equal(twin.numpy(), ours)


def test_t5_buckets_by_hand():
    """T5's layout, 32 buckets, 128: distances 0-7 exact, 8-127 in 8 log buckets, then
    the last one; keys after the query (bidirectional) in 16-31."""
    n = np.array([0, 1, 7, 8, 11, 12, 15, 16, 127, 128, 10_000])
    causal = mha.t5_relative_position_bucket(-n, bidirectional=False)
    # 32 buckets, 16 exact: 16 + floor(16 ln(n/16) / ln 8) from n = 16 on
    expected_causal = [
        0,
        1,
        7,
        8,
        11,
        12,
        15,
        16,
        16 + int(16 * math.log(127 / 16) / math.log(8)),
        31,
        31,
    ]
    assert causal.tolist() == expected_causal
    before = mha.t5_relative_position_bucket(-n)
    after = mha.t5_relative_position_bucket(n)
    assert before.tolist() == [0, 1, 7, 8, 8, 9, 9, 10, 15, 15, 15]  # 8 + floor(8 log_16(n/8))
    assert after.tolist() == [0] + [16 + b for b in before.tolist()[1:]]
    assert mha.t5_relative_position_bucket(n, bidirectional=False).tolist() == [0] * len(n)


@pytest.mark.parametrize(("size", "num_keys"), [(5, 5), (3, 9), (1, 200)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias_equals_transformers_compute_bias(bidirectional, size, num_keys):
    """The same (H, T, S) layout, sign and query positions (the last T of S, as
    ``past_seen_tokens``): a table look-up, exact."""
    num_buckets, num_heads = 16, 3
    config = hf().T5Config(
        d_model=12,
        d_kv=4,
        num_heads=num_heads,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=40,
        is_decoder=not bidirectional,
    )
    layer = hf().T5Attention(config, has_relative_attention_bias=True, layer_idx=0).double()
    table = np.random.default_rng(3).normal(size=(num_buckets, num_heads))
    with torch.no_grad():
        layer.relative_attention_bias.weight.copy_(torch.from_numpy(table))
        theirs = layer.compute_bias(size, num_keys, past_seen_tokens=num_keys - size)
    ours = mha.t5_relative_bias(table, size, num_keys, bidirectional=bidirectional, max_distance=40)
    assert ours.shape == (num_heads, size, num_keys)
    np.testing.assert_array_equal(ours, theirs[0].numpy())
    twin = positional_torch.t5_relative_bias(
        torch.from_numpy(table), size, num_keys, bidirectional=bidirectional, max_distance=40
    )
    np.testing.assert_array_equal(twin.numpy(), ours)


def test_t5_attention_is_mha_with_queries_times_sqrt_head_dim():
    """T5 adds its bias to the unscaled ``q . k``: ``mha`` with ``sqrt(Dh) q`` and the
    bias as ``score_bias`` (broadcast over the batch) is T5's attention, causal mask
    included."""
    rng = np.random.default_rng(4)
    num_heads, size, head_dim = 4, 6, 8
    q, k, v = (rng.normal(size=(2, num_heads, size, head_dim)) for _ in range(3))
    bias = mha.t5_relative_bias(rng.normal(size=(32, num_heads)), size, bidirectional=False)
    scores = q @ k.swapaxes(-1, -2) + bias  # (B, H, T, Dh) @ (B, H, Dh, S) + (H, T, S)
    scores = np.where(mha.causal_mask(size), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    context, got = mha.scaled_dot_product_attention(
        q * math.sqrt(head_dim), k, v, mha.causal_mask(size), score_bias=bias
    )
    np.testing.assert_allclose(got, weights, rtol=0, atol=1e-13)
    np.testing.assert_allclose(context, weights @ v, rtol=0, atol=1e-13)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_buckets": 3}, r"num_buckets must be at least 4 \(bidirectional=True\)"),
        ({"num_buckets": 1, "bidirectional": False}, "num_buckets must be at least 2"),
        ({"num_buckets": 32, "max_distance": 8}, "max_distance=8 must exceed the 8 exact"),
        ({"max_distance": 0}, "max_distance must be a positive integer"),
        ({"bidirectional": 1}, "bidirectional must be True or False"),
    ],
)
def test_t5_buckets_refuse_bad_layouts(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mha.t5_relative_position_bucket(np.arange(3), **kwargs)
    with pytest.raises(ValueError, match=message):
        positional_torch.t5_relative_position_bucket(torch.arange(3), **kwargs)


def test_t5_refuses_bad_positions_and_tables():
    with pytest.raises(ValueError, match="relative_position must be integers"):
        mha.t5_relative_position_bucket(np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="relative_position must be an integer tensor"):
        positional_torch.t5_relative_position_bucket(torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"table must have shape \(num_buckets, H\)"):
        mha.t5_relative_bias(np.zeros(32), 4)
    with pytest.raises(ValueError, match="table .* must be finite"):
        mha.t5_relative_bias(np.full((32, 2), np.inf), 4)
    with pytest.raises(ValueError, match=r"table must be a float tensor \(num_buckets, H\)"):
        positional_torch.t5_relative_bias(torch.zeros(32), 4)
    with pytest.raises(ValueError, match="num_keys=3 is smaller than size=4"):
        mha.t5_relative_bias(np.zeros((32, 2)), 4, 3)

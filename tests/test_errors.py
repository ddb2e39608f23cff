"""Bad input gets a ValueError that names the argument and the shapes, never a silent
broadcast or a NaN."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mha import (
    AttentionParams,
    causal_mask,
    combine_masks,
    convert,
    from_additive_mask,
    from_torch_attn_mask,
    from_torch_key_padding_mask,
    merge_heads,
    multi_head_attention,
    multi_head_attention_steps,
    padding_mask,
    scaled_dot_product_attention,
    sinusoidal_positional_encoding,
    softmax,
    split_heads,
    to_additive_mask,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)

rng = np.random.default_rng(0)
Q = rng.normal(size=(2, 3, 4))  # (B, T, Dh)
K = rng.normal(size=(2, 5, 4))  # (B, S, Dh)
V = rng.normal(size=(2, 5, 6))  # (B, S, Dv)
X = rng.normal(size=(2, 3, 8))  # (B, T, D)
SOURCE = rng.normal(size=(2, 5, 8))  # (B, S, D)
PARAMS = AttentionParams.init(8, seed=0)


def raises(*parts: str):
    """pytest.raises(ValueError) whose message contains every part, in order."""
    return pytest.raises(ValueError, match=".*".join(re.escape(p) for p in parts))


# ------------------------------------------------------------- q, k, v shapes


def test_q_k_v_rank_mismatch() -> None:
    with raises("same number of dims", "q (2, 3, 4)", "k (5, 4)"):
        scaled_dot_product_attention(Q, K[0], V)


def test_q_k_v_batch_mismatch() -> None:
    with raises("leading", "q (2, 3, 4)", "k (3, 5, 4)"):
        scaled_dot_product_attention(Q, np.zeros((3, 5, 4)), np.zeros((3, 5, 6)))


def test_q_k_feature_mismatch() -> None:
    with raises("q and k", "last dim", "(2, 3, 4)", "(2, 5, 7)"):
        scaled_dot_product_attention(Q, np.zeros((2, 5, 7)), V)


def test_k_v_length_mismatch() -> None:
    with raises("k and v", "length S", "k (2, 5, 4)", "v (2, 4, 6)"):
        scaled_dot_product_attention(Q, K, V[:, :4])


def test_q_of_rank_one() -> None:
    with raises("q", "(4,)"):
        scaled_dot_product_attention(Q[0, 0], K[0], V[0])


def test_non_numeric_input() -> None:
    with raises("q", "numeric", "bool"):
        scaled_dot_product_attention(Q > 0, K, V)
    with raises("x", "numeric"):
        softmax(np.array(["a", "b"]))
    with raises("q", "real"):
        scaled_dot_product_attention(Q.astype(complex), K, V)


# ------------------------------------------------------------------- masks


def test_mask_must_be_boolean() -> None:
    for bad in (np.ones((3, 5)), np.ones((3, 5), dtype=int)):
        with raises("mask", "boolean", str(bad.dtype), "(3, 5)"):
            scaled_dot_product_attention(Q, K, V, bad)


def test_mask_that_does_not_broadcast() -> None:
    with raises("mask", "(3, 4)", "does not broadcast", "(2, 3, 5)"):
        scaled_dot_product_attention(Q, K, V, np.ones((3, 4), dtype=bool))


def test_batch_by_source_mask_is_not_silently_broadcast() -> None:
    # (B, S) looks like a key padding mask, but it would line up with (T, S):
    # with B=2 and T=3 it must be rejected, not broadcast.
    with raises("mask", "(2, 5)", "(2, 3, 5)"):
        scaled_dot_product_attention(Q, K, V, np.ones((2, 5), dtype=bool))


def test_mask_may_not_enlarge_the_scores() -> None:
    # NumPy would broadcast (2, 3, 5) with a (4, 1, 3, 5) mask to (4, 2, 3, 5).
    with raises("mask", "(4, 1, 3, 5)", "more dims", "(2, 3, 5)"):
        scaled_dot_product_attention(Q, K, V, np.ones((4, 1, 3, 5), dtype=bool))
    # and a size-1 query axis in q cannot be stretched by the mask
    with raises("mask", "(2, 3, 5)", "(2, 1, 5)"):
        scaled_dot_product_attention(Q[:, :1], K, V, np.ones((2, 3, 5), dtype=bool))


def test_one_dimensional_mask_is_ambiguous() -> None:
    with raises("mask", "at least 2 dims", "(5,)"):
        scaled_dot_product_attention(Q, K, V, np.ones(5, dtype=bool))


def test_multi_head_attention_mask_checked_against_b_h_t_s() -> None:
    with raises("mask", "(2, 1, 1, 4)", "(2, 2, 3, 5)"):
        multi_head_attention(X, SOURCE, SOURCE, PARAMS, 2, padding_mask([4, 4]))
    with raises("mask", "(3, 3)", "(2, 2, 3, 5)"):
        multi_head_attention(X, SOURCE, SOURCE, PARAMS, 2, causal_mask(3))
    with raises("mask", "boolean", "float64"):
        multi_head_attention(X, X, X, PARAMS, 2, np.ones((3, 3)))


# ------------------------------------------------------------- multi-head shapes


def test_d_model_not_divisible_by_num_heads() -> None:
    with raises("d_model=8", "num_heads=3"):
        multi_head_attention(X, X, X, PARAMS, 3)
    with raises("d_model=8", "num_heads=3"):
        split_heads(X, 3)
    with raises("d_model=8", "num_heads=3"):
        convert.params_to_torch(PARAMS, 3)
    for bad in (0, -2, 2.0, True):
        with raises("num_heads", repr(bad)):
            multi_head_attention(X, X, X, PARAMS, bad)


def test_query_rank() -> None:
    with raises("query", "(B, T, D)", "(3, 8)"):
        multi_head_attention(X[0], X, X, PARAMS, 2)
    with raises("key", "(B, S, D)", "(1, 2, 5, 8)"):
        multi_head_attention(X, SOURCE[None], SOURCE, PARAMS, 2)


def test_batch_mismatch() -> None:
    with raises("batch size", "query (2, 3, 8)", "key (1, 5, 8)"):
        multi_head_attention(X, SOURCE[:1], SOURCE[:1], PARAMS, 2)


def test_key_value_length_mismatch() -> None:
    with raises("key and value", "key (2, 5, 8)", "value (2, 4, 8)"):
        multi_head_attention(X, SOURCE, SOURCE[:, :4], PARAMS, 2)


def test_feature_size_mismatch_with_params() -> None:
    with raises("query", "(2, 3, 6)", "W_q", "(8, 8)"):
        multi_head_attention(X[..., :6], X, X, PARAMS, 2)
    with raises("value", "(2, 5, 7)", "W_v"):
        multi_head_attention(X, SOURCE, SOURCE[..., :7], PARAMS, 2)


def test_params_type() -> None:
    with raises("params", "AttentionParams", "dict"):
        multi_head_attention_steps(X, X, X, {"W_q": PARAMS.W_q}, 2)


def test_split_and_merge_heads_rank() -> None:
    with raises("x", "(8,)"):
        split_heads(np.zeros(8), 2)
    with raises("x", "(3, 4)"):
        merge_heads(np.zeros((3, 4)))


# --------------------------------------------------------------- AttentionParams


def test_params_shapes_are_validated() -> None:
    good = dict(vars(PARAMS))
    with raises("W_o", "(8, 8)", "(8, 4)"):
        AttentionParams(**{**good, "W_o": np.zeros((8, 4))})
    with raises("W_k", "(D_in, D_out)", "(8,)"):
        AttentionParams(**{**good, "W_k": np.zeros(8)})
    with raises("W_v", "(8, 6)", "(8, 8)"):  # keys and values: one width, Dkv
        AttentionParams(**{**good, "W_k": np.zeros((8, 6))})
    with raises("b_v", "(8,)", "(6,)"):
        AttentionParams(**{**good, "b_v": np.zeros(6)})
    with raises("biases", "all arrays or all None", "b_k=None"):
        AttentionParams(**{**good, "b_k": None})
    with raises("d_model", "0"):
        AttentionParams.init(0)


# ------------------------------------------------------------------ mask helpers


def test_mask_helper_errors() -> None:
    with raises("size", "positive integer", "0"):
        causal_mask(0)
    with raises("exactly one of lengths or tokens"):
        padding_mask()
    with raises("exactly one of lengths or tokens"):
        padding_mask([1], tokens=np.zeros((1, 1)), pad_id=0)
    with raises("pad_id"):
        padding_mask(tokens=np.zeros((1, 3)))
    with raises("pad_id is only used with tokens"):
        padding_mask([2], pad_id=0)
    with raises("max_len is only used with lengths"):
        padding_mask(tokens=np.zeros((1, 3)), pad_id=0, max_len=3)
    with raises("tokens", "(B, S)", "(3,)"):
        padding_mask(tokens=np.zeros(3), pad_id=0)
    with raises("lengths", "(B,)", "(2, 1)"):
        padding_mask([[1], [2]])
    with raises("lengths", "integers", "float64"):
        padding_mask([1.5, 2.0])
    with raises("lengths", ">= 0", "-1"):
        padding_mask([2, -1])
    with raises("max_len=2", "longest", "3"):
        padding_mask([3, 1], max_len=2)
    with raises("masks[1]", "boolean", "int64"):
        combine_masks(causal_mask(3), np.ones((3, 3), dtype=np.int64))
    with raises("do not broadcast", "(3, 3)", "(2, 1, 1, 4)"):
        combine_masks(causal_mask(3), padding_mask([4, 2]))


def test_converter_errors() -> None:
    with raises("mask", "(B, 1, 1, S)", "(3, 3)"):
        to_torch_key_padding_mask(causal_mask(3))
    with raises("key_padding_mask", "(B, S)", "(2, 1, 1, 4)"):
        from_torch_key_padding_mask(padding_mask([4, 2]))
    with raises("key_padding_mask", "boolean", "float64"):
        from_torch_key_padding_mask(np.zeros((2, 4)))
    with raises("mask", "(T, S) or (B, H, T, S)", "(2, 3, 3)"):
        to_torch_attn_mask(np.ones((2, 3, 3), dtype=bool))
    with raises("mask", "(2, 1, 3, 3)", "needs num_heads"):
        to_torch_attn_mask(np.ones((2, 1, 3, 3), dtype=bool))
    with raises("(2, 3, 3, 3)", "3 heads", "num_heads=2"):
        to_torch_attn_mask(np.ones((2, 3, 3, 3), dtype=bool), num_heads=2)
    with raises("attn_mask", "(T, S) or (B*H, T, S)", "(3,)"):
        from_torch_attn_mask(np.ones(3, dtype=bool))
    with raises("attn_mask", "(4, 3, 3)", "needs num_heads"):
        from_torch_attn_mask(np.ones((4, 3, 3), dtype=bool))
    with raises("attn_mask", "5", "num_heads=2"):
        from_torch_attn_mask(np.ones((5, 3, 3), dtype=bool), num_heads=2)
    with raises("fill", "negative"):
        to_additive_mask(causal_mask(2), fill=0.0)
    with raises("additive", "(2,)", "NaN or positive"):
        from_additive_mask(np.array([0.0, 1.0]))
    with raises("additive", "NaN or positive"):
        from_additive_mask(np.array([0.0, np.nan]))


def test_positional_encoding_errors() -> None:
    with raises("max_len", "0"):
        sinusoidal_positional_encoding(0, 4)
    with raises("d_model", "2.5"):
        sinusoidal_positional_encoding(4, 2.5)

"""The registry of the checkers: each exercise's cases, mistake models, hint and owner.

Each entry names the chapter that owns the checker (the one whose exercises practise
it, and no other); ``make chapter`` adds a new chapter's two scaffold entries here
(``tools/chapter.py``). The public API that reads it is :mod:`mha.exercises`.
"""

from __future__ import annotations

import numpy as np

from ._attention import _sdpa_cases, _sdpa_mistakes
from ._ch10_compressed_cache import (
    _absorbed_query,
    _absorbed_query_cases,
    _absorbed_query_mistakes,
    _quantize_per_channel,
    _quantize_per_channel_cases,
    _quantize_per_channel_mistakes,
)
from ._ch11_longer_than_trained import (
    _t5_bucket,
    _t5_cases,
    _t5_mistakes,
    _window_keys,
    _yarn_cases,
    _yarn_mistakes,
    _yarn_ramp,
)
from ._ch11_longer_than_trained import (
    _window_cases as _window_keys_cases,
)
from ._ch11_longer_than_trained import (
    _window_mistakes as _window_keys_mistakes,
)
from ._ch12_how_attention_learns import (
    _head_backward,
    _head_backward_cases,
    _head_backward_mistakes,
    _softmax_backward_cases,
    _softmax_backward_mistakes,
    _tile_backward,
    _tile_backward_cases,
    _tile_backward_mistakes,
)
from ._core import _Exercise, _Returns
from ._heads import _merge_cases, _merge_mistakes, _split_cases, _split_mistakes
from ._inference import (
    _bytes_cases,
    _bytes_mistakes,
    _decode_cases,
    _decode_mistakes,
    _decode_raised,
    _decode_step,
    _repeat_cases,
    _repeat_kv_heads,
    _repeat_mistakes,
    _window_cases,
    _window_mistakes,
)
from ._layers import _add_and_norm, _norm_cases, _norm_mistakes
from ._masks import (
    _causal_cases,
    _causal_mistakes,
    _padding_cases,
    _padding_mistakes,
    _target_cases,
    _target_mask,
    _target_mistakes,
    _torch_mask_cases,
    _torch_mask_mistakes,
)
from ._multi_head_attention import (
    _cross_attention,
    _cross_cases,
    _cross_mistakes,
    _mha_cases,
    _mha_mistakes,
    _mha_raised,
)
from ._positions import (
    _rope_cases,
    _rope_mistakes,
    _sinusoid_cases,
    _sinusoid_mistakes,
    _slopes_cases,
    _slopes_mistakes,
)
from ._softmax import _softmax_cases, _softmax_mistakes
from ._tiles import _merge_cases as _tile_cases
from ._tiles import _merge_mistakes as _tile_mistakes
from ._tiles import _merge_tiles
from ._training import _loss_cases, _loss_mistakes, _sequence_loss
from ._why import (
    _attention_entropy,
    _entropy_cases,
    _entropy_mistakes,
    _score_std,
    _std_cases,
    _std_mistakes,
)

_SHAPE_HINT = (
    "Print the shape of every intermediate on this input and compare with the shape "
    "comments in the chapter."
)

# The types the exercises' texts ask for ("Return a NumPy boolean array", "as a float").
_NUMPY_FLOAT64 = _Returns(
    (np.ndarray,),
    "a NumPy float64 array",
    "np.array(values, dtype=np.float64) turns a list (or a tensor) into one.",
)

_EXERCISES: dict[str, _Exercise] = {
    "causal_mask": _Exercise(
        _causal_cases,
        ("the mask",),
        "sizes 1 to 7",
        _causal_mistakes(),
        "Draw the mask for size 3 by hand: rows are queries, columns are keys.",
        exact=True,
        chapter="01_notation",
    ),
    "padding_mask": _Exercise(
        _padding_cases,
        ("the mask",),
        "lengths as an array or a list, max_len, an empty sequence, tokens",
        _padding_mistakes(),
        "Write the mask for this input by hand: which positions are real tokens?",
        exact=True,
        chapter="01_notation",
    ),
    "softmax": _Exercise(
        _softmax_cases,
        ("the result",),
        "any axis, -inf entries, an all -inf row, large scores, float32",
        _softmax_mistakes(),
        "Check on a small input, by hand, that each slice along axis sums to 1.",
        chapter="02_overview",
    ),
    "scaled_dot_product_attention": _Exercise(
        _sdpa_cases,
        ("context", "weights"),
        "T != S, batches and heads, masks, a row with nothing to attend to, large scores, float32",
        _sdpa_mistakes(),
        "Compare your scores, weights and context with the formula "
        "softmax(q k^T / sqrt(Dh)) v, one step at a time, on this input.",
        chapter="02_overview",
    ),
    "sinusoidal_positional_encoding": _Exercise(
        _sinusoid_cases,
        ("the table",),
        "1 to 50 positions, D from 2 to 32",
        _sinusoid_mistakes(),
        "Write row 1 for D = 4 by hand: (sin 1, cos 1, sin 0.01, cos 0.01).",
        returns=_NUMPY_FLOAT64,
        chapter="03_step_by_step",
    ),
    "add_and_norm": _Exercise(
        _norm_cases,
        ("the result",),
        "batches, D from 4 to 16, another eps, float32",
        _norm_mistakes(),
        "Compute one token by hand: add, subtract the mean of its D features, divide "
        "by sqrt(variance + eps), then gamma * ... + beta.",
        reference=_add_and_norm,
        chapter="03_step_by_step",
    ),
    "split_heads": _Exercise(
        _split_cases,
        ("the result",),
        "1 to 3 sequences, 1 to 6 heads",
        _split_mistakes(),
        _SHAPE_HINT,
        chapter="04_multi_head_attention",
    ),
    "merge_heads": _Exercise(
        _merge_cases,
        ("the result",),
        "1 to 3 sequences, 1 to 5 heads",
        _merge_mistakes(),
        "merge_heads must undo split_heads: check that merging a split gives back the input.",
        chapter="04_multi_head_attention",
    ),
    "multi_head_attention": _Exercise(
        _mha_cases,
        ("output", "weights"),
        "T != S, 2 to 4 heads, masks, biases None, a row with nothing to attend to, large "
        "scores, float32",
        _mha_mistakes(),
        "Compare each intermediate with mha.multi_head_attention_steps on this input "
        "(q, q_heads, scores, ..., merged, output).",
        raised=_mha_raised(),
        chapter="04_multi_head_attention",
    ),
    "cross_attention": _Exercise(
        _cross_cases,
        ("output", "weights"),
        "a memory narrower, as wide as and wider than x, T != S, source padding, "
        "biases None, float32",
        _cross_mistakes(),
        "Print the shape of q, k, v and the scores on this input: queries (B, T, D) "
        "from x, keys and values (B, S, D) from memory.",
        reference=_cross_attention,
        chapter="05_three_attentions",
    ),
    "to_torch_attn_mask": _Exercise(
        _torch_mask_cases,
        ("the attn_mask",),
        "(T, S) masks, a mask per head, a mask shared by the heads",
        _torch_mask_mistakes(),
        "Convert a (1, 2, 2, 3) mask by hand: which (T, S) slice is entry b*H + h?",
        exact=True,
        returns=_Returns(
            (np.ndarray,),
            "a NumPy boolean array",
            "Build the mask with NumPy from NumPy arrays; torch.from_numpy turns it into "
            "the tensor nn.MultiheadAttention takes when it is needed.",
        ),
        chapter="05_three_attentions",
    ),
    "score_std": _Exercise(
        _std_cases,
        ("the standard deviation",),
        "head_dim from 9 to 1024, equal and unequal q_std and k_std",
        _std_mistakes(),
        "Find the variance of one product q_i k_i, then of the sum of Dh of them.",
        reference=_score_std,
        returns=_Returns(
            (float, np.floating),
            "a Python or NumPy float",
            "float(x) turns a 0-d array or a one-element tensor into a Python float.",
        ),
        precise=False,  # "a Python or NumPy float": np.float32 too
        chapter="06_why_attention",
    ),
    "attention_entropy": _Exercise(
        _entropy_cases,
        ("the entropy",),
        "batches and heads, uniform and one-hot rows, blocked keys of weight 0",
        _entropy_mistakes(),
        "Compute a uniform row of 4 keys by hand: its entropy is ln 4.",
        reference=_attention_entropy,
        chapter="06_why_attention",
    ),
    "sequence_loss": _Exercise(
        _loss_cases,
        ("the loss",),
        "padded and unpadded batches, another pad_id, label smoothing, large logits",
        _loss_mistakes(),
        "Compute the loss of one position by hand: -log softmax(logits)[target].",
        reference=_sequence_loss,
        returns=_Returns(
            (float, np.floating),
            "a float",
            "float(x) turns a NumPy scalar, a 0-d array or a one-element tensor into a "
            "Python float.",
        ),
        chapter="07_tiny_translator",
    ),
    "target_mask": _Exercise(
        _target_cases,
        ("the mask",),
        "padded sentences, another pad_id, one token, no padding",
        _target_mistakes(),
        "Draw the mask of a sentence of 4 tokens whose last one is a pad.",
        exact=True,
        reference=_target_mask,
        chapter="07_tiny_translator",
    ),
    "decode_step": _Exercise(
        _decode_cases,
        ("context", "k_cache", "v_cache"),
        "an empty cache, 1 to 6 cached positions, 1 to 4 heads, large scores, float32",
        _decode_mistakes(),
        "Print the shapes of the grown caches, (B, H, S + 1, Dh), and compare the "
        "context with a full pass over all S + 1 positions.",
        reference=_decode_step,
        raised=_decode_raised(),
        chapter="08_inference",
    ),
    "repeat_kv_heads": _Exercise(
        _repeat_cases,
        ("the result",),
        "groups of 2 and 3, multi-query, multi-head, an empty cache, float32",
        _repeat_mistakes(),
        "Write which key/value head each query head reads for H = 6, Hkv = 2.",
        reference=_repeat_kv_heads,
        chapter="08_inference",
    ),
    "sliding_window_mask": _Exercise(
        _window_cases,
        ("the mask",),
        "windows of 1 to 9, a window wider than the sequence, more keys than queries",
        _window_mistakes(),
        "Draw the mask for size 5, window 2 by hand: rows are queries, columns keys.",
        exact=True,
        chapter="08_inference",
    ),
    "kv_cache_bytes": _Exercise(
        _bytes_cases,
        ("the size",),
        "published shapes, batches, float32, windows shorter and longer than the context",
        _bytes_mistakes(),
        "Count by hand for 1 layer, 1 head of 1, 1 position: what is stored, how big?",
        chapter="08_inference",
    ),
    "apply_rope": _Exercise(
        _rope_cases,
        ("the rotated x",),
        "one pair, batches and heads, positions after a cache, positions as a list, "
        "another base, float32",
        _rope_mistakes(),
        "Rotate x (1, 1, 2) = [[[1, 0]]] at position 1 by hand: the result is "
        "(cos 1, sin 1).",
        chapter="09_positions_and_tiles",
    ),
    "alibi_slopes": _Exercise(
        _slopes_cases,
        ("the slopes",),
        "powers of two from 1 to 16 heads, and 3, 6 and 12 heads",
        _slopes_mistakes(),
        "Write the slopes for 8 heads by hand, then for 4, then fill in 6.",
        returns=_NUMPY_FLOAT64,
        chapter="09_positions_and_tiles",
    ),
    "merge_tiles": _Exercise(
        _tile_cases,
        ("m", "l", "a"),
        "batches and heads, an empty tile, a row with nothing to attend to, large scores",
        _tile_mistakes(),
        "Merge by hand two tiles of one key each, scores 1 and 3: m' = 3, and "
        "l' = e^(1 - 3) + 1.",
        reference=_merge_tiles,
        chapter="09_positions_and_tiles",
    ),
    "absorbed_query": _Exercise(
        _absorbed_query_cases,
        ("the absorbed query",),
        "one decoding step, a batch, one head, Rkv smaller than Dn, float32",
        _absorbed_query_mistakes(),
        "For one head, compare (q_in @ W_uq_h) @ (latent @ W_uk_h).T with your "
        "query @ latent.T on a small random latent.",
        reference=_absorbed_query,
        chapter="10_compressed_cache",
    ),
    "quantize_per_channel": _Exercise(
        _quantize_per_channel_cases,
        ("the dequantised keys",),
        "8, 4, 3 and 2 bits, an outlier channel, a channel of zeros, float32",
        _quantize_per_channel_mistakes(),
        "Quantise one channel of 3 tokens, [1, -2, 0.5], to 2 bits by hand: scale 2, "
        "codes 0, -1, 0.",
        reference=_quantize_per_channel,
        chapter="10_compressed_cache",
    ),
    "yarn_ramp": _Exercise(
        _yarn_cases,
        ("the ramp",),
        "the book's model, Llama-like settings, other betas",
        _yarn_mistakes(),
        "For head_dim 64 and L 4096, which pair turns 32 times, which once?",
        reference=_yarn_ramp,
        chapter="11_longer_than_trained",
    ),
    "t5_bucket": _Exercise(
        _t5_cases,
        ("the buckets",),
        "T5's 32 buckets to 128 and two smaller tables, distances past max_distance",
        _t5_mistakes(),
        "Work out the bucket of distances 15, 16, 31, 128 and 500 by hand (32, 128).",
        exact=False,
        reference=_t5_bucket,
        chapter="11_longer_than_trained",
    ),
    "window_keys": _Exercise(
        _window_keys_cases,
        ("the key positions",),
        "early queries, sinks inside and outside the window, windows of 1 to 32",
        _window_keys_mistakes(),
        "List the keys of query 9 with window 4 and 2 sinks by hand.",
        reference=_window_keys,
        chapter="11_longer_than_trained",
    ),
    "softmax_backward": _Exercise(
        _softmax_backward_cases,
        ("dz",),
        "any axis, blocked entries, a row with nothing allowed, one-hot rows, float32",
        _softmax_backward_mistakes(),
        "Compute dz for one row of two weights by hand: build J = diag(p) - p p^T and "
        "multiply it by dp.",
        chapter="12_how_attention_learns",
    ),
    "head_backward": _Exercise(
        _head_backward_cases,
        ("dq", "dk", "dv"),
        "T = S and T != S, batches and heads, causal and padding weights, a row with "
        "nothing allowed, Dv != Dh, float32",
        _head_backward_mistakes(),
        "Print the shape of each intermediate (dv, dp, dz, dq, dk) on this input and "
        "compare with the shapes in the chapter's formulas.",
        reference=_head_backward,
        chapter="12_how_attention_learns",
    ),
    "tile_backward": _Exercise(
        _tile_backward_cases,
        ("dq", "dk", "dv"),
        "tiles of part of a row, batches and heads, Dv != Dh, scores in the thousands, "
        "float32",
        _tile_backward_mistakes(),
        "Rebuild the tile's weights and compare them with the plain weights' tile, "
        "softmax(q k^T / sqrt(Dh)) sliced to the same rows and keys.",
        reference=_tile_backward,
        chapter="12_how_attention_learns",
    ),
}

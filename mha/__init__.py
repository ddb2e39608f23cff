"""mha: multi-head attention, written to be read, and proven equal to PyTorch.

The NumPy functions named here are the specification (``mha.softmax``,
``mha.multi_head_attention``, ...). The package is built in layers, each importing
only those below it:

* the specification, NumPy only (no torch, no matplotlib): :mod:`mha.attention`
  (softmax, heads, attention step by step, the grouped-query head mapping),
  :mod:`mha.params` (the weights), :mod:`mha.kv_cache`, :mod:`mha.masks`,
  :mod:`mha.positional` (sinusoidal, RoPE, ALiBi, T5's bias), :mod:`mha.rope_scaling`
  (RoPE past its training length), :mod:`mha.tiled` (attention tile by tile),
  :mod:`mha.backward` (the gradients of attention, by hand),
  :mod:`mha.cost` (what a KV cache costs and saves), and the compressed caches:
  :mod:`mha.mla` (multi-head latent attention and its latent cache; its weights
  in :mod:`mha.mla_params`),
  :mod:`mha.paged_cache` (blocks and block tables) and :mod:`mha.quant_cache` (keys
  and values in 8, 4 or 2 bits);
* beside it, the PyTorch layers: :mod:`mha.modules` (``MultiHeadAttention``),
  :mod:`mha.kv_cache_torch`, :mod:`mha.positional_torch` (RoPE, ALiBi, T5's bias),
  :mod:`mha.rope_scaling_torch`, :mod:`mha.layers` (feed-forward, encoder and decoder
  layers), :mod:`mha.masks_torch` (the masks in torch), :mod:`mha.transformer`, and
  :mod:`mha.mla_torch`,
  :mod:`mha.paged_cache_torch`, :mod:`mha.quant_cache_torch`. They never import the
  specification's attention, so that the tests comparing the two compare independent
  code; the one import across is the models' sinusoidal table, data read from
  :mod:`mha.positional`;
* above both: :mod:`mha.convert` (weights between the specification, our modules and
  ``torch.nn``), :mod:`mha.gqa_pooling` (grouped-query attention by mean-pooling a
  trained module), :mod:`mha.draw` (figures from real arrays), :mod:`mha.exercises`
  (checkers for the learner's code), :mod:`mha.bench`, :mod:`mha.notebook`, and the
  tiny translator, :mod:`mha.translator`.

Every bad argument, whatever is wrong with it (type, dtype, shape or value), raises
``ValueError`` with a message naming the argument (see :mod:`mha._checks`).

``import mha`` loads nothing else: each name below is imported on first use.

Shape legend
------------
B   batch size
H   number of heads (``num_heads``)
T   target / query length
S   source / key length (``S == T`` for self-attention)
L   a length that may be T or S, in code that serves queries and keys alike
D   model width (``d_model``)
Dh  per-head width (``head_dim = D // H``; the paper's d_k, the articles' "query size")
V   vocabulary size (a number; in formulas the matrix V holds the values)

Mask convention: boolean, ``True`` = may attend (as in
``torch.nn.functional.scaled_dot_product_attention``); see :mod:`mha.masks` for
PyTorch's opposite boolean convention and additive float masks. A query row with
nothing to attend to (every key blocked, or no keys at all) gets zero weights and zero
context, never NaN; a NaN in the input propagates to the rows it reaches, as in PyTorch.
An additive float ``score_bias`` (ALiBi's distance penalty, :func:`mha.alibi_bias`)
is a separate argument, added to the scaled scores beside the mask: it never unblocks
a key.
"""

from __future__ import annotations

import importlib
from typing import Any

# Where each name of the specification lives: loaded on first use, so that importing
# a torch layer (which imports the package ``mha`` first) does not load the NumPy one.
_SPECIFICATION = {
    "mha.attention": [
        "AttentionSteps",
        "kv_head_index",
        "merge_heads",
        "multi_head_attention",
        "multi_head_attention_steps",
        "scaled_dot_product_attention",
        "softmax",
        "split_heads",
    ],
    "mha.params": ["AttentionParams"],
    "mha.kv_cache": ["KVCache"],
    "mha.masks": [
        "causal_mask",
        "combine_masks",
        "from_additive_mask",
        "from_torch_attn_mask",
        "from_torch_key_padding_mask",
        "padding_mask",
        "sliding_window_mask",
        "to_additive_mask",
        "to_torch_attn_mask",
        "to_torch_key_padding_mask",
    ],
    "mha.positional": [
        "alibi_bias",
        "alibi_slopes",
        "apply_rope",
        "rope_permutation",
        "sinusoidal_positional_encoding",
        "t5_relative_bias",
        "t5_relative_position_bucket",
    ],
    "mha.tiled": ["RowHistory", "TileStep", "TileTrace", "flash_attention", "peak_memory_bytes"],
    "mha.rope_scaling": [
        "ScaledRope",
        "rope_default",
        "rope_dynamic_ntk",
        "rope_linear",
        "rope_llama3",
        "rope_ntk",
        "rope_yarn",
        "yarn_mscale",
    ],
    "mha.backward": [
        "AttentionBackwardSteps",
        "attention_backward",
        "attention_backward_steps",
        "merge_heads_backward",
        "softmax_backward",
        "split_heads_backward",
    ],
    "mha.layer_backward": ["AttentionGradients", "multi_head_attention_backward"],
    "mha.tiled_backward": ["BackwardTileStep", "BackwardTileTrace", "flash_attention_backward"],
    "mha.attention_cost": ["attention_backward_bytes", "attention_backward_macs", "attention_macs"],
    "mha.cost": [
        "CACHE_TABLE_MODELS",
        "DEEPSEEK_V2",
        "DEEPSEEK_V3",
        "LLAMA_2_7B",
        "LLAMA_3_70B",
        "PUBLISHED_MODELS",
        "PublishedMLAModel",
        "PublishedModel",
        "cache_bytes_per_token",
        "cached_values_per_token",
        "decode_macs_with_cache",
        "decode_macs_without_cache",
        "kv_cache_bytes",
        "kv_values_per_token",
        "mla_values_per_token",
        "sequence_cache_bytes",
    ],
    "mha.mla": [
        "AbsorbedWeights",
        "MLAAbsorbedSteps",
        "MLACache",
        "MLASteps",
        "absorb",
        "mla_absorbed_steps",
        "mla_steps",
        "multi_head_latent_attention",
    ],
    "mha.mla_params": ["MLAParams", "ROPE_LAYOUTS", "mla_rope", "mla_softmax_scale", "rms_norm"],
    "mha.paged_cache": [
        "EMPTY",
        "MemoryWaste",
        "PagedKVCache",
        "PagedSequence",
        "memory_waste",
        "paged_attention",
    ],
    "mha.quant_cache": [
        "PER",
        "QuantizationError",
        "Quantized",
        "QuantizedHeads",
        "QuantizedKVCache",
        "dequantize",
        "quantization_error",
        "quantize",
        "relative_error",
    ],
}
_HOME = {name: module for module, names in _SPECIFICATION.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'mha' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

"""mha: multi-head attention, written to be read, and proven equal to PyTorch.

The NumPy functions re-exported here are the specification; the PyTorch modules
(``from mha.modules import MultiHeadAttention, ...``) and the drawings
(``from mha import draw``) are tested against them.

Shape legend
------------
B   batch size
H   number of heads (``num_heads``)
T   target / query length
S   source / key length (``S == T`` for self-attention)
D   model width (``d_model``)
Dh  per-head width (``head_dim = D // H``; the paper's d_k, the seeds' "query size")
V   vocabulary size

Mask convention: boolean, ``True`` = may attend (as in
``torch.nn.functional.scaled_dot_product_attention``); see :mod:`mha.masks` for
PyTorch's opposite boolean convention and additive float masks. A query row with
nothing to attend to (every key blocked, or no keys at all) gets zero weights and zero
context, never NaN; a NaN in the input propagates to the rows it reaches, as in PyTorch.
"""

from mha.functional import (
    AttentionParams,
    AttentionSteps,
    merge_heads,
    multi_head_attention,
    multi_head_attention_steps,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)
from mha.masks import (
    causal_mask,
    combine_masks,
    from_additive_mask,
    from_torch_attn_mask,
    from_torch_key_padding_mask,
    padding_mask,
    to_additive_mask,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)
from mha.positional import sinusoidal_positional_encoding

__all__ = [
    "AttentionParams",
    "AttentionSteps",
    "causal_mask",
    "combine_masks",
    "from_additive_mask",
    "from_torch_attn_mask",
    "from_torch_key_padding_mask",
    "merge_heads",
    "multi_head_attention",
    "multi_head_attention_steps",
    "padding_mask",
    "scaled_dot_product_attention",
    "sinusoidal_positional_encoding",
    "softmax",
    "split_heads",
    "to_additive_mask",
    "to_torch_attn_mask",
    "to_torch_key_padding_mask",
]

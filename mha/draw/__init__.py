"""Figures of the book, drawn by matplotlib from the very arrays a chapter computes.

Import as ``from mha import draw``. Every function returns a
:class:`matplotlib.figure.Figure`; chapters end the cell with ``plt.show()``.

- the idea, for one word: :func:`one_word_figure` (one query's weights over its
  sentence)
- colours: :data:`HEAD_COLORS`, :func:`head_color` (one colour per head, the same
  in every figure), :func:`alt_text` (a starting point for a figure's alt text)
- tensors: :func:`tensor_grid`, :func:`split_heads_figure`, :func:`merge_heads_figure`
- weights: :func:`weight_matrix_figure`, :func:`matmul_per_head_figure`
- one head step by step: :func:`attention_pipeline_figure`
- the whole layer, end to end: :func:`multi_head_attention_figure`
- masks: :func:`mask_figure`, :func:`masks_figure` (:class:`MaskPanel`),
  :func:`padding_mask_figure`
- weights as heatmaps: :func:`attention_heatmaps`, :func:`attention_grid`
- the model: :func:`transformer_figure`
- inference: :func:`kv_cache_figure`, :func:`grouped_heads_figure`
- compressed caches: :func:`absorbed_attention_figure` (multi-head latent
  attention's absorbed form, one head), :func:`paged_cache_figure` (a paged pool
  and its block tables)
- FlashAttention: :func:`tiles_figure` (which tiles :func:`mha.flash_attention`
  computed, in which order), :func:`online_softmax_figure` (one row's running max
  and sum, tile by tile)
- the backward pass: :func:`attention_backward_figure` (one head's forward with each
  gradient under its twin), :func:`tiled_backward_figure` (FlashAttention's backward,
  tile by tile)
- numbers and vectors: :func:`curves_figure` (:class:`CurvePanel`, :class:`Series`,
  :class:`RefLine`), :func:`vectors_figure`
- positions: :func:`rope_figure` (RoPE turning a query and a key),
  :func:`alibi_figure` (ALiBi's bias per head)
- length generalisation: :func:`length_curves_figure` (a measure against position per
  scheme, from ``python -m mha.translator.lm_lengths``'s results), :func:`length_curves`

Figures are at most 8 inches wide (the book's text width at 100 dpi), use no
font below 8 pt, and have a white background so they read in dark mode too.
Run :func:`mha.notebook.setup_figures` first for byte-identical SVG.
"""

from mha.draw.alibi import alibi_figure
from mha.draw.backward import attention_backward_figure, tiled_backward_figure
from mha.draw.compressed import absorbed_attention_figure, paged_cache_figure
from mha.draw.heatmaps import attention_grid, attention_heatmaps
from mha.draw.inference import grouped_heads_figure, kv_cache_figure
from mha.draw.lengths import length_curves, length_curves_figure
from mha.draw.mask_grids import MaskPanel, mask_figure, masks_figure, padding_mask_figure
from mha.draw.module import multi_head_attention_figure
from mha.draw.one_word import one_word_figure
from mha.draw.online_softmax import online_softmax_figure
from mha.draw.pipeline import attention_pipeline_figure
from mha.draw.plots import CurvePanel, RefLine, Series, curves_figure, vectors_figure
from mha.draw.rope import rope_figure
from mha.draw.style import HEAD_COLORS, alt_text, head_cmap, head_color, head_fill
from mha.draw.tensors import merge_heads_figure, split_heads_figure, tensor_grid
from mha.draw.tiles import tiles_figure
from mha.draw.transformer import ATTENTION_COLORS, transformer_figure
from mha.draw.weights import matmul_per_head_figure, weight_matrix_figure

__all__ = [
    "ATTENTION_COLORS",
    "CurvePanel",
    "HEAD_COLORS",
    "MaskPanel",
    "RefLine",
    "Series",
    "absorbed_attention_figure",
    "alibi_figure",
    "alt_text",
    "attention_backward_figure",
    "attention_grid",
    "attention_heatmaps",
    "attention_pipeline_figure",
    "curves_figure",
    "grouped_heads_figure",
    "head_cmap",
    "head_color",
    "head_fill",
    "kv_cache_figure",
    "length_curves",
    "length_curves_figure",
    "mask_figure",
    "masks_figure",
    "matmul_per_head_figure",
    "merge_heads_figure",
    "multi_head_attention_figure",
    "one_word_figure",
    "online_softmax_figure",
    "padding_mask_figure",
    "paged_cache_figure",
    "rope_figure",
    "split_heads_figure",
    "tensor_grid",
    "tiled_backward_figure",
    "tiles_figure",
    "transformer_figure",
    "vectors_figure",
    "weight_matrix_figure",
]

"""Attention at inference time: the KV cache growing, and query heads sharing key/value heads.

Both figures run the NumPy specification on the arrays they are given and draw
what it computed; each checks its own claim on those arrays before drawing
(the cached step equals the row of one causal pass; a query head reads exactly
the key/value head of its group).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from mha.attention import kv_head_index, multi_head_attention_steps
from mha.draw.layout import Caption, Grid, Op, compose
from mha.draw.style import (
    cell_texts,
    check_index,
    check_labels,
    check_ndim_one_of,
    head_cmap,
    head_fill,
    head_text_color,
    neutral_faces,
    set_alt_text,
    to_numpy,
)
from mha.kv_cache import KVCache
from mha.masks import causal_mask, sliding_window_mask
from mha.params import AttentionParams


def _rows_tinted(x: np.ndarray, h: int, new: Sequence[int], title: str, col_name: str,
                 labels: list[str] | None = None, row_name: str | None = None) -> Grid:
    """A (L, Dh) grid: rows in ``new`` in head ``h``'s tint, the others neutral."""
    face = neutral_faces(x.shape)
    face[list(new)] = head_fill(h)
    return Grid(face=face, title=title, title_color=head_text_color(h), col_name=col_name,
                row_labels=labels, row_name=row_name)


def _one_sequence(x: Any) -> np.ndarray:
    """``x`` as a ``(1, T, D)`` array: the figures draw one sequence."""
    x = to_numpy(x, "x")
    check_ndim_one_of(x, (3,), "x", "(1, T, D)")
    if x.shape[0] != 1:
        raise ValueError(f"x must hold one sequence, shape (1, T, D), got shape {x.shape}")
    return x


def kv_cache_figure(
    x: Any,
    params: AttentionParams,
    num_heads: int,
    *,
    head: int = 0,
    tokens: Sequence[str] | None = None,
    window: int | None = None,
    decimals: int = 2,
) -> Figure:
    """Decode ``x`` one position at a time through a :class:`mha.KVCache` and draw it.

    One row per step ``t``: the new query of head ``head`` (1, Dh), the cached keys as
    ``K^T`` (Dh, S) with the column appended at this step in the head's colour and the
    columns kept from earlier steps in grey, the weights of the new query over the
    cached keys (1, S, values written in), and the cached values they weigh into the
    new context row. Columns of the cache are labelled with the tokens they came from.
    With a ``window`` the cache rolls (``mha.KVCache(window=...)``): it never holds
    more than ``window`` positions, and each caption names the position it dropped.

    The figure checks its own claim before drawing: each step's weights and context
    equal row ``t`` of one pass over the whole sequence with the causal mask (or the
    sliding-window mask), to 1e-12.

    Parameters
    ----------
    x : array_like, shape (1, T, D)
        The sequence, fed through the cache one position at a time (self-attention).
    params : AttentionParams
        The layer's weights (grouped-query attention when ``W_k`` has fewer columns).
    num_heads : int
        H.
    head : int
        Which query head to draw; its key/value head is ``head // (H // Hkv)``.
    tokens : sequence of str, length T, optional
        Labels of the positions.
    window : int, optional
        Sliding-window attention: each position sees itself and the ``window - 1``
        before it, and the cache keeps only those.
    decimals : int
        Decimals of the weights written in the cells.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``x`` is not ``(1, T, D)``, ``head`` is out of range, ``tokens`` has the
        wrong length, or the arguments do not fit (as in
        :func:`mha.multi_head_attention`).
    """
    x = _one_sequence(x)
    t_len = x.shape[1]
    h = check_index(head, num_heads, "head", "H")
    kv = int(kv_head_index(num_heads, params.num_kv_heads(num_heads))[h])
    labels = check_labels(tokens, t_len, "tokens", "T") or [str(i) for i in range(t_len)]
    band = causal_mask(t_len) if window is None else sliding_window_mask(t_len, window)
    full = multi_head_attention_steps(x, x, x, params, num_heads, mask=band)

    cache = KVCache(window=window)
    rows: list = []
    for t in range(t_len):
        step = multi_head_attention_steps(x[:, t:t + 1], x[:, t:t + 1], x[:, t:t + 1],
                                          params, num_heads, cache=cache)
        first = t + 1 - cache.length  # the oldest position still cached
        # The picture's claim, checked on the arrays it shows.
        np.testing.assert_allclose(step.weights[0, :, 0], full.weights[0, :, t, first:t + 1],
                                   rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(step.context[0, :, 0], full.context[0, :, t],
                                   rtol=1e-12, atol=1e-12)
        k_cached = cache.k_heads[0, kv]  # (S, Dh), S = t + 1 - first
        v_cached = cache.v_heads[0, kv]
        dh = k_cached.shape[1]
        weights = step.weights[0, h]  # (1, S)
        kept = labels[first: t + 1]
        k_face = neutral_faces(k_cached.T.shape)  # K^T: (Dh, S), the new key a column
        k_face[:, -1] = head_fill(h)
        how = (" (→: scale by 1/sqrt(Dh), softmax; weights @ V is the new context row)"
               if t == 0 else "")
        dropped = f", '{labels[first - 1]}' dropped" if first > 0 else ""
        rows.append(Caption(f"step {t + 1}: '{labels[t]}' arrives; its key and value join "
                            f"the cache, which now holds {cache.length}{dropped}{how}"))
        rows.append([
            _rows_tinted(step.q_heads[0, h], h, [0], f"q, head {h}", f"Dh = {dh}"),
            Op("@"),
            Grid(face=k_face, title="cached K^T", title_color=head_text_color(h),
                 col_labels=kept),
            Op("→"),
            Grid(face=None, values=weights, cmap=head_cmap(h), norm=Normalize(0.0, 1.0),
                 text=cell_texts(weights, True, decimals), title="weights",
                 title_color=head_text_color(h)),
            Op("@"),
            _rows_tinted(v_cached, h, [len(kept) - 1], "cached V", f"Dh = {dh}"),
        ])
    fig, _ = compose(rows)
    size = "t" if window is None else f"at most {window}"
    return set_alt_text(
        fig,
        f"Decoding {t_len} positions with a KV cache, head {h}: at step t one query of "
        f"1 by {dh} meets a key cache of {size} columns (the newest coloured, the older "
        f"grey), giving one row of weights that reads a value cache of as many rows.",
    )


def grouped_heads_figure(
    x: Any,
    params: AttentionParams,
    num_heads: int,
    *,
    tokens: Sequence[str] | None = None,
) -> Figure:
    """Draw which key/value head each query head reads, coloured by the shared head.

    Three rows, from :func:`mha.multi_head_attention_steps` on ``x`` (self-attention):
    the ``Hkv`` key heads and value heads, each in its own colour; the ``H`` query
    heads, each in the colour of the key/value head it shares; and each query head's
    causal attention weights in that colour. ``Hkv == H`` is multi-head attention,
    ``Hkv == 1`` multi-query attention.

    The figure checks its claim before drawing: the weights of query head ``h`` equal
    ``softmax(q_h k_g^T / sqrt(Dh))`` with ``g = h // (H // Hkv)``.

    Parameters
    ----------
    x : array_like, shape (1, T, D)
    params : AttentionParams
        ``W_k`` and ``W_v`` with ``Hkv * Dh`` columns.
    num_heads : int
        H, a multiple of ``Hkv``.
    tokens : sequence of str, length T, optional

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``x`` is not ``(1, T, D)``, ``tokens`` has the wrong length, or the
        arguments do not fit.
    """
    x = _one_sequence(x)
    t_len = x.shape[1]
    labels = check_labels(tokens, t_len, "tokens", "T")
    num_kv = params.num_kv_heads(num_heads)
    group = num_heads // num_kv
    steps = multi_head_attention_steps(x, x, x, params, num_heads, mask=causal_mask(t_len))
    dh = steps.q_heads.shape[-1]
    # The claim, head h reads key head h // group, stated here again rather than taken
    # from mha.kv_head_index, so that the figure checks what the specification does.
    for h in range(num_heads):
        g = h // group
        scores = steps.q_heads[0, h] @ steps.k_heads[0, g].T / np.sqrt(dh)  # (T, T)
        scores = np.where(causal_mask(t_len), scores, -np.inf)
        w = np.exp(scores - scores.max(axis=-1, keepdims=True))
        np.testing.assert_allclose(steps.weights[0, h], w / w.sum(-1, keepdims=True),
                                   rtol=1e-12, atol=1e-12)

    def tinted(a: np.ndarray, g: int, title: str, first: bool) -> Grid:
        face = np.broadcast_to(np.array(head_fill(g)), (*a.shape, 4)).copy()
        return Grid(face=face, title=title, title_color=head_text_color(g),
                    col_name=f"Dh = {dh}", row_labels=labels if first else None,
                    row_name=f"T = {t_len}" if first else None)

    kind = ("multi-head" if num_kv == num_heads else
            "multi-query" if num_kv == 1 else "grouped-query")
    kv_row = [tinted(steps.k_heads[0, g], g, f"K_{g}", g == 0) for g in range(num_kv)]
    kv_row += [tinted(steps.v_heads[0, g], g, f"V_{g}", False) for g in range(num_kv)]
    q_row = [tinted(steps.q_heads[0, h], h // group, f"Q_{h} → K_{h // group}", h == 0)
             for h in range(num_heads)]
    w_row = [Grid(face=None, values=steps.weights[0, h], cmap=head_cmap(h // group),
                  norm=Normalize(0.0, 1.0), title=f"weights_{h}",
                  title_color=head_text_color(h // group), col_name=f"S = {t_len}",
                  row_labels=labels if h == 0 else None) for h in range(num_heads)]
    rows: list = [
        Caption(f"{kind} attention: {num_kv} key/value head{'s' if num_kv > 1 else ''} "
                f"(all a KV cache stores), each in its own colour"),
        kv_row,
        Caption(f"{num_heads} query heads; head h reads key/value head h // {group}, "
                "and is drawn in its colour"),
        q_row,
        Caption("each query head's causal weights: one head's queries, its group's keys"),
        w_row,
    ]
    fig, _ = compose(rows)
    return set_alt_text(
        fig,
        f"{kind.capitalize()} attention with {num_heads} query heads and {num_kv} "
        f"key/value heads of {t_len} by {dh}: query heads coloured like the key/value "
        f"head they read, {group} per colour, and their {t_len} by {t_len} weights.",
    )

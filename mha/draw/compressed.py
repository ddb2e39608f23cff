"""Compressed caches: multi-head latent attention's absorbed form, and a paged pool.

Both figures draw the arrays :mod:`mha.mla` and :mod:`mha.paged_cache` hold or compute,
and check their own claim on those arrays before drawing (the absorbed form's scores
and output share equal the plain form's; every slot of the pool belongs to the
sequence whose block table names its block).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from mha.draw.layout import Caption, Grid, Op, compose
from mha.draw.style import (
    ALLOWED_FILL,
    cell_texts,
    check_index,
    check_labels,
    head_fill,
    head_text_color,
    neutral_faces,
    set_alt_text,
    tint,
    to_numpy,
)
from mha.mla import absorb, mla_absorbed_steps, mla_steps
from mha.mla_params import MLAParams
from mha.paged_cache import EMPTY, PagedKVCache


def _grid(x: np.ndarray, title: str, decimals: int, *, h: int | None = None,
          rows: list[str] | None = None, cols: list[str] | None = None) -> Grid:
    """A grid of ``x`` with its values written in, tinted in head ``h``'s colour."""
    face = neutral_faces(x.shape) if h is None else np.broadcast_to(
        np.array(head_fill(h)), (*x.shape, 4)).copy()
    return Grid(face=face, text=cell_texts(x, True, decimals), title=title,
                title_color="black" if h is None else head_text_color(h),
                row_labels=rows, col_labels=cols)


def _count(n: int, noun: str) -> str:
    """``"1 block"``, ``"2 blocks"``: ``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def absorbed_attention_figure(
    x: Any,
    params: MLAParams,
    *,
    head: int = 0,
    tokens: Sequence[str] | None = None,
    decimals: int = 1,
) -> Figure:
    """The absorption of multi-head latent attention, drawn for one head.

    Runs :func:`mha.mla_steps` (plain) and :func:`mha.mla_absorbed_steps` (absorbed)
    on ``x`` with the causal mask and draws, for head ``head``, three rows:

    1. plain: ``latent @ W_uk_h = k_nope_h`` and ``q_nope_h @ k_nope_h^T``, the
       position-free scores;
    2. absorbed: ``q_in @ (W_uq_h W_uk_h^T) = q_absorbed_h`` and
       ``q_absorbed_h @ latent^T``, the same scores without any per-head key;
    3. the value side: ``weights_h @ latent``, the head's context in the latent's
       space, times ``W_uv_h W_o_h``: the head's share of the output.

    Per-head matrices are tinted in the head's colour, the cached latent is grey.
    The figure checks before drawing that both score matrices are equal and that the
    share equals ``context_h @ W_o_h`` of the plain form, to 1e-12.

    Parameters
    ----------
    x : array_like, shape (1, T, D)
    params : MLAParams
    head : int
    tokens : sequence of str, length T, optional
    decimals : int
        Decimals of the values written in the cells.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``x`` is not ``(1, T, D)``, ``head`` is out of range or ``tokens`` has the
        wrong length (and as :func:`mha.mla_steps` for the rest).
    """
    x = to_numpy(x, "x")
    if x.ndim != 3 or x.shape[0] != 1:
        raise ValueError(f"x must hold one sequence, shape (1, T, D), got shape {x.shape}")
    h = check_index(head, params.num_heads, "head", "H")
    labels = check_labels(tokens, x.shape[1], "tokens", "T") or [
        str(i) for i in range(x.shape[1])]
    plain, fast = mla_steps(x, params), mla_absorbed_steps(x, params)
    folded = absorb(params)
    dn, dv = params.qk_nope_head_dim, params.v_head_dim
    q_in = x[0] if plain.q_latent is None else plain.q_latent[0]  # (T, Rq or D)
    latent = plain.latent[0]  # (S, Rkv)
    w_uk = params.W_uk[:, h * dn:(h + 1) * dn]  # (Rkv, Dn)
    nope_scores = plain.q_nope[0, h] @ plain.k_nope[0, h].T  # (T, S)
    absorbed_scores = fast.q_absorbed[0, h] @ latent.T  # (T, Rkv) @ (Rkv, S) -> (T, S)
    share = fast.context_latent[0, h] @ folded.W_uv_o[h]  # (T, Rkv) @ (Rkv, D) -> (T, D)
    # The picture's claims, checked on the arrays it shows.
    np.testing.assert_allclose(absorbed_scores, nope_scores, rtol=1e-12, atol=1e-12)
    w_o_h = params.W_o[h * dv:(h + 1) * dv]  # (Dv, D)
    np.testing.assert_allclose(share, plain.context[0, h] @ w_o_h, rtol=1e-12, atol=1e-12)

    rkv = latent.shape[1]
    q_name = "q latent" if plain.q_latent is not None else "x"
    rows: list = [
        Caption(f"plain: head {h} rebuilds its keys from the cached latent ..."),
        [_grid(latent, "cached latent", decimals, rows=labels),
         Op("@"), _grid(w_uk, f"W_uk, head {h}", decimals, h=h),
         Op("="), _grid(plain.k_nope[0, h], f"k_nope, head {h}", decimals, h=h)],
        Caption("... and scores them (the position-free part of the scores)"),
        [_grid(plain.q_nope[0, h], f"q_nope, head {h}", decimals, h=h, rows=labels),
         Op("@"), _grid(plain.k_nope[0, h].T, "k_nope^T", decimals, h=h, cols=labels),
         Op("="), _grid(nope_scores, "scores", decimals, h=h, cols=labels)],
        Caption(f"absorbed: W_uk folded into the query, which becomes {rkv} wide ..."),
        [_grid(q_in, q_name, decimals, rows=labels),
         Op("@"), _grid(folded.W_uq_uk[h], f"W_uq W_uk^T, head {h}", decimals, h=h),
         Op("="), _grid(fast.q_absorbed[0, h], "q absorbed", decimals, h=h)],
        Caption("... and scored against the cached latent itself: the same scores"),
        [_grid(fast.q_absorbed[0, h], "q absorbed", decimals, h=h, rows=labels),
         Op("@"), _grid(latent.T, "latent^T", decimals, cols=labels),
         Op("="), _grid(absorbed_scores, "the same scores", decimals, h=h,
                        cols=labels)],
        Caption("values: the weights average the latents ..."),
        [_grid(fast.weights[0, h], f"weights, head {h}", 2, h=h, rows=labels,
               cols=labels),
         Op("@"), _grid(latent, "latent", decimals),
         Op("="), _grid(fast.context_latent[0, h], "context (latent)", decimals, h=h)],
        Caption("... and W_uv folded into W_o takes them to the head's share of the output"),
        [_grid(fast.context_latent[0, h], "context (latent)", decimals, h=h,
               rows=labels),
         Op("@"), _grid(folded.W_uv_o[h], f"W_uv W_o, head {h}", decimals, h=h),
         Op("="), _grid(share, f"head {h}'s share", decimals, h=h)],
    ]
    fig, _ = compose(rows)
    t_len, d_model = x.shape[1], x.shape[2]
    return set_alt_text(
        fig,
        f"Head {h} of multi-head latent attention on {t_len} tokens, three rows: the plain "
        f"form builds {t_len} by {dn} keys from the {t_len} by {rkv} cached latent and "
        f"scores them; the absorbed form turns the query into {rkv} numbers and scores "
        f"the latent directly, giving the same {t_len} by {t_len} scores; the weights "
        f"average the latents and one {rkv} by {d_model} matrix gives the head's share "
        "of the output.",
    )


def paged_cache_figure(
    cache: PagedKVCache, *, names: dict[int, str] | None = None
) -> Figure:
    """The pool of a :class:`mha.paged_cache.PagedKVCache` and its block tables.

    Left, :meth:`PagedKVCache.occupancy`: one row per block, one cell per slot, each
    slot coloured by the sequence whose position it holds and labelled with that
    position; free slots white (a free block, or the unused end of a last block).
    Right, each sequence's block table: the ids of its blocks, in order of position.
    The figure checks before drawing that slot ``(table[p // block_size],
    p % block_size)`` holds position ``p`` of its sequence, for every position.

    Parameters
    ----------
    cache : PagedKVCache
    names : dict of int to str, optional
        A label for each sequence id (default ``"seq <id>"``).

    Returns
    -------
    matplotlib.figure.Figure
    """
    if not isinstance(cache, PagedKVCache):
        raise ValueError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    owner = cache.occupancy()  # (num_blocks, block_size)
    position = np.full(owner.shape, -1)
    seq_ids = sorted(cache.block_tables)
    for s in seq_ids:
        block, offset = cache.slots(s).T
        position[block, offset] = np.arange(cache.lengths[s])
        # The picture's claim: position p lives in block table[p // bs], slot p % bs.
        table = np.asarray(cache.block_tables[s])
        p = np.arange(cache.lengths[s])
        assert np.array_equal(block, table[p // cache.block_size])
        assert np.array_equal(offset, p % cache.block_size)
        assert np.all(owner[block, offset] == s)
    names = {s: (names or {}).get(s, f"seq {s}") for s in seq_ids}
    colour = {s: head_fill(i) for i, s in enumerate(seq_ids)}
    face = np.empty((*owner.shape, 4))
    face[owner == EMPTY] = tint(ALLOWED_FILL, 1.0)
    for s in seq_ids:
        face[owner == s] = colour[s]
    text = np.where(position >= 0, position.astype(str), "").astype(object)
    pool = Grid(face=face, text=text, title="pool: position held by each slot",
                row_labels=[f"block {b}" for b in range(cache.num_blocks)],
                col_name=f"slot (block_size = {cache.block_size})")
    tables = []
    for i, s in enumerate(seq_ids):
        ids = np.asarray(cache.block_tables[s])[None]  # (1, n_blocks)
        tables.append(Grid(
            face=np.broadcast_to(np.array(colour[s]), (*ids.shape, 4)).copy(),
            text=ids.astype(str).astype(object),
            title=f"{names[s]}: {_count(cache.lengths[s], 'position')}",
            title_color=head_text_color(i)))
    free = cache.num_free_blocks
    rows: list = [Caption(f"{_count(len(seq_ids), 'sequence')} in "
                          f"{_count(cache.num_blocks, 'block')}, {free} free"), [pool]]
    rows.append(Caption("block tables: block ids in order of position"))
    rows.extend([t] for t in tables)
    fig, _ = compose(rows)
    return set_alt_text(
        fig,
        f"A pool of {_count(cache.num_blocks, 'block')} of "
        f"{_count(cache.block_size, 'slot')}, each slot coloured by the sequence whose "
        f"position it holds ({_count(len(seq_ids), 'sequence')}, "
        f"{_count(free, 'block')} free), and below it each sequence's block table.",
    )

"""mha.draw.absorbed_attention_figure and paged_cache_figure: what is drawn is the cache.

Oracles: the absorbed figure's rows are recomputed here from the weights, one head's
columns sliced by hand and each product written out (``W_uq_h W_uk_h^T``,
``W_uv_h W_o_h``); its written values are compared through :func:`fmt_clear`. The pool's
layout is worked out by hand for a pool whose freed block is reused, and checked
against the rule ``table[p // block_size], p % block_size`` for the rest.
"""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import numpy as np
import pytest
from figures import (
    assert_house_style,
    assert_inside_the_canvas,
    assert_reproducible,
    cells,
    faces,
    fig_texts,
    gid_texts,
    grid_axes,
)
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba

import mha
from mha import draw
from mha.draw import compressed
from mha.draw.compressed import absorbed_attention_figure, paged_cache_figure
from mha.draw.style import ALLOWED_FILL, NEUTRAL_FILL, head_text_color
from mha.notebook import setup_figures

TOKENS = ["<s>", "a", "b", "c"]


@pytest.fixture(autouse=True)
def _figures():
    setup_figures()
    yield
    plt.close("all")


def texts(ax: Axes) -> list[str]:
    """The values written in the cells, row-major."""
    return gid_texts(ax, "value")


def fmt(a: np.ndarray, decimals: int) -> list[str]:
    """What a cell shows for each value of ``a``: rounded, never ``-0.0``."""
    return [f"{np.round(v, decimals) + 0.0:.{decimals}f}" for v in np.ravel(a)]


def fmt_clear(a: np.ndarray, decimals: int, apart: float = 1e-12) -> list[str]:
    """:func:`fmt` of values computed here on another path than the figure's, the two at
    most ``apart`` from each other: asserts first that no value lies that close to a
    rounding tie, so that the texts agree on any CPU."""
    scaled = np.abs(np.ravel(a)) * 10.0**decimals
    tie = float(np.abs(scaled - np.floor(scaled) - 0.5).min()) / 10.0**decimals
    assert tie > apart, f"a value lies {tie:.2g} from a rounding tie (<= {apart:.2g})"
    return fmt(a, decimals)


def fills(ax: Axes) -> np.ndarray:
    """RGBA fill of every cell of the grid in ``ax``, (cells, 4)."""
    return np.asarray(cells(ax).get_facecolors())


def ticks(labels) -> list[str]:
    return [t.get_text() for t in labels]


def mla(q_lora_rank: int | None = 5, seed: int = 0) -> tuple[np.ndarray, mha.MLAParams]:
    """The chapter's toy layer: D = 6, H = 2, Rkv = 4, Dn = Dr = 2, Dv = 3; x (1, 4, 6)."""
    params = mha.MLAParams.init(6, 2, kv_lora_rank=4, q_lora_rank=q_lora_rank,
                                qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=3,
                                seed=seed)
    return np.random.default_rng(seed + 10).normal(size=(1, 4, 6)), params


# ------------------------------------------------------------------- absorbed attention


TITLES = [
    "cached latent", "W_uk, head {h}", "k_nope, head {h}",
    "q_nope, head {h}", "k_nope^T", "scores",
    "{q}", "W_uq W_uk^T, head {h}", "q absorbed",
    "q absorbed", "latent^T", "the same scores",
    "weights, head {h}", "latent", "context (latent)",
    "context (latent)", "W_uv W_o, head {h}", "head {h}'s share",
]


def test_absorbed_attention_figure_draws_each_row_from_the_weights():
    x, params = mla()
    head, d = 1, 2  # decimals
    fig = draw.absorbed_attention_figure(x, params, head=head, tokens=TOKENS, decimals=d)
    axes = grid_axes(fig)
    assert [ax.get_title() for ax in axes] == [t.format(h=1, q="q latent") for t in TITLES]
    plain = mha.mla_steps(x, params)
    cols = slice(2 * head, 2 * head + 2)  # head h's Dn = 2 columns of W_uq, W_uk
    w_uq, w_uk = params.W_uq[:, cols], params.W_uk[:, cols]  # (Rq, Dn), (Rkv, Dn)
    w_uv, w_o = params.W_uv[:, 3 * head:3 * head + 3], params.W_o[3 * head:3 * head + 3]
    latent = plain.latent[0]  # (T, Rkv)
    q_in = plain.q_latent[0]  # (T, Rq)
    q_nope = q_in @ w_uq  # (T, Dn)
    folded = w_uq @ w_uk.T  # (Rq, Rkv)
    k_nope = latent @ w_uk  # (T, Dn)
    nope_scores = q_nope @ k_nope.T  # (T, T)
    context_latent = plain.weights[0, head] @ latent  # (T, Rkv)
    w_uv_o = w_uv @ w_o  # (Rkv, D)
    share = plain.context[0, head] @ w_o  # (T, D): the plain form's share
    # Exact: copies of the arrays the figure is given or mla_steps returns.
    for i in (0, 13):
        assert texts(axes[i]) == fmt(latent, d)
    assert texts(axes[10]) == fmt(latent.T, d)
    assert texts(axes[1]) == fmt(w_uk, d)
    assert texts(axes[6]) == fmt(q_in, d)
    # Products taken here by hand, each within 1e-12 of the figure's own.
    expected = {2: k_nope, 3: q_nope, 4: k_nope.T, 5: nope_scores, 7: folded,
                8: q_in @ folded, 9: q_in @ folded, 11: nope_scores,
                14: context_latent, 15: context_latent, 16: w_uv_o, 17: share}
    for i, want in expected.items():
        assert texts(axes[i]) == fmt_clear(want, d), axes[i].get_title()
    assert texts(axes[12]) == fmt_clear(plain.weights[0, head], 2)  # always 2 decimals
    # The point of the figure: the absorbed scores read as the plain ones.
    assert texts(axes[11]) == texts(axes[5])
    # Per-head matrices in the head's colour (the title in the head's text colour), the
    # cached latent and the layer's input grey (the title black).
    grey = {0, 6, 10, 13}
    for i, ax in enumerate(axes):
        fill = to_rgba(NEUTRAL_FILL) if i in grey else draw.head_fill(head)
        title = to_rgba("black") if i in grey else head_text_color(head)
        assert np.allclose(fills(ax), fill), ax.get_title()
        assert to_rgba(ax.title.get_color()) == title, ax.get_title()
    # Token labels on the rows of each row's first grid and the columns of S-long grids.
    assert [ticks(axes[i].get_yticklabels()) for i in (0, 3, 6, 9, 12, 15)] == [TOKENS] * 6
    assert [ticks(axes[i].get_xticklabels()) for i in (4, 5, 10, 11, 12)] == [TOKENS] * 5
    assert "becomes 4 wide" in " ".join(fig_texts(fig))
    alt = draw.alt_text(fig)
    assert f"Head {head} of multi-head latent attention on 4 tokens" in alt
    assert "builds 4 by 2 keys from the 4 by 4 cached latent" in alt
    assert "one 4 by 6 matrix" in alt


def small() -> tuple[np.ndarray, mha.MLAParams]:
    """One head, D = 3, Rkv = 2, Dn = Dv = 1, no query latent, 2 tokens: few texts."""
    params = mha.MLAParams.init(3, 1, kv_lora_rank=2, qk_nope_head_dim=1,
                                qk_rope_head_dim=2, v_head_dim=1, seed=2)
    return np.random.default_rng(2).normal(size=(1, 2, 3)), params


def test_absorbed_attention_figure_without_a_query_latent_folds_into_x_by_default():
    """No query latent (DeepSeek-V2-Lite): W_uq W_uk^T is (D, Rkv) and applies to x.
    Defaults: head 0, positions as labels, one decimal."""
    x, params = small()
    axes = grid_axes(draw.absorbed_attention_figure(x, params))
    assert [ax.get_title() for ax in axes] == [t.format(h=0, q="x") for t in TITLES]
    assert ticks(axes[0].get_yticklabels()) == ["0", "1"]
    assert texts(axes[6]) == fmt(x[0], 1)
    assert texts(axes[7]) == fmt_clear(params.W_uq @ params.W_uk.T, 1)  # (3, 1) @ (1, 2)


@pytest.mark.parametrize(
    ("x", "kwargs", "message"),
    [
        (np.zeros((2, 4, 6)), {}, r"x must hold one sequence, shape \(1, T, D\), got shape \(2"),
        (np.zeros((4, 6)), {}, r"got shape \(4, 6\)"),
        (np.zeros((1, 4, 6)), {"head": 2}, r"head must be an int in \[0, 2\) for axis H"),
        (np.zeros((1, 4, 6)), {"head": True}, "head must be an int"),
        (np.zeros((1, 4, 6)), {"tokens": ["a", "b"]}, "tokens has 2 labels but axis T has size 4"),
        (np.zeros((1, 4, 6)), {"tokens": "abcd"}, "tokens must be a sequence of strings"),
        (np.zeros((1, 4, 5)), {}, "params.d_model is 6"),
    ],
)
def test_absorbed_attention_figure_rejects_bad_input(x, kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw.absorbed_attention_figure(x, mla()[1], **kwargs)


@pytest.mark.parametrize("field", ["q_absorbed", "context_latent"])
def test_absorbed_attention_figure_checks_its_claim_on_the_arrays_it_draws(
        monkeypatch, field):
    # An absorbed form off by 1e-9 (in its scores, or in its share of the output) must
    # not be drawn as equal to the plain form.
    def slightly_off(*args, **kwargs):
        steps = mha.mla_absorbed_steps(*args, **kwargs)
        return dataclasses.replace(steps, **{field: getattr(steps, field) * (1 + 1e-9)})

    monkeypatch.setattr(compressed, "mla_absorbed_steps", slightly_off)
    with pytest.raises(AssertionError):
        draw.absorbed_attention_figure(*mla(), head=1)


# ------------------------------------------------------------------------ paged pool


def pool_with_a_freed_block() -> mha.PagedKVCache:
    """6 blocks of 3 slots. Sequence 4 (4 positions) takes blocks 0, 1; sequence 7
    (2) block 2; sequence 2 (5) blocks 3, 4. Sequence 7 finishes; sequence 9 (1
    position) takes the lowest free block, 2 again. Block 5 stays free."""
    rng = np.random.default_rng(3)
    pool = mha.PagedKVCache(num_blocks=6, block_size=3, num_kv_heads=2, head_dim=2)
    for seq_id, length in ((4, 4), (7, 2), (2, 5)):
        pool.append(seq_id, *rng.normal(size=(2, 2, length, 2)))  # (Hkv, S, Dh) each
    pool.free(7)
    pool.append(9, *rng.normal(size=(2, 2, 1, 2)))
    return pool


def test_paged_cache_figure_draws_the_pool_worked_out_by_hand():
    fig = draw.paged_cache_figure(pool_with_a_freed_block(), names={4: "alpha", 8: "unused"})
    pool_ax, *table_axes = grid_axes(fig)
    assert pool_ax.get_title() == "pool: position held by each slot"
    assert ticks(pool_ax.get_yticklabels()) == [f"block {b}" for b in range(6)]
    assert pool_ax.get_xlabel() == "slot (block_size = 3)"
    # Position held by each slot, "." where free; owners listed by sequence id: 2, 4, 9.
    held = ["0 1 2", "3 . .", "0 . .", "0 1 2", "3 4 .", ". . ."]
    owner = ["4 4 4", "4 . .", "9 . .", "2 2 2", "2 2 .", ". . ."]
    assert texts(pool_ax) == [p for row in held for p in row.split() if p != "."]
    fill = {"2": draw.head_fill(0), "4": draw.head_fill(1), "9": draw.head_fill(2),
            ".": to_rgba(ALLOWED_FILL)}
    fc = faces(pool_ax, (6, 3))
    for b, row in enumerate(owner):
        for slot, s in enumerate(row.split()):
            assert np.allclose(fc[b, slot], fill[s]), (b, slot, s)
    # Block tables in order of sequence id, each in its sequence's colour.
    assert [ax.get_title() for ax in table_axes] == [
        "seq 2: 5 positions", "alpha: 4 positions", "seq 9: 1 position"]
    assert [texts(ax) for ax in table_axes] == [["3", "4"], ["0", "1"], ["2"]]
    for i, (ax, s) in enumerate(zip(table_axes, "249", strict=True)):
        assert np.allclose(faces(ax, (1, len(texts(ax)))), fill[s])
        assert to_rgba(ax.title.get_color()) == head_text_color(i)
    assert fig_texts(fig) == ["3 sequences in 6 blocks, 1 free",
                              "block tables: block ids in order of position"]
    assert draw.alt_text(fig) == (
        "A pool of 6 blocks of 3 slots, each slot coloured by the sequence whose position "
        "it holds (3 sequences, 1 block free), and below it each sequence's block table.")


def test_paged_cache_figure_counts_one_of_a_kind_in_the_singular():
    pool = mha.PagedKVCache(num_blocks=2, block_size=1, num_kv_heads=1, head_dim=1)
    pool.append(0, np.ones((1, 1, 1)), np.ones((1, 1, 1)))
    fig = draw.paged_cache_figure(pool)
    assert [ax.get_title() for ax in grid_axes(fig)][1:] == ["seq 0: 1 position"]
    assert fig_texts(fig)[0] == "1 sequence in 2 blocks, 1 free"
    assert draw.alt_text(fig).startswith("A pool of 2 blocks of 1 slot, ")
    assert "(1 sequence, 1 block free)" in draw.alt_text(fig)


def test_paged_cache_figure_follows_the_block_tables_of_a_larger_pool():
    """Random lengths, frees and appends: slot (table[p // 4], p % 4) reads p."""
    rng = np.random.default_rng(5)
    pool = mha.PagedKVCache(num_blocks=12, block_size=4, num_kv_heads=1, head_dim=1)
    for seq_id, length in enumerate(rng.integers(1, 9, size=5)):
        pool.append(seq_id, *np.zeros((2, 1, int(length), 1)))
    pool.free(1), pool.free(3)
    pool.append(0, *np.zeros((2, 1, 3, 1)))  # grows into a freed block
    pool.append(6, *np.zeros((2, 1, 6, 1)))
    want = np.full((12, 4), "", dtype=object)
    for s, table in pool.block_tables.items():
        for p in range(pool.lengths[s]):
            want[table[p // 4], p % 4] = str(p)
    fig = draw.paged_cache_figure(pool)
    pool_ax, *table_axes = grid_axes(fig)
    assert texts(pool_ax) == [t for t in want.ravel() if t]
    free = faces(pool_ax, (12, 4))[want == ""]
    assert np.allclose(free, to_rgba(ALLOWED_FILL))
    assert [texts(ax) for ax in table_axes] == [
        [str(b) for b in pool.block_tables[s]] for s in sorted(pool.block_tables)]
    assert f"4 sequences in 12 blocks, {pool.num_free_blocks} free" in fig_texts(fig)


def test_paged_cache_figure_checks_its_claim_on_the_arrays_it_draws(monkeypatch):
    # A pool that files each block's positions back to front must not be drawn.
    slots = mha.PagedKVCache.slots

    def back_to_front(self, seq_id):
        block, offset = slots(self, seq_id).T
        return np.stack([block, self.block_size - 1 - offset], 1)

    monkeypatch.setattr(mha.PagedKVCache, "slots", back_to_front)
    with pytest.raises(AssertionError):
        draw.paged_cache_figure(pool_with_a_freed_block())


def test_paged_cache_figure_rejects_what_is_not_a_paged_cache():
    with pytest.raises(ValueError, match="cache must be a PagedKVCache, got KVCache"):
        draw.paged_cache_figure(mha.KVCache())


# ------------------------------------------------------------------------ house style


BUILDERS = {
    # small: rendering text as paths is the slow part
    "absorbed": lambda: draw.absorbed_attention_figure(*small()),
    "paged": lambda: draw.paged_cache_figure(pool_with_a_freed_block()),
}
WIDEST = {
    # the chapter's sizes (D = 6, Rq = 5, Rkv = 4; the width does not grow with T),
    # on 2 tokens, not 5
    "absorbed": lambda: draw.absorbed_attention_figure(
        np.random.default_rng(1).normal(size=(1, 2, 6)),
        mha.MLAParams.init(6, 2, kv_lora_rank=4, q_lora_rank=5, qk_nope_head_dim=2,
                           qk_rope_head_dim=2, v_head_dim=2), head=1),
    "paged": BUILDERS["paged"],
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_same_inputs_give_byte_identical_svg(name):
    assert_reproducible(BUILDERS[name])


@pytest.mark.parametrize("name", list(WIDEST))
def test_figures_fit_the_text_width_with_readable_fonts(name):
    fig = WIDEST[name]()
    assert_house_style(fig)  # at most the text width, fonts of 8 pt or more, alt text
    assert_inside_the_canvas(fig)  # so the tight box the book shows fits too


def test_exported_from_mha_draw():
    assert draw.absorbed_attention_figure is absorbed_attention_figure
    assert draw.paged_cache_figure is paged_cache_figure
    assert {"absorbed_attention_figure", "paged_cache_figure"} <= set(draw.__all__)

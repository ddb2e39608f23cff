"""mha.draw.tiles_figure and mha.draw.online_softmax_figure: what is drawn is the trace.

The tile geometry is checked against counts worked out by hand (a causal square of
4 x 4 tiles computes 1 + 2 + 3 + 4 of them); the lines, bars and texts of the online
softmax against a TileTrace recorded here and against the softmax of the whole row.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from figures import rendered, svg
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.text import Text

import mha
from mha import draw
from mha.draw import tiled
from mha.draw.style import BLOCKED_FILL, MAX_WIDTH
from mha.notebook import setup_figures


@pytest.fixture(autouse=True)
def _figures():
    setup_figures()
    yield
    plt.close("all")


def qkv(T: int = 8, S: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(T, 4)), rng.normal(size=(S, 4)), rng.normal(size=(S, 3))


def grid_axes(fig: Figure) -> list[Axes]:
    return [ax for ax in fig.axes if any(c.get_gid() == "cells" for c in ax.collections)]


def faces(ax: Axes, shape: tuple[int, int]) -> np.ndarray:
    (cells,) = [c for c in ax.collections if c.get_gid() == "cells"]
    return np.asarray(cells.get_facecolors()).reshape(*shape, 4)


def tiles(ax: Axes) -> list[tuple[int, int, int, int]]:
    """(q0, q1, k0, k1) of every outlined tile."""
    return [(round(p.get_y()), round(p.get_y() + p.get_height()), round(p.get_x()),
             round(p.get_x() + p.get_width())) for p in ax.patches if p.get_gid() == "tile"]


def order_labels(ax: Axes) -> list[tuple[str, tuple[float, float]]]:
    return [(t.get_text(), t.get_position()) for t in ax.texts if t.get_gid() == "tile_order"]


def fig_texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.texts]


def fmt(x: float) -> str:
    return f"{np.round(x, 2) + 0.0:.2f}"



# --------------------------------------------------------------------------- tiles


def test_tiles_figure_colours_and_numbers_every_tile_of_a_causal_square():
    q, k, v = qkv()
    fig = draw.tiles_figure(q, k, v, block_size=2)
    plain, causal = grid_axes(fig)
    assert (plain.get_title(), causal.get_title()) == ("causal=False", "causal=True")
    blocks = [(2 * i, 2 * i + 2, 2 * j, 2 * j + 2) for i in range(4) for j in range(4)]
    assert tiles(plain) == tiles(causal) == blocks  # processing order: row by row
    # Without causal masking every pair is computed and allowed.
    np.testing.assert_allclose(faces(plain, (8, 8)),
                               np.broadcast_to(to_rgba(tiled.COMPUTED_FILL), (8, 8, 4)))
    centre = {(i, j): (2 * j + 1.0, 2 * i + 1.0) for i in range(4) for j in range(4)}
    assert order_labels(plain) == [(str(n + 1), centre[divmod(n, 4)]) for n in range(16)]
    # Causal: tile (i, j) is skipped iff j > i; diagonal tiles hold blocked pairs s > t.
    fc = faces(causal, (8, 8))
    for t in range(8):
        for s in range(8):
            i, j = t // 2, s // 2
            expected = (tiled.SKIPPED_FILL if j > i else BLOCKED_FILL if s > t
                        else tiled.PARTIAL_FILL if i == j else tiled.COMPUTED_FILL)
            np.testing.assert_allclose(fc[t, s], to_rgba(expected), err_msg=f"pair {t}, {s}")
    lower = [(i, j) for i in range(4) for j in range(i + 1)]
    assert order_labels(causal) == [(str(n + 1), centre[ij]) for n, ij in enumerate(lower)]
    # 1 + 2 + 3 + 4 = 10 computed, 4 of them on the diagonal; 6 skipped.
    assert "causal=False: 16 of 16 tiles computed (0 with blocked pairs), 0 skipped" in (
        fig_texts(fig))
    assert "causal=True: 10 of 16 tiles computed (4 with blocked pairs), 6 skipped" in (
        fig_texts(fig))
    assert "T = 8 queries, S = 8 keys, block_size = 2" in fig_texts(fig)[0]
    assert "10 computed and 6 skipped" in draw.alt_text(fig)


def test_tiles_figure_follows_the_trace_with_ragged_tiles_and_a_padding_mask():
    # T = 6 queries are the last 6 of S = 8 positions; keys 6, 7 are padding.
    q, k, v = qkv(T=6, S=8)
    pad = mha.padding_mask(np.array([6]), max_len=8)[0, 0]  # (1, S)
    fig = draw.tiles_figure(q, k, v, pad, block_size=3)
    allowed = {False: np.broadcast_to(pad, (6, 8)),
               True: pad & mha.causal_mask(6, num_keys=8)}
    for ax, causal in zip(grid_axes(fig), (False, True), strict=True):
        trace = mha.TileTrace()
        mha.flash_attention(q, k, v, pad, block_size=3, causal=causal, trace=trace)
        assert tiles(ax) == [(*s.queries, *s.keys) for s in trace.steps]
        fc = faces(ax, (6, 8))
        order = 0
        for step in trace.steps:
            (q0, q1), (k0, k1) = step.queries, step.keys
            block = allowed[causal][q0:q1, k0:k1]
            if step.skipped:
                np.testing.assert_allclose(fc[q0:q1, k0:k1], np.broadcast_to(
                    to_rgba(tiled.SKIPPED_FILL), (*block.shape, 4)))
                continue
            order += 1
            fill = tiled.COMPUTED_FILL if block.all() else tiled.PARTIAL_FILL
            np.testing.assert_allclose(fc[q0:q1, k0:k1][block], np.broadcast_to(
                to_rgba(fill), (int(block.sum()), 4)))
            np.testing.assert_allclose(fc[q0:q1, k0:k1][~block], np.broadcast_to(
                to_rgba(BLOCKED_FILL), (int((~block).sum()), 4)))
            assert (str(order), ((k0 + k1) / 2, (q0 + q1) / 2)) in order_labels(ax)
        assert len(order_labels(ax)) == order == trace.num_computed
    # Query block 0 (rows 0-2, positions 2-4) needs keys up to 4: key block 2 (6-7) is
    # skipped. The padded keys 6-7 of query block 1 are blocked but still computed:
    # a mask never skips a tile, only the causal diagonal does.
    assert "causal=True: 5 of 6 tiles computed (2 with blocked pairs), 1 skipped" in (
        fig_texts(fig))
    assert "causal=False: 6 of 6 tiles computed (2 with blocked pairs), 0 skipped" in (
        fig_texts(fig))


def test_tiles_figure_legend_names_only_what_is_drawn():
    q, k, v = qkv()
    entries = ("computed", "computed, with blocked pairs", "blocked pair: score set to -inf",
               "skipped: never computed")
    everything = fig_texts(draw.tiles_figure(q, k, v, block_size=2))
    assert all(e in everything for e in entries)
    # One query and one key per tile: a tile is never part blocked.
    one_pair = fig_texts(draw.tiles_figure(q, k, v, block_size=1))
    assert [e in one_pair for e in entries] == [True, False, False, True]
    plain = fig_texts(draw.tiles_figure(q, k, v, block_size=2, causal=False))
    assert [e in plain for e in entries] == [True, False, False, False]


def test_tiles_figure_one_panel_and_torch_input():
    q, k, v = qkv(T=5, S=7)
    fig = draw.tiles_figure(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                            block_size=4, causal=True)
    (ax,) = grid_axes(fig)
    assert ax.get_title() == "causal=True"
    assert tiles(ax) == [(0, 4, 0, 4), (0, 4, 4, 7), (4, 5, 0, 4), (4, 5, 4, 7)]
    assert [text for text, _ in order_labels(ax)] == ["1", "2", "3", "4"]  # none skipped
    assert [tick.get_text() for tick in ax.get_xticklabels()] == [str(s) for s in range(7)]


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((np.ones((1, 8, 4)), np.ones((8, 4)), np.ones((8, 3))), {},
         r"q must have shape \(T, Dh\), got shape \(1, 8, 4\)"),
        ((np.ones((8, 4)), np.ones((8,)), np.ones((8, 3))), {}, r"k must have shape \(S, Dh\)"),
        ((np.ones((8, 4)), np.ones((8, 3)), np.ones((8, 3))), {}, "q and k must have the same"),
        ((np.ones((8, 4), bool), np.ones((8, 4)), np.ones((8, 3))), {}, "q must be a numeric"),
        ((*qkv(), np.ones((8, 8))), {}, "mask must be a boolean array"),
        ((*qkv(), np.ones((8, 5), bool)), {}, r"mask with shape \(8, 5\) does not broadcast"),
        (qkv(), {"block_size": 0}, "block_size must be a positive integer"),
        (qkv(), {"causal": "yes"}, "causal must be True, False or a sequence"),
        (qkv(), {"causal": [True, 1]}, "causal must be True, False or a sequence"),
        (qkv(), {"causal": []}, "causal must be True, False or a sequence"),
        (qkv(), {"causal": [True] * 5}, "sequence of 1 to 4"),
        (qkv(T=8, S=6), {"causal": True}, "causal=True needs at least as many keys"),
        (qkv(T=3, S=40), {"causal": False}, r"a \(3, 40\) score matrix does not fit"),
        (qkv(T=0, S=4), {}, "at least one query and one key"),
    ],
)
def test_tiles_figure_rejects_bad_input(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw.tiles_figure(*args, **{"block_size": 2, **kwargs})


# ------------------------------------------------------------------ online softmax


def example(query: int = 3, block_size: int = 4, causal: bool = False, mask=None):
    """Seed 9, row 3: the maximum grows in every tile of 4 keys (0.22, 0.82, 1.99)."""
    q, k, v = qkv(T=12, S=12, seed=9)
    fig = draw.online_softmax_figure(q, k, v, mask, query=query, block_size=block_size,
                                     causal=causal)
    trace = mha.TileTrace()
    mha.flash_attention(q, k, v, mask, block_size=block_size, causal=causal, trace=trace)
    allowed = np.ones((12, 12), bool) if mask is None else np.broadcast_to(mask, (12, 12))
    if causal:
        allowed = allowed & mha.causal_mask(12)
    scores = np.where(allowed[query], q[query] @ k.T / 2.0, -np.inf)  # sqrt(Dh) = 2
    return fig, trace.row_history(query), scores


def gid(ax: Axes, name: str) -> list:
    return [a for a in (*ax.lines, *ax.collections, *ax.patches, *ax.texts)
            if a.get_gid() == name]


def step_texts(ax: Axes) -> list[tuple[str, tuple]]:
    return [(t.get_text(), to_rgba(t.get_color())) for t in gid(ax, "step_text")]


def bar_heights(ax: Axes, name: str) -> tuple[np.ndarray, np.ndarray]:
    bars = gid(ax, name)
    return (np.array([b.get_x() + b.get_width() / 2 for b in bars]),
            np.array([b.get_height() for b in bars]))


def test_online_softmax_figure_draws_the_running_max_and_sum_of_the_trace():
    fig, history, scores = example()
    np.testing.assert_array_equal(history.key_stop, [4, 8, 12])
    m, l_sum = history.running_max, history.running_sum
    assert np.all(np.diff(m) > 0.5)  # the example really rescales, twice
    assert "Online softmax of query 3: 3 key tiles of block_size = 4" in fig_texts(fig)
    for i in range(3):
        ax_s, ax_e, ax_t = fig.axes[3 * i : 3 * i + 3]
        (line,) = gid(ax_s, "running_max")
        np.testing.assert_array_equal(line.get_ydata(), [m[i], m[i]])
        (dots,) = gid(ax_s, "scores")
        seen = np.arange(4 * (i + 1))
        np.testing.assert_array_equal(dots.get_offsets()[:, 0], seen)
        np.testing.assert_allclose(dots.get_offsets()[:, 1], scores[seen], rtol=0, atol=1e-12)
        # The bars are exp(score - m) and add up to the trace's l.
        x, h = bar_heights(ax_e, "terms")
        np.testing.assert_array_equal(x, seen)
        np.testing.assert_allclose(h, np.exp(scores[seen] - m[i]), rtol=1e-12)
        np.testing.assert_allclose(h.sum(), l_sum[i], rtol=1e-12)
        texts = step_texts(ax_t)
        assert texts[0][0] == f"tile {i + 1}: keys {4 * i}-{4 * i + 3}"
        assert texts[-1][0].endswith(f"= {fmt(l_sum[i])}")
        if i == 0:
            assert not gid(ax_s, "old_max") and not gid(ax_e, "old_terms")
            assert texts[1][0] == f"m = tile max = {fmt(m[0])}"
            continue
        # The maximum grew: the old one dashed, the earlier terms' old heights outlined,
        # and the earlier terms are the old ones times exp(m_old - m_new).
        (old,) = gid(ax_s, "old_max")
        np.testing.assert_array_equal(old.get_ydata(), [m[i - 1], m[i - 1]])
        factor = math.exp(m[i - 1] - m[i])
        x_old, h_old = bar_heights(ax_e, "old_terms")
        np.testing.assert_array_equal(x_old, np.arange(4 * i))
        np.testing.assert_allclose(h[: 4 * i], h_old * factor, rtol=1e-12)
        assert texts[2] == (f"rescale = exp({fmt(m[i - 1])} - {fmt(m[i])}) = {fmt(factor)}",
                            to_rgba(tiled.MAX_COLOR))
        assert texts[3][0] == (f"l = {fmt(factor)} × {fmt(l_sum[i - 1])} + "
                               f"{fmt(l_sum[i] - factor * l_sum[i - 1])} = {fmt(l_sum[i])}")


def test_online_softmax_figure_ends_with_the_softmax_of_the_whole_row():
    fig, history, scores = example()
    ax_w, ax_f = fig.axes[9:]
    x, h = bar_heights(ax_w, "weights")
    np.testing.assert_array_equal(x, np.arange(12))
    np.testing.assert_allclose(h, mha.softmax(scores), rtol=0, atol=1e-12)
    np.testing.assert_allclose(h, np.exp(scores - history.running_max[-1])
                               / history.running_sum[-1], rtol=1e-12)
    (marks,) = gid(ax_w, "softmax")
    np.testing.assert_allclose(marks.get_offsets()[:, 1], mha.softmax(scores), atol=1e-12)
    assert step_texts(ax_f)[1][0] == (f"m = {fmt(history.running_max[-1])}, "
                                      f"l = {fmt(history.running_sum[-1])}")


def test_online_softmax_figure_with_causal_skips_and_blocked_keys():
    # Row 1 of a causal 12 x 12 in tiles of 3: key tiles 2-4 are skipped, and in the
    # one computed tile key 2 is above the diagonal.
    fig, history, scores = example(query=1, block_size=3, causal=True)
    assert list(history.skipped) == [False, True, True, True]
    assert len(fig.axes) == 3 + 2
    assert ("Online softmax of query 1: 1 key tile of block_size = 3, 3 skipped (above "
            "the causal diagonal)") in fig_texts(fig)
    (crosses,) = gid(fig.axes[0], "blocked")
    np.testing.assert_array_equal(crosses.get_offsets()[:, 0], [2])
    x, h = bar_heights(fig.axes[3], "weights")
    assert np.all(h[2:] == 0) and np.isclose(h.sum(), 1.0, rtol=0, atol=1e-12)
    # Row 9: four tiles, the last one partly above the diagonal (keys 10, 11).
    fig, history, _ = example(query=9, block_size=3, causal=True)
    assert len(fig.axes) == 4 * 3 + 2
    (crosses,) = gid(fig.axes[9], "blocked")
    np.testing.assert_array_equal(crosses.get_offsets()[:, 0], [10, 11])


def test_online_softmax_figure_when_the_first_tile_allows_nothing():
    mask = np.ones((12, 12), bool)
    mask[3, :4] = False  # row 3 sees nothing in its first tile: m stays -inf there
    fig, history, scores = example(mask=mask)
    assert np.isneginf(history.running_max[0]) and history.running_sum[0] == 0
    ax_s, _, ax_t = fig.axes[:3]
    assert not gid(ax_s, "running_max") and not gid(ax_s, "scores")
    np.testing.assert_array_equal(gid(ax_s, "blocked")[0].get_offsets()[:, 0], [0, 1, 2, 3])
    assert [t for t, _ in step_texts(ax_t)][1:] == ["no key allowed yet:", "m = -inf, l = 0"]
    # The next tile starts the sum: nothing to rescale, l is the tile's sum.
    assert [t for t, _ in step_texts(fig.axes[5])][1:] == [
        f"m = tile max = {fmt(history.running_max[1])}",
        f"l = sum of the terms = {fmt(history.running_sum[1])}",
    ]
    assert not gid(fig.axes[3], "old_max")


def test_each_figure_checks_its_claim_on_the_arrays_it_draws(monkeypatch):
    # A tiled attention that is off by 1e-9 must not be drawn as if it were exact.
    def slightly_off(*args, **kwargs):
        context, logsumexp = mha.flash_attention(*args, **kwargs)
        return context * (1 + 1e-9), logsumexp

    monkeypatch.setattr(tiled, "flash_attention", slightly_off)
    with pytest.raises(AssertionError):
        draw.tiles_figure(*qkv(), block_size=2)
    with pytest.raises(AssertionError):
        draw.online_softmax_figure(*qkv(), query=1, block_size=2)


@pytest.mark.parametrize("shift_max", [False, True])
def test_online_softmax_figure_checks_the_trace_against_the_scores(monkeypatch, shift_max):
    # A trace that records a wrong l before the last tile (context, final m and l stay
    # right) is caught; so is an m that is not the running maximum but comes with an l
    # consistent with it (l = sum exp(score - m) holds for any m).
    def wrong_trace(*args, trace, **kwargs):
        out = mha.flash_attention(*args, trace=trace, **kwargs)
        for step in trace.steps:
            if step.keys[1] < trace.num_keys:
                step.running_sum[...] *= math.exp(-1e-3) if shift_max else 1.001
                step.running_max[...] += 1e-3 if shift_max else 0.0
        return out

    monkeypatch.setattr(tiled, "flash_attention", wrong_trace)
    with pytest.raises(AssertionError):
        draw.online_softmax_figure(*qkv(), query=1, block_size=2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"query": 12}, r"query must be an int in \[0, 12\)"),
        ({"query": True}, "query must be an int"),
        ({"block_size": 1}, "spans 12 computed key tiles, more than 6"),
        ({"causal": 1}, "causal must be True or False"),
        ({"mask": np.arange(12)[:, None] > 0}, "query row 0 may attend to no key"),
    ],
)
def test_online_softmax_figure_rejects_bad_input(kwargs, message):
    args = {"query": 0, "block_size": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        draw.online_softmax_figure(*qkv(T=12, S=12), **args)


def test_online_softmax_figure_rejects_batched_input():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"v must have shape \(S, Dv\), got shape \(1, 8, 3\)"):
        draw.online_softmax_figure(q, k, v[None], query=0, block_size=2)


# ------------------------------------------------------------- every figure: house style


BUILDERS = {
    "tiles": lambda: draw.tiles_figure(*qkv(T=4, S=6), block_size=2),
    "tiles_masked": lambda: draw.tiles_figure(
        *qkv(T=4, S=6), mha.padding_mask(np.array([5]), max_len=6)[0, 0], block_size=3,
        causal=True),
    "online": lambda: draw.online_softmax_figure(*qkv(T=12, S=12, seed=9), query=3,
                                                 block_size=4),
    "online_causal": lambda: draw.online_softmax_figure(*qkv(T=12, S=12, seed=9), query=9,
                                                        block_size=3, causal=True),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_same_inputs_give_byte_identical_svg(name):
    first, second = svg(BUILDERS[name]()), svg(BUILDERS[name]())
    assert first == second
    assert b"<dc:date>" not in first and b"<image" not in first  # vector, no raster


@pytest.mark.parametrize("name", list(BUILDERS))
def test_figures_fit_the_text_width_with_readable_fonts(name):
    fig = BUILDERS[name]()
    assert fig.get_size_inches()[0] <= MAX_WIDTH + 1e-9
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text()]
    assert sizes and min(sizes) >= 8
    assert fig.get_facecolor() == to_rgba("white")
    assert len(draw.alt_text(fig)) > 40


@pytest.mark.parametrize("name", list(BUILDERS))
def test_nothing_drawn_outside_the_figure(name):
    # Every text (labels, step texts, legends) lies inside the figure's canvas.
    fig = BUILDERS[name]()
    renderer = rendered(fig)
    width, height = fig.bbox.width, fig.bbox.height
    for text in fig.findobj(Text):
        if not text.get_text() or not text.get_visible():
            continue
        box = text.get_window_extent(renderer)
        assert box.x0 >= -1 and box.y0 >= -1, text.get_text()
        assert box.x1 <= width + 1 and box.y1 <= height + 1, text.get_text()


def test_exported_from_mha_draw():
    assert draw.tiles_figure is tiled.tiles_figure
    assert draw.online_softmax_figure is tiled.online_softmax_figure
    assert {"tiles_figure", "online_softmax_figure"} <= set(draw.__all__)

"""mha.draw.tiles_figure: what is drawn is the trace.

The tile geometry is checked against counts worked out by hand (a causal square of
4 x 4 tiles computes 1 + 2 + 3 + 4 of them) and against a TileTrace recorded here.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from figures import (
    assert_house_style,
    assert_inside_the_canvas,
    assert_reproducible,
    faces,
    fig_texts,
    grid_axes,
    qkv,
    slightly_off,
)
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba

import mha
from mha import draw
from mha.draw import tile_trace
from mha.draw.style import BLOCKED_FILL
from mha.draw.tiles import COMPUTED_FILL, PARTIAL_FILL, SKIPPED_FILL, tiles_figure
from mha.notebook import setup_figures


@pytest.fixture(autouse=True)
def _figures():
    setup_figures()
    yield
    plt.close("all")


def outlines(ax: Axes) -> list[tuple[int, int, int, int]]:
    """(q0, q1, k0, k1) of every outlined tile."""
    return [(round(p.get_y()), round(p.get_y() + p.get_height()), round(p.get_x()),
             round(p.get_x() + p.get_width())) for p in ax.patches if p.get_gid() == "tile"]


def order_labels(ax: Axes) -> list[tuple[str, tuple[float, float]]]:
    return [(t.get_text(), t.get_position()) for t in ax.texts if t.get_gid() == "tile_order"]


def test_tiles_figure_colours_and_numbers_every_tile_of_a_causal_square():
    q, k, v = qkv()
    fig = draw.tiles_figure(q, k, v, tile_size=2)
    plain, causal = grid_axes(fig)
    assert (plain.get_title(), causal.get_title()) == ("causal=False", "causal=True")
    tiles = [(2 * i, 2 * i + 2, 2 * j, 2 * j + 2) for i in range(4) for j in range(4)]
    assert outlines(plain) == outlines(causal) == tiles  # processing order: row by row
    # Without causal masking every pair is computed and allowed.
    np.testing.assert_allclose(faces(plain, (8, 8)),
                               np.broadcast_to(to_rgba(COMPUTED_FILL), (8, 8, 4)))
    centre = {(i, j): (2 * j + 1.0, 2 * i + 1.0) for i in range(4) for j in range(4)}
    assert order_labels(plain) == [(str(n + 1), centre[divmod(n, 4)]) for n in range(16)]
    # Causal: tile (i, j) is skipped iff j > i; diagonal tiles hold blocked pairs s > t.
    fc = faces(causal, (8, 8))
    for t in range(8):
        for s in range(8):
            i, j = t // 2, s // 2
            expected = (SKIPPED_FILL if j > i else BLOCKED_FILL if s > t
                        else PARTIAL_FILL if i == j else COMPUTED_FILL)
            np.testing.assert_allclose(fc[t, s], to_rgba(expected), err_msg=f"pair {t}, {s}")
    lower = [(i, j) for i in range(4) for j in range(i + 1)]
    assert order_labels(causal) == [(str(n + 1), centre[ij]) for n, ij in enumerate(lower)]
    # 1 + 2 + 3 + 4 = 10 computed, 4 of them on the diagonal; 6 skipped.
    assert "causal=False: 16 of 16 tiles computed (0 with blocked pairs), 0 skipped" in (
        fig_texts(fig))
    assert "causal=True: 10 of 16 tiles computed (4 with blocked pairs), 6 skipped" in (
        fig_texts(fig))
    assert "T = 8 queries, S = 8 keys, tile_size = 2" in fig_texts(fig)[0]
    assert "10 computed and 6 skipped" in draw.alt_text(fig)


def test_tiles_figure_follows_the_trace_with_ragged_tiles_and_a_padding_mask():
    # T = 6 queries are the last 6 of S = 8 positions; keys 6, 7 are padding.
    q, k, v = qkv(T=6, S=8)
    pad = mha.padding_mask(np.array([6]), max_len=8)[0, 0]  # (1, S)
    fig = draw.tiles_figure(q, k, v, pad, tile_size=3)
    allowed = {False: np.broadcast_to(pad, (6, 8)),
               True: pad & mha.causal_mask(6, num_keys=8)}
    for ax, causal in zip(grid_axes(fig), (False, True), strict=True):
        trace = mha.TileTrace()
        mha.flash_attention(q, k, v, pad, tile_size=3, causal=causal, trace=trace)
        assert outlines(ax) == [(*s.queries, *s.keys) for s in trace.steps]
        fc = faces(ax, (6, 8))
        order = 0
        for step in trace.steps:
            (q0, q1), (k0, k1) = step.queries, step.keys
            block = allowed[causal][q0:q1, k0:k1]
            if step.skipped:
                np.testing.assert_allclose(fc[q0:q1, k0:k1], np.broadcast_to(
                    to_rgba(SKIPPED_FILL), (*block.shape, 4)))
                continue
            order += 1
            fill = COMPUTED_FILL if block.all() else PARTIAL_FILL
            np.testing.assert_allclose(fc[q0:q1, k0:k1][block], np.broadcast_to(
                to_rgba(fill), (int(block.sum()), 4)))
            np.testing.assert_allclose(fc[q0:q1, k0:k1][~block], np.broadcast_to(
                to_rgba(BLOCKED_FILL), (int((~block).sum()), 4)))
            assert (str(order), ((k0 + k1) / 2, (q0 + q1) / 2)) in order_labels(ax)
        assert len(order_labels(ax)) == order == trace.num_computed
    # Row of tiles 0 (queries 0-2, positions 2-4) needs keys up to 4: its tile 2 (keys
    # 6-7) is skipped. The padded keys 6-7 of row 1 are blocked but still computed:
    # a mask never skips a tile, only the causal diagonal does.
    assert "causal=True: 5 of 6 tiles computed (2 with blocked pairs), 1 skipped" in (
        fig_texts(fig))
    assert "causal=False: 6 of 6 tiles computed (2 with blocked pairs), 0 skipped" in (
        fig_texts(fig))


def test_tiles_figure_legend_names_only_what_is_drawn():
    q, k, v = qkv()
    entries = ("computed", "computed, with blocked pairs", "blocked pair: score set to -inf",
               "skipped: never computed")
    everything = fig_texts(draw.tiles_figure(q, k, v, tile_size=2))
    assert all(e in everything for e in entries)
    # One query and one key per tile: a tile is never part blocked.
    one_pair = fig_texts(draw.tiles_figure(q, k, v, tile_size=1))
    assert [e in one_pair for e in entries] == [True, False, False, True]
    plain = fig_texts(draw.tiles_figure(q, k, v, tile_size=2, causal=False))
    assert [e in plain for e in entries] == [True, False, False, False]


def test_tiles_figure_one_panel_and_torch_input():
    q, k, v = qkv(T=5, S=7)
    fig = draw.tiles_figure(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                            tile_size=4, causal=True)
    (ax,) = grid_axes(fig)
    assert ax.get_title() == "causal=True"
    assert outlines(ax) == [(0, 4, 0, 4), (0, 4, 4, 7), (4, 5, 0, 4), (4, 5, 4, 7)]
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
        ((np.ones((8, 4)), np.ones((8, 4)), np.ones((8, 3), complex)), {}, "v must be real"),
        ((*qkv(), np.ones((8, 8))), {}, "mask must be a boolean array"),
        ((*qkv(), np.ones((8, 5), bool)), {}, r"mask with shape \(8, 5\) does not broadcast"),
        (qkv(), {"tile_size": 0}, "tile_size must be a positive integer"),
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
        draw.tiles_figure(*args, **{"tile_size": 2, **kwargs})


def test_tiles_figure_checks_its_claim_on_the_arrays_it_draws(monkeypatch):
    # A tiled attention that is off by 1e-9 must not be drawn as if it were exact.
    monkeypatch.setattr(tile_trace, "flash_attention", slightly_off)
    with pytest.raises(AssertionError):
        draw.tiles_figure(*qkv(), tile_size=2)


# ------------------------------------------------------------------------ house style


BUILDERS = {
    "tiles": lambda: draw.tiles_figure(*qkv(T=4, S=6), tile_size=2),
    "tiles_masked": lambda: draw.tiles_figure(
        *qkv(T=4, S=6), mha.padding_mask(np.array([5]), max_len=6)[0, 0], tile_size=3,
        causal=True),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_same_inputs_give_byte_identical_svg(name):
    assert_reproducible(BUILDERS[name])


@pytest.mark.parametrize("name", list(BUILDERS))
def test_figures_fit_the_text_width_with_readable_fonts(name):
    assert_house_style(BUILDERS[name]())


@pytest.mark.parametrize("name", list(BUILDERS))
def test_nothing_drawn_outside_the_figure(name):
    assert_inside_the_canvas(BUILDERS[name]())


def test_exported_from_mha_draw():
    assert draw.tiles_figure is tiles_figure and "tiles_figure" in draw.__all__

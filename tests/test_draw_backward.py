"""mha.draw.attention_backward_figure and tiled_backward_figure: what is drawn is
mha.backward's.

Oracles: the values written in the cells are mha.backward's arrays
(``attention_backward_steps``, a ``BackwardTileTrace`` recorded here), and the products
written out here (``dO V^T``, ``P^T dO``) through :func:`fmt_clear`; the tile order and
the rows each tile adds to are worked out by hand for the chapter's running example
(T = S = 3, Dh = 3, tiles of 2, causal).
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
    faces,
    fig_texts,
    gid_texts,
    grid_axes,
)
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba

import mha
from mha import draw
from mha.backward import attention_backward_steps
from mha.draw import backward as draw_backward
from mha.draw.backward import (
    DONE_FILL,
    attention_backward_figure,
    gradient_faces,
    tiled_backward_figure,
)
from mha.draw.layout import Caption, Grid, Op, compose
from mha.draw.style import BLOCKED_FILL, head_fill
from mha.draw.tiles import COMPUTED_FILL, PARTIAL_FILL, SKIPPED_FILL
from mha.notebook import setup_figures
from mha.tiled_backward import BackwardTileTrace, flash_attention_backward

TOKENS = ["I", "like", "tea"]


@pytest.fixture(autouse=True)
def _figures():
    setup_figures()
    yield
    plt.close("all")


def head(T=3, S=3, Dh=3, Dv=3, seed=0):
    """One head's q (T, Dh), k (S, Dh), v (S, Dv) and dO (T, Dv)."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(T, Dh)), rng.normal(size=(S, Dh)), rng.normal(size=(S, Dv)),
            rng.normal(size=(T, Dv)))  # fmt: skip


def texts(ax: Axes) -> list[str]:
    """The values written in the cells, row-major."""
    return gid_texts(ax, "value")


def fmt(a: np.ndarray, decimals: int = 2) -> list[str]:
    """What a cell shows for each value of ``a``: rounded, never ``-0.00``, -inf as such."""
    return ["-inf" if np.isneginf(v) else f"{np.round(v, decimals) + 0.0:.{decimals}f}"
            for v in np.ravel(a)]  # fmt: skip


def fmt_clear(a: np.ndarray, decimals: int = 2, apart: float = 1e-12) -> list[str]:
    """:func:`fmt` of values computed here on another path than the figure's: asserts
    first that none lies within ``apart`` of a rounding tie, so the texts agree on any CPU."""
    scaled = np.abs(np.ravel(a)) * 10.0**decimals
    assert float(np.abs(scaled - np.floor(scaled) - 0.5).min()) / 10.0**decimals > apart
    return fmt(a, decimals)


def left_and_width(ax: Axes) -> tuple[float, float]:
    box = ax.get_position()
    return box.x0, box.width


TITLES = [
    "Q", "Kᵀ", "Z = c Q Kᵀ",
    "dQ = c dZ K", "dKᵀ = c Qᵀ dZ", "dZ = P ∘ (dP − δ)",
    "Z = c Q Kᵀ", "P = softmax(Z)",
    "dZ = P ∘ (dP − δ)", "dP = dO Vᵀ", "δ",
    "P = softmax(Z)", "V", "O = P V",
    "dP = dO Vᵀ", "dV = Pᵀ dO", "dO (given)",
]  # fmt: skip
TWINS = [(0, 3), (1, 4), (2, 5), (6, 8), (7, 9), (11, 14), (12, 15), (13, 16)]


# ------------------------------------------------------------------ forward and backward


def test_attention_backward_figure_draws_mha_backward_with_each_gradient_under_its_twin():
    q, k, v, d_out = head()
    mask = mha.causal_mask(3)
    fig = draw.attention_backward_figure(q, k, v, d_out, mask, query_tokens=TOKENS,
                                         key_tokens=TOKENS)  # fmt: skip
    axes = grid_axes(fig)
    assert [ax.get_title() for ax in axes] == TITLES
    st = attention_backward_steps(q, k, v, d_out, mask)
    # Exact: the arrays mha.backward returns (or the figure's inputs), rounded.
    drawn = [q, k.T, st.masked, st.dq, st.dk.T, st.d_masked, st.masked, st.weights,
             st.d_masked, st.d_weights, st.row_dot[:, None], st.weights, v, st.context,
             st.d_weights, st.dv, d_out]  # fmt: skip
    for ax, want in zip(axes, drawn, strict=True):
        assert texts(ax) == fmt(want), ax.get_title()
    for got, want in zip((st.dq, st.dk, st.dv), mha.attention_backward(q, k, v, d_out, mask),
                         strict=True):  # fmt: skip
        assert np.array_equal(got, want)
    # Two products written out here: dP = dO V^T and dV = P^T dO.
    assert texts(axes[9]) == fmt_clear(d_out @ v.T)  # (T, Dv) @ (Dv, S)
    assert texts(axes[15]) == fmt_clear(st.weights.T @ d_out)  # (S, T) @ (T, Dv)
    # Each gradient stands exactly under its forward twin, as wide.
    for forward, backward in TWINS:
        assert left_and_width(axes[backward]) == pytest.approx(left_and_width(axes[forward]),
                                                               abs=1e-9)  # fmt: skip
        assert axes[backward].get_position().y1 < axes[forward].get_position().y0
    # Blocked pairs (s > t): -inf in Z, 0 in P and dZ, all dark; nowhere else dark.
    blocked = ~mask
    dark = to_rgba(BLOCKED_FILL)
    for i in (2, 5, 6, 7, 8, 11):
        fc = faces(axes[i], (3, 3))
        assert np.allclose(fc[blocked], dark) and not np.isclose(fc[~blocked], dark).all(-1).any()
    assert [t for t, b in zip(texts(axes[2]), blocked.ravel(), strict=True) if b] == ["-inf"] * 3
    assert [t for t, b in zip(texts(axes[5]), blocked.ravel(), strict=True) if b] == ["0.00"] * 3
    # Gradients on one scale centred on 0; the forward's inputs in head 0's tint.
    top = max(np.abs(a).max() for a in (st.dq, st.dk, st.d_masked, st.d_weights, st.row_dot,
                                        st.dv, d_out))  # fmt: skip
    for i in (3, 4, 9, 10, 14, 15, 16):
        np.testing.assert_allclose(faces(axes[i], drawn[i].shape),
                                   gradient_faces(drawn[i], top), err_msg=TITLES[i])
    assert np.allclose(faces(axes[5], (3, 3))[~blocked], gradient_faces(st.d_masked, top)[~blocked])
    for i in (0, 1, 12, 13):
        assert np.allclose(faces(axes[i], drawn[i].shape), head_fill(0))
    assert [t.get_text() for t in axes[0].get_yticklabels()] == TOKENS
    assert [t.get_text() for t in axes[4].get_xticklabels()] == TOKENS
    captions = " ".join(fig_texts(fig))
    assert "T = 3 queries, S = 3 keys, Dh = 3, Dv = 3, c = 1/√3 = 0.58" in captions
    assert f"gradient -{top:.2f}" in captions and "blocked: -inf in Z, 0 in P and dZ" in captions
    alt = draw.alt_text(fig)
    assert "3 queries and 3 keys" in alt and "(3 pairs blocked)" in alt


def test_gradient_colours_diverge_from_white_at_zero():
    x = np.array([[-2.0, -0.5, 0.0, 0.5, 2.0, 8.0]])
    fc = gradient_faces(x, 2.0)
    assert np.allclose(fc[0, 2], to_rgba("white"))
    assert np.allclose(fc[0, 0], to_rgba(draw_backward.NEGATIVE_COLOR))
    assert np.allclose(fc[0, 4], fc[0, 5])  # beyond the scale: the full colour
    assert np.allclose(fc[0, 4], to_rgba(draw_backward.POSITIVE_COLOR))
    # A quarter of the largest magnitude is half way in colour (square root).
    np.testing.assert_allclose(fc[0, 3], draw_backward.GRADIENT_CMAP(0.75))
    np.testing.assert_allclose(fc[0, 1], draw_backward.GRADIENT_CMAP(0.25))


def test_attention_backward_figure_without_a_mask_marks_nothing_and_defaults_labels():
    q, k, v, d_out = head(T=2, S=3, Dh=2, Dv=1, seed=3)
    fig = draw.attention_backward_figure(q, k, v, d_out, decimals=3)
    axes = grid_axes(fig)
    st = attention_backward_steps(q, k, v, d_out)
    assert texts(axes[5]) == fmt(st.d_masked, 3)
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["0", "1"]
    assert not any(np.isclose(faces(ax, (2, 3)), to_rgba(BLOCKED_FILL)).all(-1).any()
                   for ax in (axes[2], axes[5], axes[7]))  # fmt: skip
    assert "blocked" not in " ".join(fig_texts(fig))
    assert "(0 pairs blocked)" in draw.alt_text(fig)
    # Narrow grids under wide titles: the twins still line up.
    for forward, backward in TWINS:
        assert left_and_width(axes[backward]) == pytest.approx(left_and_width(axes[forward]),
                                                               abs=1e-9)  # fmt: skip


def test_compose_aligns_the_items_of_rows_in_common_columns():
    def grid(title: str, cols: int, labels: list[str] | None = None) -> Grid:
        return Grid(face=np.ones((2, cols, 4)), title=title, row_labels=labels)

    rows = [
        [grid("a title far wider than its grid", 1), Op("@"), grid("b", 2, ["x", "y"])],
        Caption("between"),
        [grid("c", 2, ["a long label", "y"]), Op(""), grid("d", 3), Op("="), grid("e", 1)],
    ]
    plain, aligned = compose(rows)[1], compose(rows, align=[[0, 2]])[1]
    assert left_and_width(plain[1])[0] != pytest.approx(left_and_width(plain[3])[0], abs=0.01)
    # Column by column, the grids' left edges coincide; a grid past the shorter row's end
    # follows its row.
    assert aligned[0].get_position().x0 == pytest.approx(aligned[2].get_position().x0)
    assert aligned[1].get_position().x0 == pytest.approx(aligned[3].get_position().x0)
    assert aligned[4].get_position().x0 > aligned[3].get_position().x1
    with pytest.raises(ValueError, match="align names row 1, which is not a row of items"):
        compose(rows, align=[[0, 1]])
    with pytest.raises(ValueError, match="item 1 of rows \\[0, 2\\] is not of one kind"):
        compose([rows[0], rows[1], [grid("c", 1), grid("d", 1)]], align=[[0, 2]])
    with pytest.raises(ValueError, match="align names row 0 in two groups"):
        compose(rows, align=[[0, 2], [0]])


def off(field: str, how: str):
    """attention_backward_steps with one field wrong: ``"1e-9"`` moved by that much,
    ``"blocked"`` not 0 at the blocked pairs (+1e-3 and -1e-3 in row 0: its sum kept),
    ``"rows"`` each row's sum moved by 1e-6."""
    def steps(*args, **kwargs):
        st = attention_backward_steps(*args, **kwargs)
        value = getattr(st, field).copy()
        if how == "1e-9":
            value = value + 1e-9
        elif how == "blocked":  # a backward that forgot the mask; causal: (0, 1), (0, 2)
            value[0, 1], value[0, 2] = 1e-3, -1e-3
        else:
            value[:, 0] += 1e-6
        return dataclasses.replace(st, **{field: value})

    return steps


@pytest.mark.parametrize(("field", "how"),
                         [("dq", "1e-9"), ("dk", "1e-9"), ("dv", "1e-9"), ("context", "1e-9"),
                          ("d_masked", "blocked"), ("weights", "blocked"),
                          ("d_masked", "rows")])  # fmt: skip
def test_attention_backward_figure_checks_its_claim_on_the_arrays_it_draws(
        monkeypatch, field, how):
    # Gradients off by 1e-9 from attention_backward's, a context that is not the tiled
    # forward's, weights or a dZ not 0 at the blocked pairs, or a dZ whose rows do not
    # sum to 0, must not be drawn.
    monkeypatch.setattr(draw_backward, "attention_backward_steps", off(field, how))
    with pytest.raises(AssertionError):
        draw.attention_backward_figure(*head(), mha.causal_mask(3))


def test_attention_backward_figure_checks_against_the_tiled_backward(monkeypatch):
    def tiled_off(*args, **kwargs):
        dq, dk, dv = flash_attention_backward(*args, **kwargs)
        return dq, dk * (1 + 1e-9), dv

    monkeypatch.setattr(draw_backward, "flash_attention_backward", tiled_off)
    with pytest.raises(AssertionError):
        draw.attention_backward_figure(*head(), mha.causal_mask(3))


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((np.ones((1, 3, 3)), *head()[1:]), {}, r"q must have shape \(T, Dh\), got shape \(1, 3"),
        ((*head()[:3], np.ones(3)), {}, r"d_context must have shape \(T, Dv\)"),
        ((*head()[:3], np.ones((3, 2))), {}, r"d_context must have the shape of .*\(3, 3\)"),
        ((head()[0], np.ones((3, 2)), *head()[2:]), {}, "q and k must have the same"),
        ((*head(), np.ones((3, 3))), {}, "mask must be a boolean array"),
        ((*head(), np.ones((3, 2), bool)), {}, r"mask with shape \(3, 2\) does not broadcast"),
        (head(), {"query_tokens": ["a"]}, "query_tokens has 1 labels but axis T has size 3"),
        (head(), {"key_tokens": "abc"}, "key_tokens must be a sequence of strings"),
        (head(), {"decimals": 7}, r"decimals must be an int in \[0, 6\]"),
        (head(T=0), {}, "at least one query and one key"),
        (head(S=12), {}, "does not fit 8.0 inches wide"),
    ],
)
def test_attention_backward_figure_rejects_bad_input(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw.attention_backward_figure(*args, **kwargs)


# ------------------------------------------------------------------------------- tiled


def outlines(ax: Axes, gid: str) -> list[tuple[int, int, int, int]]:
    """(top, bottom, left, right) of every rectangle with this gid, in cells."""
    return [(round(p.get_y()), round(p.get_y() + p.get_height()), round(p.get_x()),
             round(p.get_x() + p.get_width())) for p in ax.patches if p.get_gid() == gid]


def test_tiled_backward_figure_follows_the_trace_of_the_running_example():
    q, k, v, d_out = head()
    fig = draw.tiled_backward_figure(q, k, v, tile_size=2, causal=True, d_context=d_out)
    axes = grid_axes(fig)
    assert len(axes) == 3 * 4  # one row of 4 grids per computed tile
    assert [ax.get_title() for ax in axes[:4]] == ["tiles", "dQ so far", "dK so far",
                                                   "dV so far"]  # fmt: skip
    # By hand: key tiles outer (keys 0-1, then key 2), query tiles inner; the tile of
    # queries 0-1 and key 2 lies above the causal diagonal and is skipped.
    order = [(0, 2, 0, 2), (2, 3, 0, 2), (0, 2, 2, 3), (2, 3, 2, 3)]
    computed = [order[0], order[1], order[3]]
    trace = BackwardTileTrace()
    context, lse = mha.flash_attention(q, k, v, tile_size=2, causal=True)
    flash_attention_backward(q, k, v, context, lse, d_out, tile_size=2, causal=True,
                             trace=trace)  # fmt: skip
    assert [(*s.queries, *s.keys) for s in trace.steps] == order
    assert [s.skipped for s in trace.steps] == [False, False, True, False]
    allowed = mha.causal_mask(3)
    for n, (q0, q1, k0, k1) in enumerate(computed):
        tiles, dq_ax, dk_ax, dv_ax = axes[4 * n:4 * n + 4]
        assert outlines(tiles, "tile") == [(a, b, c, d) for a, b, c, d in order]
        assert gid_texts(tiles, "tile_order") == ["1", "2", "3"]
        # The rows this tile added to, outlined.
        assert outlines(dq_ax, "tile_rows") == [(q0, q1, 0, 3)]
        assert outlines(dk_ax, "tile_rows") == outlines(dv_ax, "tile_rows") == [(k0, k1, 0, 3)]
        # The map: this tile blue (orange if part blocked), earlier ones pale, blocked dark.
        fc = faces(tiles, (3, 3))
        tile = allowed[q0:q1, k0:k1]
        now = to_rgba(COMPUTED_FILL if tile.all() else PARTIAL_FILL)
        assert np.allclose(fc[q0:q1, k0:k1][tile], now)
        assert np.allclose(fc[0:2, 2], to_rgba(SKIPPED_FILL))
        assert np.allclose(fc[0, 1], to_rgba(BLOCKED_FILL))
        for a, b, c, d in computed[:n]:
            assert np.allclose(fc[a:b, c:d][allowed[a:b, c:d]], DONE_FILL)
        # The gradients as the trace's first tiles left them; rows not reached blank.
        i = order.index((q0, q1, k0, k1))
        so_far = trace.accumulated(i + 1)
        reached_q = sorted({r for a, b, _, _ in computed[:n + 1] for r in range(a, b)})
        reached_k = sorted({r for _, _, c, d in computed[:n + 1] for r in range(c, d)})
        assert texts(dq_ax) == fmt(so_far[0][reached_q])
        assert texts(dk_ax) == fmt(so_far[1][reached_k])
        assert texts(dv_ax) == fmt(so_far[2][reached_k])
    # After the last tile: the plain backward's gradients (written out here for dV).
    plain = mha.attention_backward(q, k, v, d_out, allowed)
    for ax, want in zip(axes[9:], plain, strict=True):
        assert texts(ax) == fmt_clear(want)
    weights = mha.scaled_dot_product_attention(q, k, v, allowed)[1]
    assert texts(axes[11]) == fmt_clear(weights.T @ d_out)  # (S, T) @ (T, Dv)
    captions = " ".join(fig_texts(fig))  # the caption's lines, joined again
    assert "2 x 2 tiles, 3 computed, 1 skipped (above the causal diagonal)" in captions
    for n, tile in enumerate(("queries 0-1, keys 0-1", "queries 2, keys 0-1",
                              "queries 2, keys 2")):  # fmt: skip
        assert f"tile {n + 1}: {tile}: adds" in captions
    assert captions.count("are final") == 2
    assert "to dV rows 0-1; dK, dV rows 0-1 are final" in captions
    assert "(3 computed, 1 skipped)" in draw.alt_text(fig)


def test_tiled_backward_figure_with_a_padding_mask_and_the_default_d_context():
    q, k, v, _ = head(T=2, S=4, Dh=2, Dv=2, seed=5)
    pad = mha.padding_mask(np.array([3]), max_len=4)[0, 0]  # (1, S): key 3 is padding
    fig = draw.tiled_backward_figure(q, k, v, tile_size=2, mask=pad)
    axes = grid_axes(fig)
    assert len(axes) == 2 * 4  # nothing skipped without causal masking
    plain = mha.attention_backward(q, k, v, np.ones((2, 2)), np.broadcast_to(pad, (2, 4)))
    for ax, want in zip(axes[5:], plain, strict=True):  # dO = ones by default
        assert texts(ax) == fmt_clear(want)
    assert np.allclose(faces(axes[4], (2, 4))[:, 3], to_rgba(BLOCKED_FILL))
    assert np.allclose(faces(axes[4], (2, 4))[:, 2], to_rgba(PARTIAL_FILL))
    assert not any("skipped" in c for c in fig_texts(fig)[:1])
    legend = fig_texts(fig)
    assert "this tile, with blocked pairs" in legend and "skipped" not in legend


def shifted(step: int):
    """flash_attention_backward whose trace holds a tile's dV off by 1e-14: not what the
    backward returned, yet within 1e-12 of the plain backward's."""
    def backward(*args, trace=None, **kwargs):
        grads = flash_attention_backward(*args, trace=trace, **kwargs)
        st = trace.steps[step]
        trace.steps[step] = dataclasses.replace(st, dv=st.dv + 1e-14)
        return grads

    return backward


def test_tiled_backward_figure_checks_its_claim_on_the_arrays_it_draws(monkeypatch):
    q, k, v, _ = head()
    monkeypatch.setattr(draw_backward, "flash_attention_backward", shifted(1))
    with pytest.raises(AssertionError):  # the trace's sum is not what the backward returned
        draw.tiled_backward_figure(q, k, v, tile_size=2, causal=True)
    monkeypatch.undo()

    def plain_off(*args, **kwargs):
        dq, dk, dv = mha.attention_backward(*args, **kwargs)
        return dq * (1 + 1e-9), dk, dv

    monkeypatch.setattr(draw_backward, "attention_backward", plain_off)
    with pytest.raises(AssertionError):  # the tiles do not add up to the plain gradients
        draw.tiled_backward_figure(q, k, v, tile_size=2, causal=True)
    monkeypatch.undo()

    def skips_too_much(*args, trace=None, **kwargs):
        grads = flash_attention_backward(*args, trace=trace, **kwargs)
        trace.steps[0] = dataclasses.replace(trace.steps[0], skipped=True)
        return grads

    monkeypatch.setattr(draw_backward, "flash_attention_backward", skips_too_much)
    with pytest.raises(AssertionError, match="tile"):  # a skipped tile with allowed pairs
        draw.tiled_backward_figure(q, k, v, tile_size=2, causal=True)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((np.ones((3,)), *head()[1:3]), {}, r"q must have shape \(T, Dh\)"),
        (head()[:3], {"tile_size": 0}, "tile_size must be a positive integer"),
        (head()[:3], {"causal": "yes"}, "causal must be True or False"),
        (head()[:3], {"mask": np.ones((3, 3))}, "mask must be a boolean array"),
        (head()[:3], {"d_context": np.ones((3, 2))}, "d_context must have the shape of context"),
        (head()[:3], {"decimals": -1}, r"decimals must be an int in \[0, 6\]"),
        (head(T=4, S=2)[:3], {"causal": True}, "causal=True needs at least as many keys"),
        (head(S=0)[:3], {}, "at least one query and one key"),
        (head(T=8, S=8, Dh=1, Dv=1)[:3], {"tile_size": 1}, "more than 6 fit on a page"),
        (head(T=2, S=4, Dh=4, Dv=3)[:3], {}, "does not fit 8.0 inches wide"),
    ],
)
def test_tiled_backward_figure_rejects_bad_input(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw.tiled_backward_figure(*args, **{"tile_size": 2, **kwargs})


# ------------------------------------------------------------------------ house style

BUILDERS = {
    # small: rendering text as paths is the slow part
    "attention": lambda: draw.attention_backward_figure(*head(T=2, S=2, Dh=1, Dv=1),
                                                         mha.causal_mask(2)),
    "tiled": lambda: draw.tiled_backward_figure(*head(T=2, S=2, Dh=1, Dv=1)[:3],
                                                tile_size=1, causal=True),
}
WIDEST = {
    # the chapter's running example, T = S = 3 and Dh = 3, with its tokens
    "attention": lambda: draw.attention_backward_figure(*head(), mha.causal_mask(3),
                                                         query_tokens=TOKENS,
                                                         key_tokens=TOKENS),
    "tiled": lambda: draw.tiled_backward_figure(*head()[:3], tile_size=2, causal=True,
                                                d_context=head()[3]),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_same_inputs_give_byte_identical_svg(name):
    assert_reproducible(BUILDERS[name])


@pytest.mark.parametrize("name", list(WIDEST))
def test_figures_fit_the_text_width_with_readable_fonts(name):
    fig = WIDEST[name]()
    assert_house_style(fig)  # at most the text width, fonts of 8 pt or more, alt text
    assert_inside_the_canvas(fig)  # every text inside, so the tight box fits too


def test_exported_from_mha_draw():
    assert draw.attention_backward_figure is attention_backward_figure
    assert draw.tiled_backward_figure is tiled_backward_figure
    assert {"attention_backward_figure", "tiled_backward_figure"} <= set(draw.__all__)

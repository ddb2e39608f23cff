"""mha.draw.rope_figure and alibi_figure: what is drawn equals the arrays it stands for.

Oracles: RoPE written out here pair by pair with ``math.cos`` / ``math.sin``, scores summed
here pair by pair; ALiBi's slopes as the paper lists them (``1/2 .. 1/256`` for 8 heads,
``2^(-8/n)`` ratios) and ``-slope * distance`` written here; colours from the house
palette and colour maps.
"""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from figures import rendered, svg
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Arc, FancyArrowPatch
from matplotlib.text import Text
from numerics import EPS64

import mha
from mha import draw
from mha.draw import positions
from mha.draw.style import BLOCKED_FILL, MAX_WIDTH, head_text_color
from mha.notebook import setup_figures


@pytest.fixture(autouse=True)
def _figures():
    setup_figures()
    yield
    plt.close("all")


def qk(head_dim: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    q, k = np.random.default_rng(seed).normal(size=(2, head_dim))
    return q, k


def rope_by_hand(x: np.ndarray, m: int, base: float = 10000.0) -> np.ndarray:
    """x (Dh,) at position m: pair i turned by m * base^(-2i/Dh), entry by entry."""
    out = np.empty_like(x)
    for i in range(len(x) // 2):
        angle = m * base ** (-2 * i / len(x))
        a, b = x[2 * i], x[2 * i + 1]
        out[2 * i] = a * math.cos(angle) - b * math.sin(angle)
        out[2 * i + 1] = a * math.sin(angle) + b * math.cos(angle)
    return out


def arrows(ax: Axes) -> list[FancyArrowPatch]:
    return [p for p in ax.patches if p.get_gid() == "vector"]


def tips(ax: Axes) -> np.ndarray:
    """(N, 2) arrow ends, after checking that every arrow starts at the origin."""
    ends = []
    for arrow in arrows(ax):
        start, end = arrow._posA_posB
        assert start == (0.0, 0.0)
        ends.append(end)
    return np.array(ends)


def arcs(ax: Axes) -> list[Arc]:
    return [p for p in ax.patches if p.get_gid() == "angle"]


def gid_texts(ax: Axes, gid: str) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_gid() == gid]


def series(ax: Axes) -> list:
    return [line for line in ax.lines if line.get_gid() == "series"]


def grid_axes(fig: Figure) -> list[Axes]:
    return [ax for ax in fig.axes if any(c.get_gid() == "cells" for c in ax.collections)]


def faces(ax: Axes, shape: tuple[int, int]) -> np.ndarray:
    (coll,) = [c for c in ax.collections if c.get_gid() == "cells"]
    return np.asarray(coll.get_facecolors()).reshape(*shape, 4)



# ============================================================================== RoPE


def test_rope_arrows_are_the_pairs_of_q_turned_at_each_position():
    q, k = qk()
    fig = draw.rope_figure(q, k, slow_pair=2, num_positions=5, head=1)
    fast, slow, gap, score, flat = fig.axes
    want_fast = np.array([rope_by_hand(q, m)[0:2] for m in range(5)])
    want_slow = np.array([rope_by_hand(q, m)[4:6] for m in range(5)])
    np.testing.assert_allclose(tips(fast), want_fast, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tips(slow), want_slow, rtol=1e-12, atol=1e-12)
    # also the specification's own arrays, which the figure takes them from
    rotated = mha.apply_rope(np.broadcast_to(q, (5, 8)), np.arange(5))
    # the same angles; sin and cos of another shape may take another SIMD path
    np.testing.assert_allclose(tips(fast), rotated[:, 0:2], rtol=0,
                               atol=16 * EPS64 * np.abs(q).max())  # fmt: skip
    # one head's colour, lighter for earlier positions, the last one the colour itself
    colours = [to_rgba(a.get_edgecolor()) for a in arrows(fast)]
    assert colours[-1] == to_rgba(draw.head_color(1))
    lightness = [sum(c[:3]) for c in colours]
    assert lightness == sorted(lightness, reverse=True) and len(set(lightness)) == 5
    assert gid_texts(fast, "tip_label") == [f"m={m}" for m in range(5)]
    assert fast.get_xlabel() == "dim 0" and slow.get_ylabel() == "dim 5"


def test_rope_angle_marks_are_one_step_of_theta_each():
    q, k = qk()
    fig = draw.rope_figure(q, k, slow_pair=1, num_positions=4)
    fast, slow = fig.axes[:2]
    spans = [a.theta2 - a.theta1 for a in arcs(fast)]
    np.testing.assert_allclose(spans, [math.degrees(1.0)] * 3, atol=1e-9)  # theta_0 = 1 rad
    assert gid_texts(fast, "angle_label") == [r"$\theta_{0}$"] * 3
    theta_1 = 10000 ** (-2 / 8)  # 0.1 rad
    spans = sorted(a.theta2 - a.theta1 for a in arcs(slow))
    np.testing.assert_allclose(spans, [math.degrees(theta_1)] * 3 + [math.degrees(3 * theta_1)],
                               atol=1e-9)  # three steps, and one mark across all of them
    assert gid_texts(slow, "angle_label") == [r"$3\theta_{1}$ = 17°"]
    assert gid_texts(slow, "tip_label") == ["m=0…3"]  # too close to label one by one
    assert "1 rad = 57.3° per position" in fast.get_title()
    assert "0.1 rad = 5.73° per position" in slow.get_title()


def test_rope_gap_panel_same_angle_for_the_same_offset():
    q, k = qk(seed=3)
    fig = draw.rope_figure(q, k, offset=2)
    gap = fig.axes[2]
    drawn = tips(gap)  # q_2, k_0, q_4, k_2, each scaled to length 1
    want = []
    for m, n in ((2, 0), (4, 2)):
        qm, kn = rope_by_hand(q, m)[0:2], rope_by_hand(k, n)[0:2]
        want += [qm / np.linalg.norm(qm), kn / np.linalg.norm(kn)]
    np.testing.assert_allclose(drawn, np.array(want), rtol=1e-12, atol=1e-12)
    assert [a.get_linestyle() for a in arrows(gap)] == ["-", "--", "-", "--"]
    assert gid_texts(gap, "tip_label") == ["$q_{2}$", "$k_{0}$", "$q_{4}$", "$k_{2}$"]
    # the angle from k_n to q_m: that of the unrotated pairs plus (m - n) * theta_0
    angle = math.atan2(q[1], q[0]) - math.atan2(k[1], k[0]) + 2.0
    angle = (angle + math.pi) % (2 * math.pi) - math.pi
    label = f"{abs(math.degrees(angle)):.0f}°"
    assert gid_texts(gap, "angle_label") == [label, label]
    spans = [a.theta2 - a.theta1 for a in arcs(gap)]
    np.testing.assert_allclose(spans, [abs(math.degrees(angle))] * 2, atol=1e-9)
    assert "m − n = 2" in gap.get_title()


def test_rope_gap_panel_negative_offset_starts_the_keys_ahead():
    q, k = qk()
    gap = draw.rope_figure(q, k, offset=-1).axes[2]
    assert gid_texts(gap, "tip_label") == ["$q_{0}$", "$k_{1}$", "$q_{2}$", "$k_{3}$"]


def test_rope_score_grid_is_q_m_dot_k_n_constant_along_diagonals():
    q, k = qk(seed=5)
    size, offset = 5, 1
    fig = draw.rope_figure(q, k, size=size, offset=offset, head=2)
    score = fig.axes[3]
    (cells_ax,) = grid_axes(fig)
    assert cells_ax is score
    want = np.array([[sum(rope_by_hand(q, m)[i] * rope_by_hand(k, n)[i] for i in range(8))
                      for n in range(size)] for m in range(size)])
    shown = gid_texts(score, "value")
    assert shown == [f"{np.round(v, 2) + 0.0:.2f}" for v in want.ravel()]
    grid = np.array(shown).reshape(size, size)
    for d in range(-(size - 1), size):  # every diagonal shows one number
        assert len(set(np.diagonal(grid, offset=-d))) == 1
    norm = plt.Normalize(want.min(), want.max())
    np.testing.assert_allclose(faces(score, (size, size)), draw.head_cmap(2)(norm(want)),
                               atol=1e-9)
    frames = [p for p in score.patches if p.get_gid() == "gap"]
    assert [(int(p.get_y()), int(p.get_x())) for p in frames] == [
        (m, m - offset) for m in range(offset, size)]


def test_rope_flat_lines_hold_one_score_per_gap():
    q, k = qk(seed=7)
    fig = draw.rope_figure(q, k, size=6, offset=1, head=0)
    flat = fig.axes[4]
    lines = series(flat)
    assert [line.get_label() for line in lines] == ["m − n = 0", "m − n = 1", "m − n = 2"]
    for d, line in zip((0, 1, 2), lines, strict=True):
        m = np.asarray(line.get_xdata())
        np.testing.assert_array_equal(m, np.arange(d, 6))
        want = [float(rope_by_hand(q, mm) @ rope_by_hand(k, mm - d)) for mm in m]
        np.testing.assert_allclose(line.get_ydata(), want, rtol=1e-12, atol=1e-12)
        assert np.ptp(line.get_ydata()) < 1e-12  # flat
    assert to_rgba(lines[1].get_color()) == to_rgba(draw.head_color(0))  # the framed gap


def test_rope_figure_accepts_torch_and_other_bases():
    q, k = qk(head_dim=4)
    fig = draw.rope_figure(torch.tensor(q), torch.tensor(k), base=100.0, num_positions=3)
    slow = fig.axes[1]
    np.testing.assert_allclose(tips(slow), [rope_by_hand(q, m, base=100.0)[2:4] for m in range(3)],
                               rtol=1e-12, atol=1e-12)
    assert "Dh = 4" in draw.alt_text(fig)


def test_rope_figure_checks_its_claim_on_the_arrays(monkeypatch):
    """A RoPE that turns by the position squared breaks 'depends only on m - n'."""
    def squared(x, positions, base=10000.0):
        return mha.apply_rope(x, np.asarray(positions) ** 2, base=base)

    monkeypatch.setattr(positions, "apply_rope", squared)
    q, k = qk()
    with pytest.raises(AssertionError, match="does not turn pair 0"):
        draw.rope_figure(q, k)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((np.ones((2, 8)), np.ones(8)), {}, r"q must have shape \(Dh,\).*\(2, 8\)"),
        ((np.ones(8), np.ones(6)), {}, r"same shape \(Dh,\), got \(8,\) and \(6,\)"),
        ((np.ones(6 - 1), np.ones(5)), {}, r"even Dh >= 4.*\(5,\)"),
        ((np.ones(2), np.ones(2)), {}, r"even Dh >= 4.*\(2,\)"),
        ((np.ones(8), np.ones(8)), {"slow_pair": 0}, r"slow_pair must be an int in \[1, 3\]"),
        ((np.ones(8), np.ones(8)), {"slow_pair": 4}, r"slow_pair must be an int in \[1, 3\]"),
        ((np.ones(8), np.ones(8)), {"num_positions": 7}, "num_positions must be an int"),
        ((np.ones(8), np.ones(8)), {"size": 9}, r"size must be an int in \[2, 8\]"),
        ((np.ones(8), np.ones(8)), {"size": 4, "offset": 4}, r"offset must be an int in \[-3, 3\]"),
        ((np.ones(8), np.ones(8)), {"offset": True}, "offset must be an int"),
        ((np.ones(8), np.ones(8)), {"base": -1.0}, "base must be a positive"),
        ((np.ones(8), np.ones(8)), {"head": -1}, "head index"),
        ((np.ones(8), np.array([1.0, 1, 0, 0, 1, 1, 1, 1])), {}, "k's pair 1 .* is zero"),
        ((np.array([1.0, np.nan, 1, 1]), np.ones(4)), {}, "q must be finite"),
        ((np.ones(4, dtype=bool), np.ones(4)), {}, "q must be a numeric array"),
    ],
)
def test_rope_figure_rejects_bad_input(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw.rope_figure(*args, **kwargs)


# ============================================================================= ALiBi

PAPER_SLOPES_4 = [1 / 4, 1 / 16, 1 / 64, 1 / 256]  # 2^(-8/4) and its powers


def slope_of(title: str) -> float:
    """The slope written in a title "head h, slope 1/N" (or a decimal)."""
    found = re.search(r"slope (1/(\d+)|[0-9.]+)$", title.strip())
    assert found, title
    return 1 / int(found.group(2)) if found.group(2) else float(found.group(1))


def test_alibi_grids_hold_minus_slope_times_distance_in_head_colours():
    fig = draw.alibi_figure(4, 3)
    grids = grid_axes(fig)
    assert len(grids) == 8  # 4 heads causal, then 4 heads symmetric
    steepest = PAPER_SLOPES_4[0] * 2  # the most negative bias drawn: head 0, distance 2
    for index, ax in enumerate(grids):
        h, causal = index % 4, index < 4
        slope = PAPER_SLOPES_4[h]
        want = np.array([[-slope * (i - j if causal else abs(i - j)) for j in range(3)]
                         for i in range(3)])
        blocked = np.array([[causal and j > i for j in range(3)] for i in range(3)])
        # three decimals: 1/256 must not read as 0.00
        assert gid_texts(ax, "value") == [f"{np.round(v, 3) + 0.0:.3f}"
                                          for v in want[~blocked]]
        fc = faces(ax, (3, 3))
        np.testing.assert_allclose(fc[blocked], np.broadcast_to(to_rgba(BLOCKED_FILL),
                                                                (int(blocked.sum()), 4)))
        np.testing.assert_allclose(fc[~blocked], draw.head_cmap(h)(-want[~blocked] / steepest),
                                   atol=1e-12)
        assert slope_of(ax.get_title()) == slope
        assert ax.get_title().strip() == f"head {h}, slope 1/{round(1 / slope)}"
        assert ax.title.get_color() == head_text_color(h)
    # the biases the figure writes are the specification's
    bias = mha.alibi_bias(4, 3)
    assert gid_texts(grids[1], "value") == [f"{np.round(v, 3) + 0.0:.3f}"
                                            for v in bias[1][np.tril(np.ones((3, 3), bool))]]
    legend = [t for t in fig.texts if t.get_text() == "blocked by the causal mask"]
    assert len(legend) == 1


def test_alibi_titles_follow_the_paper_for_other_head_counts():
    fig = draw.alibi_figure(3, 2, variants=("symmetric",), max_distance=None)
    # 3 heads: the slopes of 2 heads (1/16, 1/256), then the first of 4 heads' in between
    assert [slope_of(ax.get_title()) for ax in grid_axes(fig)] == [1 / 16, 1 / 256, 1 / 4]
    fig = draw.alibi_figure(12, 2, variants=("causal",), max_distance=None)
    titles = [ax.get_title().strip() for ax in grid_axes(fig)]
    assert titles[:8] == [f"head {h}, slope 1/{2 ** (h + 1)}" for h in range(8)]
    assert titles[8] == "head 8, slope 0.707"  # 2^(-1/2): no power of two
    np.testing.assert_allclose([slope_of(t) for t in titles], mha.alibi_slopes(12), rtol=2e-3)


def test_alibi_line_plot_is_bias_against_distance_per_head():
    fig = draw.alibi_figure(4, 3, max_distance=6)
    plot = [ax for ax in fig.axes if series(ax)]
    assert len(plot) == 1
    lines = series(plot[0])
    assert [line.get_label() for line in lines] == [
        f"head {h}, slope 1/{round(1 / s)}" for h, s in enumerate(PAPER_SLOPES_4)]
    for h, line in enumerate(lines):
        np.testing.assert_array_equal(line.get_xdata(), np.arange(7))
        np.testing.assert_allclose(line.get_ydata(), -PAPER_SLOPES_4[h] * np.arange(7),
                                   rtol=1e-15, atol=0)
        assert to_rgba(line.get_color()) == to_rgba(draw.head_color(h))
    assert plot[0].get_xlabel().startswith("distance")
    assert not [ax for ax in draw.alibi_figure(2, 2, max_distance=None).axes if series(ax)]


def test_alibi_queries_are_the_last_of_the_keys_when_decoding():
    fig = draw.alibi_figure(2, 2, num_keys=5, variants=("causal",))
    grids = grid_axes(fig)
    assert [t.get_text() for t in grids[0].get_yticklabels()] == ["3", "4"]
    assert [t.get_text() for t in grids[0].get_xticklabels()] == [str(j) for j in range(5)]
    bias = mha.alibi_bias(2, 2, num_keys=5)
    seen = np.array([[True] * 4 + [False], [True] * 5])  # key 4 is after query 3
    for h, (ax, slope) in enumerate(zip(grids, [1 / 16, 1 / 256], strict=True)):
        want = [-slope * (i - j) for i in (3, 4) for j in range(5) if j <= i]
        assert gid_texts(ax, "value") == [f"{np.round(v, 3) + 0.0:.3f}" for v in want]
        assert gid_texts(ax, "value") == [f"{np.round(v, 3) + 0.0:.3f}" for v in bias[h][seen]]


def test_alibi_values_and_rows_adapt_to_the_width():
    fig = draw.alibi_figure(8, 4)
    grids = grid_axes(fig)
    assert len(grids) == 16
    assert all(not gid_texts(ax, "value") for ax in grids)  # 8 heads of values do not fit
    tops = sorted({round(ax.get_position().y1, 6) for ax in grids})
    assert len(tops) == 4  # 2 rows per variant, 4 heads each
    fig = draw.alibi_figure(2, 3, decimals=1, show_values=True, variants=("symmetric",))
    # head 0 (slope 1/16), query 0: -0, -1/16, -2/16 rounded to one decimal
    assert gid_texts(grid_axes(fig)[0], "value")[:3] == ["0.0", "-0.1", "-0.1"]
    assert not any("blocked" in t.get_text() for t in fig.texts)  # no causal, no legend


def test_alibi_figure_checks_its_claim_on_the_arrays(monkeypatch):
    """A bias that forgets the slope's sign no longer matches what is drawn."""
    monkeypatch.setattr(positions, "alibi_bias", lambda *a, **kw: -mha.alibi_bias(*a, **kw))
    with pytest.raises(AssertionError):
        draw.alibi_figure(2, 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_heads": 0}, r"num_heads must be an int in \[1, 16\], got 0"),
        ({"num_heads": 2.0}, "num_heads must be an int"),
        ({"size": 13}, r"size must be an int in \[1, 12\]"),
        ({"size": 4, "num_keys": 3}, "num_keys=3 is smaller than size=4"),
        ({"variants": "causal"}, "variants must be a non-empty sequence"),
        ({"variants": ()}, "variants must be a non-empty sequence"),
        ({"variants": ("causal", "causal")}, "distinct names"),
        ({"variants": ("decoder",)}, r"from \('causal', 'symmetric'\)"),
        ({"decimals": -1}, r"decimals must be an int in \[0, 6\]"),
        ({"max_distance": 0}, r"max_distance must be an int in \[1, 64\]"),
    ],
)
def test_alibi_figure_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw.alibi_figure(**kwargs)


# ===================================================================== both figures

BUILDERS = {
    "rope": lambda: draw.rope_figure(*qk(), num_positions=3, size=3),
    "rope_slow_labels": lambda: draw.rope_figure(*qk(head_dim=4), num_positions=6, size=4,
                                                 offset=-2),
    "alibi": lambda: draw.alibi_figure(2, 2),
    "alibi_many": lambda: draw.alibi_figure(8, 4),
    "alibi_twelve": lambda: draw.alibi_figure(12, 2),
}


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_same_inputs_give_byte_identical_svg(name):
    first, second = svg(BUILDERS[name]()), svg(BUILDERS[name]())
    assert first == second
    assert b"<dc:date>" not in first and b"<image" not in first  # vector, no raster


@pytest.mark.parametrize("name", list(BUILDERS))
def test_figures_fit_the_text_width_with_readable_fonts(name):
    fig = BUILDERS[name]()
    renderer = rendered(fig)  # the constrained layout runs at drawing time
    width, _ = fig.get_size_inches()
    assert width <= MAX_WIDTH + 1e-9
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip()]
    assert sizes and min(sizes) >= 8
    assert fig.get_facecolor() == to_rgba("white")
    assert len(draw.alt_text(fig)) > 40
    # what the book shows is the tight box around everything drawn: that must fit too
    box = fig.get_tightbbox(renderer)  # inches
    assert box.width <= MAX_WIDTH + 1e-9


def test_alt_text_names_what_is_drawn():
    assert "slopes 1/4, 1/16, 1/64, 1/256" in draw.alt_text(draw.alibi_figure(4, 3))
    text = draw.alt_text(draw.rope_figure(*qk()))
    assert "Dh = 8" in text and "constant along each diagonal" in text

"""mha.draw.rope_figure: what is drawn equals the arrays it stands for.

Oracles: RoPE written out here pair by pair with ``math.cos`` / ``math.sin``, scores summed
here pair by pair; colours from the house palette and colour maps.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from figures import (
    assert_house_style,
    assert_reproducible,
    assert_tight_box_fits,
    faces,
    gid_texts,
    grid_axes,
    series,
)
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.patches import Arc, FancyArrowPatch
from numerics import EPS64

import mha
from mha import draw
from mha.draw import rope
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

    monkeypatch.setattr(rope, "apply_rope", squared)
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
        ((np.ones(4), np.ones(4, dtype=complex)), {}, "k must be real"),
    ],
)
def test_rope_figure_rejects_bad_input(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw.rope_figure(*args, **kwargs)


# ------------------------------------------------------------------------ house style

BUILDERS = {
    "rope": lambda: draw.rope_figure(*qk(), num_positions=3, size=3),
    "rope_slow_labels": lambda: draw.rope_figure(*qk(head_dim=4), num_positions=6, size=4,
                                                 offset=-2),
}


@pytest.mark.no_cover  # renders what other tests draw: tracing it again only slows it
def test_same_inputs_give_byte_identical_svg():
    assert_reproducible(BUILDERS["rope"])


@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.no_cover  # renders what other tests draw: tracing it again only slows it
def test_figures_fit_the_text_width_with_readable_fonts(name):
    fig = BUILDERS[name]()
    assert_house_style(fig)
    assert_tight_box_fits(fig)


def test_alt_text_names_what_is_drawn():
    text = draw.alt_text(draw.rope_figure(*qk()))
    assert "Dh = 8" in text and "constant along each diagonal" in text


def test_exported_from_mha_draw():
    assert draw.rope_figure is rope.rope_figure and "rope_figure" in draw.__all__

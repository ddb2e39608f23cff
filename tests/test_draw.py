"""mha.draw: check what is drawn (cells, colours, values, labels), not only that it runs.

Exact comparisons here are of copies: the texts of the very arrays a figure draws, colours
and data handed to it, grid extents (cell counts). Values the test computes on another path
than the figure are compared through :func:`fmt_clear`, positions with a tolerance.
"""

from __future__ import annotations

from collections.abc import Callable

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from figures import (
    assert_house_style,
    assert_reproducible,
    cells,
    faces,
    fig_texts,
    grid_axes,
    rendered,
    series,
)
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.text import Text
from numerics import matmul_tolerance

import mha
from mha import draw
from mha.draw.style import (
    ALLOWED_FILL,
    BLOCKED_FILL,
    MAX_WIDTH,
    head_text_color,
)
from mha.notebook import setup_figures

SRC = ["You", "are", "welcome"]
TGT = ["<s>", "De", "nada"]
OKABE_ITO = {"#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"}


@pytest.fixture(autouse=True)
def _figures():
    setup_figures()
    yield
    plt.close("all")


def x_known() -> np.ndarray:
    """(1, 3, 6) with distinct values 0.0, 0.1, ..., 1.7: each value marks one cell."""
    return (np.arange(18, dtype=float) / 10).reshape(1, 3, 6)


def steps_known(mask: np.ndarray | None = None):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1, 3, 6))
    params = mha.AttentionParams.init(6, seed=0)
    return mha.multi_head_attention_steps(x, x, x, params, 2, mask=mask)


def texts(ax: Axes) -> list[str]:
    """The values written in the cells, row-major."""
    return [t.get_text() for t in ax.texts if t.get_gid() == "value"]


def group_labels(ax: Axes) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_gid() == "group"]


def ticks(labels: list[Text]) -> list[str]:
    return [t.get_text() for t in labels]


def fmt(a: np.ndarray, decimals: int = 2) -> list[str]:
    """What a cell shows for each value of ``a``: rounded, never ``-0.00``."""
    return [f"{np.round(v, decimals) + 0.0:.{decimals}f}" for v in np.ravel(a)]


def fmt_clear(a: np.ndarray, apart: float, decimals: int = 2) -> list[str]:
    """:func:`fmt` of values computed on another path than the figure's, the two at most
    ``apart`` from each other. Their texts agree on any CPU only if no value lies within
    ``apart`` of a rounding tie (a 5 in the next decimal): that is asserted first."""
    scaled = np.abs(np.ravel(a)) * 10.0**decimals
    tie = float(np.abs(scaled - np.floor(scaled) - 0.5).min()) / 10.0**decimals
    assert tie > apart, f"a value lies {tie:.2g} from a rounding tie (<= {apart:.2g})"
    return fmt(a, decimals)



# --- colours -----------------------------------------------------------------------------


def test_head_colors_are_okabe_ito_distinct_and_fixed():
    assert set(draw.HEAD_COLORS) <= OKABE_ITO
    assert len(set(draw.HEAD_COLORS)) == len(draw.HEAD_COLORS)
    assert draw.head_color(0) == "#0072B2" and draw.head_color(1) == "#E69F00"
    assert draw.head_color(len(draw.HEAD_COLORS)) == draw.head_color(0)  # cycles


@pytest.mark.parametrize("bad", [-1, 1.5, True, "0"])
def test_head_color_rejects_non_index(bad):
    with pytest.raises(ValueError, match="head index"):
        draw.head_color(bad)


def test_head_fill_is_a_light_tint_of_the_head_colour():
    for h in range(len(draw.HEAD_COLORS)):
        fill = np.array(draw.head_fill(h)[:3])
        base = np.array(to_rgba(draw.head_color(h))[:3])
        assert np.all(fill >= base - 1e-12)  # lighter in every channel
        # same hue: fill - white is a positive multiple of base - white
        d_fill, d_base = 1 - fill, 1 - base
        np.testing.assert_allclose(d_fill, d_fill.max() / d_base.max() * d_base, atol=1e-12)


# --- tensor grid -------------------------------------------------------------------------


def test_tensor_grid_cells_values_labels_and_head_colours():
    fig = draw.tensor_grid(x_known(), ["B", "T", "D"], num_heads=2, tokens=SRC, title="x")
    (ax,) = grid_axes(fig)
    assert len(cells(ax).get_paths()) == 18
    assert texts(ax) == [f"{v:.2f}" for v in np.arange(18) / 10]
    assert ticks(ax.get_yticklabels()) == SRC
    assert ticks(ax.get_xticklabels()) == [str(i) for i in range(6)]
    assert ax.get_ylabel() == "T = 3" and ax.get_xlabel() == "D = 6"
    assert "x: (B, T, D) = (1, 3, 6)" in fig_texts(fig)
    fc = faces(ax, (3, 6))
    np.testing.assert_allclose(fc[:, :3], np.broadcast_to(draw.head_fill(0), (3, 3, 4)))
    np.testing.assert_allclose(fc[:, 3:], np.broadcast_to(draw.head_fill(1), (3, 3, 4)))
    assert fig.get_facecolor() == to_rgba("white")


def test_tensor_grid_4d_one_panel_per_head_titled_in_head_colour():
    per_head = mha.split_heads(x_known(), 2)  # (1, 2, 3, 3)
    fig = draw.tensor_grid(per_head, ["B", "H", "T", "Dh"], num_heads=2, tokens=SRC)
    axes = grid_axes(fig)
    assert [ax.get_title() for ax in axes] == ["h = 0", "h = 1"]
    for h, ax in enumerate(axes):
        assert ax.title.get_color() == head_text_color(h)
        np.testing.assert_allclose(faces(ax, (3, 3)), np.broadcast_to(draw.head_fill(h), (3, 3, 4)))
        assert texts(ax) == [f"{v:.2f}" for v in per_head[0, h].ravel()]


def test_tensor_grid_accepts_torch_and_rounds_without_negative_zero():
    x = torch.tensor([[-0.001, 1.23456], [np.inf * -1, 2.0]])
    fig = draw.tensor_grid(x, ["T", "S"], decimals=1)
    assert texts(grid_axes(fig)[0]) == ["0.0", "1.2", "-inf", "2.0"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"axis_names": ["T", "D"]}, "axis_names has 2 names"),
        ({"tokens": ["a", "b"]}, "tokens has 2 labels but axis T has size 3"),
        ({"num_heads": 4}, "num_heads=4 must divide axis D of size 6"),
        ({"num_heads": 2, "head_axis": "Q"}, "head_axis 'Q'"),
        ({"tokens": "You are welcome"}, "sequence of strings"),
    ],
)
def test_tensor_grid_rejects_mismatched_names_and_labels(kwargs, match):
    args = {"axis_names": ["B", "T", "D"], **kwargs}
    with pytest.raises(ValueError, match=match):
        draw.tensor_grid(x_known(), **args)


def test_tensor_grid_rejects_too_many_panels():
    with pytest.raises(ValueError, match="panels"):
        draw.tensor_grid(np.zeros((5, 4, 2, 2)), ["A", "B", "R", "C"])


# --- split and merge ---------------------------------------------------------------------


def _colour_of_value(axes: list[Axes], shapes: list[tuple[int, int]]) -> dict[str, tuple]:
    """Map each cell's text to its fill colour across the given panels."""
    out: dict[str, tuple] = {}
    for ax, shape in zip(axes, shapes, strict=True):
        for s, fc in zip(texts(ax), faces(ax, shape).reshape(-1, 4), strict=True):
            assert s not in out
            out[s] = tuple(np.round(fc, 6))
    return out


def test_split_heads_figure_keeps_each_cell_colour_through_the_steps():
    x = x_known()
    fig = draw.split_heads_figure(x, 2, tokens=SRC)
    axes = grid_axes(fig)
    assert len(axes) == 1 + 3 + 2  # (T, D); T panels of (H, Dh); H panels of (T, Dh)
    step1 = _colour_of_value(axes[:1], [(3, 6)])
    step2 = _colour_of_value(axes[1:4], [(2, 3)] * 3)
    step3 = _colour_of_value(axes[4:], [(3, 3)] * 2)
    assert step1 == step2 == step3 and len(step1) == 18
    per_head = mha.split_heads(x, 2)
    for h, ax in enumerate(axes[4:]):
        assert texts(ax) == [f"{v:.2f}" for v in per_head[0, h].ravel()]
        assert ticks(ax.get_yticklabels()) == SRC
    assert [ax.get_title() for ax in axes[1:4]] == ["t = 0 (You)", "t = 1 (are)", "t = 2 (welcome)"]
    captions = " ".join(fig_texts(fig))
    for shape in ("(B, T, D) = (1, 3, 6)", "(B, T, H, Dh) = (1, 3, 2, 3)",
                  "(B, H, T, Dh) = (1, 2, 3, 3)"):
        assert shape in captions
    assert captions.startswith("1. x:") and "split_heads(x, 2)" in captions


def test_split_heads_figure_names_what_it_splits():
    captions = " ".join(fig_texts(draw.split_heads_figure(x_known(), 2, name="Q")))
    assert captions.startswith("1. Q: (B, T, D)") and "= split_heads(Q, 2)" in captions
    assert "1. x" not in captions and "(x, 2)" not in captions


def test_merge_heads_figure_ends_with_merge_heads_values():
    per_head = mha.split_heads(x_known(), 2)
    fig = draw.merge_heads_figure(per_head, tokens=SRC)
    axes = grid_axes(fig)
    assert len(axes) == 2 + 3 + 1
    assert texts(axes[-1]) == [f"{v:.2f}" for v in mha.merge_heads(per_head).ravel()]
    assert _colour_of_value(axes[:2], [(3, 3)] * 2) == _colour_of_value(axes[-1:], [(3, 6)])


def test_split_heads_figure_draws_the_requested_sample_and_checks_shapes():
    x = np.concatenate([x_known(), -x_known() - 1], axis=0)  # (2, 3, 6)
    fig = draw.split_heads_figure(x, 3, batch=1)
    assert texts(grid_axes(fig)[0])[0] == "-1.00"
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, D\)"):
        draw.split_heads_figure(x[0], 2)
    with pytest.raises(ValueError, match="batch must be an int in"):
        draw.split_heads_figure(x, 2, batch=2)
    with pytest.raises(ValueError, match="num_heads=4 must divide"):
        draw.split_heads_figure(x, 4)
    with pytest.raises(ValueError, match=r"x must have shape \(B, H, T, Dh\)"):
        draw.merge_heads_figure(x)


# --- weights -----------------------------------------------------------------------------


def test_weight_matrix_figure_colours_columns_or_rows_by_head():
    W = np.arange(36, dtype=float).reshape(6, 6) / 100
    fig = draw.weight_matrix_figure(W, 2, name="W_q")
    (ax,) = grid_axes(fig)
    fc = faces(ax, (6, 6))
    assert np.allclose(fc[:, :3], draw.head_fill(0)) and np.allclose(fc[:, 3:], draw.head_fill(1))
    assert texts(ax) == [f"{v:.2f}" for v in W.ravel()]
    assert group_labels(ax) == ["head 0", "head 1"]
    bands = [p for p in ax.patches if p.get_gid() == "group"]
    assert [to_rgba(b.get_facecolor())[:3] for b in bands] == [
        to_rgba(draw.head_color(h))[:3] for h in range(2)
    ]
    fig_o = draw.weight_matrix_figure(W, 3, name="W_o", partition="rows")
    fc = faces(grid_axes(fig_o)[0], (6, 6))
    for h in range(3):
        assert np.allclose(fc[2 * h : 2 * h + 2], draw.head_fill(h))
    with pytest.raises(ValueError, match="partition"):
        draw.weight_matrix_figure(W, 2, partition="diagonal")
    with pytest.raises(ValueError, match=r"W must have shape \(D_in, D_out\)"):
        draw.weight_matrix_figure(W[None], 2)


def test_matmul_per_head_figure_shows_the_head_products():
    x = x_known()
    W = mha.AttentionParams.init(6, seed=0).W_q
    fig = draw.matmul_per_head_figure(x, W, 2, tokens=SRC, decimals=2)
    axes = {ax.get_title(): ax for ax in grid_axes(fig)}
    assert {"x @ W_q", "W_q", "W_q[:, 0:3]", "W_q[:, 3:6]", "x @ W_q[:, 0:3]",
            "x @ W_q[:, 3:6]"} <= set(axes)
    q = x[0] @ W  # the figure's own product, repeated: exact
    assert texts(axes["x @ W_q"]) == fmt(q)
    # The figure multiplies by W's last 3 columns alone: another summation than q's.
    apart = float(matmul_tolerance(x[0], W[:, 3:]).max())
    assert texts(axes["x @ W_q[:, 3:6]"]) == fmt_clear(q[:, 3:], apart)
    assert np.allclose(faces(axes["x @ W_q[:, 3:6]"], (3, 3)), draw.head_fill(1))
    assert ticks(axes["x @ W_q[:, 3:6]"].get_xticklabels()) == ["3", "4", "5"]
    # The products have no bias: no grid may be titled as if it were Q itself.
    assert not {"Q", "Q_0", "Q_1"} & set(axes)
    assert "Q before its bias is added" in " ".join(fig_texts(fig))
    with pytest.raises(ValueError, match="D_in differs"):
        draw.matmul_per_head_figure(x, W[:4], 2)


# --- the whole layer ----------------------------------------------------------------------


def test_multi_head_attention_figure_draws_every_step_at_its_shape():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 4, 6))
    params = mha.AttentionParams.init(6, seed=3)
    mask = mha.padding_mask(lengths=np.array([4, 3]), max_len=4)
    tokens = ["nice", "to", "meet", "<pad>"]
    fig = draw.multi_head_attention_figure(x, params, 2, mask=mask, batch=1, tokens=tokens)
    steps = mha.multi_head_attention_steps(x, x, x, params, 2, mask=mask)
    axes = {ax.get_title(): ax for ax in grid_axes(fig)}
    shapes = {"x": (4, 6), "Q": (4, 6), "K": (4, 6), "V": (4, 6), "merged": (4, 6),
              "W_o": (6, 6), "output": (4, 6)}
    for h in range(2):
        shapes |= {f"Q_{h}": (4, 3), f"K_{h}": (4, 3), f"V_{h}": (4, 3),
                   f"weights_{h}": (4, 4), f"context_{h}": (4, 3)}
    assert set(axes) == set(shapes)
    for title, shape in shapes.items():
        assert faces(axes[title], shape).shape == (*shape, 4), title
    # Heads keep their colour from Q to the split, the merge and W_o's rows.
    fq = faces(axes["Q"], (4, 6))
    assert np.allclose(fq[:, :3], draw.head_fill(0)) and np.allclose(fq[:, 3:], draw.head_fill(1))
    assert np.allclose(faces(axes["merged"], (4, 6)), fq)
    fo = faces(axes["W_o"], (6, 6))
    assert np.allclose(fo[:3], draw.head_fill(0)) and np.allclose(fo[3:], draw.head_fill(1))
    assert np.allclose(faces(axes["K_1"], (4, 3)), draw.head_fill(1))
    # The weights are sample 1's, shaded by value: the <pad> key column is white.
    for h in range(2):
        shade = draw.head_cmap(h)(steps.weights[1, h])
        assert np.allclose(faces(axes[f"weights_{h}"], (4, 4)), shade)
        assert np.allclose(faces(axes[f"weights_{h}"], (4, 4))[:, 3], to_rgba("white"))
    assert ticks(axes["x"].get_yticklabels()) == tokens
    captions = " ".join(fig_texts(fig))
    for shape in ("(B, T, D) = (1, 4, 6)", "(B, H, T, Dh) = (1, 2, 4, 3)",
                  "(B, H, T, S) = (1, 2, 4, 4)", "W_o + b_o"):
        assert shape in captions
    assert fig.get_size_inches()[0] <= MAX_WIDTH
    assert "2 heads of 3" in draw.alt_text(fig)


def test_multi_head_attention_figure_rejects_bad_input():
    x = np.zeros((1, 3, 6))
    params = mha.AttentionParams.init(6)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, D\)"):
        draw.multi_head_attention_figure(x[0], params, 2)
    with pytest.raises(ValueError, match="batch must be an int in"):
        draw.multi_head_attention_figure(x, params, 2, batch=1)
    with pytest.raises(ValueError, match="tokens has 2 labels"):
        draw.multi_head_attention_figure(x, params, 2, tokens=["a", "b"])
    with pytest.raises(ValueError, match="num_heads"):
        draw.multi_head_attention_figure(x, params, 4)


# --- inference: the KV cache and shared key/value heads ----------------------------------


def test_kv_cache_figure_grows_the_cache_one_column_per_step():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1, 4, 8))
    params = mha.AttentionParams.init(8, seed=2, kv_dim=4)  # 4 query heads, 2 kv heads
    tokens = ["<s>", "a", "b", "c"]
    fig = draw.kv_cache_figure(x, params, 4, head=3, tokens=tokens)
    full = mha.multi_head_attention_steps(x, x, x, params, 4, mask=mha.causal_mask(4))
    axes = grid_axes(fig)
    assert len(axes) == 4 * 4  # q, K^T, weights, V per step
    for t in range(4):
        q_ax, k_ax, w_ax, v_ax = axes[4 * t: 4 * t + 4]
        assert [ax.get_title() for ax in (q_ax, k_ax, w_ax, v_ax)] == [
            "q, head 3", "cached K^T", "weights", "cached V"]
        # K^T is (Dh, t + 1): the newest key (of kv head 3 // 2 = 1) coloured, the rest grey.
        fk = faces(k_ax, (2, t + 1))
        assert np.allclose(fk[:, t], draw.head_fill(3))
        assert np.allclose(fk[:, :t], to_rgba("#EEEEEE"))
        assert ticks(k_ax.get_xticklabels()) == tokens[: t + 1]
        assert faces(v_ax, (t + 1, 2)).shape == (t + 1, 2, 4)
        # The weights written in are row t of one causal pass, head 3 (the figure checks
        # its cached step against that pass to 1e-12 + 1e-12 |w|, |w| <= 1).
        assert texts(w_ax) == fmt_clear(full.weights[0, 3, t, : t + 1], apart=2e-12)
    assert "'c' arrives" in " ".join(fig_texts(fig))
    assert fig.get_size_inches()[0] <= MAX_WIDTH


def test_kv_cache_figure_with_a_window_keeps_the_last_positions_only():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(1, 5, 8))
    params = mha.AttentionParams.init(8, seed=2)
    tokens = ["a", "b", "c", "d", "e"]
    fig = draw.kv_cache_figure(x, params, 4, head=0, tokens=tokens, window=2)
    band = mha.multi_head_attention_steps(x, x, x, params, 4,
                                          mask=mha.sliding_window_mask(5, 2))
    axes = grid_axes(fig)
    for t in range(5):
        _, k_ax, w_ax, v_ax = axes[4 * t: 4 * t + 4]
        first = max(0, t - 1)
        assert ticks(k_ax.get_xticklabels()) == tokens[first: t + 1]
        assert texts(w_ax) == fmt_clear(band.weights[0, 0, t, first: t + 1], apart=2e-12)
        assert faces(v_ax, (t + 1 - first, 2)).shape == (t + 1 - first, 2, 4)
    captions = " ".join(fig_texts(fig))
    assert "holds 2, 'c' dropped" in captions and "'e' dropped" not in captions
    assert "at most 2 columns" in draw.alt_text(fig)


def test_kv_cache_figure_rejects_bad_input():
    params = mha.AttentionParams.init(8, kv_dim=4)
    with pytest.raises(ValueError, match=r"one sequence, shape \(1, T, D\)"):
        draw.kv_cache_figure(np.zeros((2, 3, 8)), params, 4)
    with pytest.raises(ValueError, match="head must be an int in"):
        draw.kv_cache_figure(np.zeros((1, 3, 8)), params, 4, head=4)
    with pytest.raises(ValueError, match="tokens has 2 labels"):
        draw.kv_cache_figure(np.zeros((1, 3, 8)), params, 4, tokens=["a", "b"])
    with pytest.raises(ValueError, match="num_heads"):
        draw.kv_cache_figure(np.zeros((1, 3, 8)), params, 3)


@pytest.mark.parametrize(("num_kv_heads", "kind"), [(4, "multi-head"), (2, "grouped-query"),
                                                    (1, "multi-query")])
def test_grouped_heads_figure_colours_query_heads_by_their_kv_head(num_kv_heads, kind):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(1, 3, 8))
    params = mha.AttentionParams.init(8, seed=4, kv_dim=2 * num_kv_heads)
    fig = draw.grouped_heads_figure(x, params, 4, tokens=["a", "b", "c"])
    steps = mha.multi_head_attention_steps(x, x, x, params, 4, mask=mha.causal_mask(3))
    group = 4 // num_kv_heads
    axes = {ax.get_title(): ax for ax in grid_axes(fig)}
    expected = {f"K_{g}" for g in range(num_kv_heads)} | {f"V_{g}" for g in range(num_kv_heads)}
    expected |= {f"Q_{h} → K_{h // group}" for h in range(4)}
    expected |= {f"weights_{h}" for h in range(4)}
    assert set(axes) == expected
    for h in range(4):
        g = h // group
        assert np.allclose(faces(axes[f"Q_{h} → K_{g}"], (3, 2)), draw.head_fill(g))
        shade = draw.head_cmap(g)(steps.weights[0, h])
        assert np.allclose(faces(axes[f"weights_{h}"], (3, 3)), shade)
    assert kind in " ".join(fig_texts(fig))
    assert f"{num_kv_heads} key/value heads" in draw.alt_text(fig)


def test_grouped_heads_figure_rejects_bad_input():
    params = mha.AttentionParams.init(8, kv_dim=4)
    with pytest.raises(ValueError, match=r"one sequence"):
        draw.grouped_heads_figure(np.zeros((2, 3, 8)), params, 4)
    with pytest.raises(ValueError, match="num_kv_heads|num_heads"):
        draw.grouped_heads_figure(np.zeros((1, 3, 8)), params, 3)


# --- one head's pipeline -----------------------------------------------------------------


def test_attention_pipeline_figure_panels_values_and_mask():
    steps = steps_known(mha.causal_mask(3))
    fig = draw.attention_pipeline_figure(steps, head=1, query_tokens=TGT, key_tokens=TGT)
    axes = grid_axes(fig)
    assert [ax.get_title() for ax in axes] == [
        "Q_1", "K_1^T", "scores", "scaled", "masked", "weights", "weights", "V_1", "context_1",
    ]
    by = dict(zip([ax.get_title() for ax in axes], axes, strict=False))
    masked = texts(by["masked"])
    blocked = ~mha.causal_mask(3)
    assert [s == "-inf" for s in masked] == list(blocked.ravel())
    fc = faces(by["masked"], (3, 3))
    assert np.allclose(fc[blocked], to_rgba(BLOCKED_FILL))
    assert texts(by["weights"]) == fmt(steps.weights[0, 1])
    assert texts(by["context_1"]) == fmt(steps.context[0, 1])
    assert ticks(by["scores"].get_yticklabels()) == TGT
    assert ticks(by["K_1^T"].get_xticklabels()) == TGT
    # the weights are shaded in head 1's colour: weight 1 is the colour itself
    w = faces(by["weights"], (3, 3))
    np.testing.assert_allclose(w[0, 0], to_rgba(draw.head_color(1)), atol=1e-2)


def test_attention_pipeline_figure_draws_k_transposed():
    """K_h^T is drawn (Dh, S): a row per dimension, a column per key. The case above has
    T = S = Dh = 3, where K (S, Dh) has the same shape; here T = 2, S = 4, Dh = 3."""
    rng = np.random.default_rng(8)
    x_q, x_kv = rng.normal(size=(1, 2, 6)), rng.normal(size=(1, 4, 6))  # (B, T, D), (B, S, D)
    params = mha.AttentionParams.init(6, seed=5)
    steps = mha.multi_head_attention_steps(x_q, x_kv, x_kv, params, 2)  # Dh = 6 / 2
    keys = ["a", "b", "c", "d"]
    fig = draw.attention_pipeline_figure(steps, head=1, query_tokens=TGT[1:], key_tokens=keys)
    by = {ax.get_title(): ax for ax in grid_axes(fig)}
    k_t = by["K_1^T"]
    assert ticks(k_t.get_yticklabels()) == ["0", "1", "2"] and k_t.get_ylabel() == "Dh = 3"
    assert ticks(k_t.get_xticklabels()) == keys and k_t.get_xlabel() == "key"
    assert texts(k_t) == fmt(steps.k_heads[0, 1].T)  # row-major: dimension 0 of every key
    # Each grid spans (0, columns) x (rows, 0): cell counts, exact. Q_1 @ K_1^T = scores.
    shapes = {"Q_1": (2, 3), "K_1^T": (3, 4), "scores": (2, 4), "V_1": (4, 3),
              "context_1": (2, 3)}
    for title, (rows, cols) in shapes.items():
        assert (by[title].get_ylim(), by[title].get_xlim()) == ((rows, 0), (0, cols)), title
    assert "Q_1 @ K_1^T: (2, 3) @ (3, 4) -> (2, 4)" in " ".join(fig_texts(fig))


def test_attention_pipeline_figure_rejects_bad_input():
    steps = steps_known()
    with pytest.raises(ValueError, match="head must be an int in"):
        draw.attention_pipeline_figure(steps, head=2)
    with pytest.raises(ValueError, match="query_tokens has 2 labels"):
        draw.attention_pipeline_figure(steps, query_tokens=["a", "b"])
    with pytest.raises(ValueError, match="AttentionSteps"):
        draw.attention_pipeline_figure(object())


# --- masks -------------------------------------------------------------------------------


def test_masks_figure_cells_follow_the_mask_and_legend_says_true_may_attend():
    pad = mha.padding_mask(np.array([3, 2]))  # (2, 1, 1, 3)
    causal = mha.causal_mask(3)
    cross = np.array([[True, True, False]] * 2)  # (T=2, S=3)
    panels = [
        draw.MaskPanel(pad, "padding", SRC, SRC),
        draw.MaskPanel(causal, "causal", TGT, TGT),
        draw.MaskPanel(mha.combine_masks(pad, causal), "both", SRC, SRC),
        draw.MaskPanel(cross, "cross", TGT[1:], SRC),
    ]
    fig = draw.masks_figure(panels, batch=1)
    axes = grid_axes(fig)
    assert [ax.get_title() for ax in axes] == ["padding", "causal", "both", "cross"]
    expected = [
        np.broadcast_to(pad[1, 0], (3, 3)),
        causal,
        mha.combine_masks(pad, causal)[1, 0],
        cross,
    ]
    for ax, m in zip(axes, expected, strict=True):
        fc = faces(ax, m.shape)
        assert np.allclose(fc[m], to_rgba(ALLOWED_FILL))
        assert np.allclose(fc[~m], to_rgba(BLOCKED_FILL))
    assert ticks(axes[3].get_yticklabels()) == TGT[1:]
    assert ticks(axes[3].get_xticklabels()) == SRC
    assert "True = may attend" in fig_texts(fig) and "False = blocked" in fig_texts(fig)


@pytest.mark.parametrize("per_row", [0, 1.5, True])
def test_masks_figure_rejects_a_per_row_that_is_not_a_positive_integer(per_row):
    panel = draw.MaskPanel(mha.causal_mask(3), "causal")
    with pytest.raises(ValueError, match="per_row must be a positive integer"):
        draw.masks_figure([panel], per_row=per_row)


def test_mask_figure_rejects_bad_masks():
    with pytest.raises(ValueError, match=r"mask must be a boolean array .* dtype float64"):
        draw.mask_figure(np.ones((3, 3)))
    with pytest.raises(ValueError, match="key_tokens has 2 labels but axis S has size 3"):
        draw.mask_figure(mha.causal_mask(3), key_tokens=["a", "b"])
    with pytest.raises(ValueError, match="different heads"):
        draw.mask_figure(np.ones((1, 2, 3, 3), bool))


def test_padding_mask_figure_writes_tokens_and_darkens_padding():
    pad = mha.padding_mask(np.array([3, 2]))
    tokens = [SRC, ["Thank", "you", "<pad>"]]
    fig = draw.padding_mask_figure(pad, tokens)
    (ax,) = grid_axes(fig)
    assert texts(ax) == SRC + ["Thank", "you", "<pad>"]
    fc = faces(ax, (2, 3))
    assert np.allclose(fc[1, 2], to_rgba(BLOCKED_FILL)) and np.allclose(fc[0], to_rgba("white"))
    with pytest.raises(ValueError, match=r"tokens\[1\] has 2 labels"):
        draw.padding_mask_figure(pad, [SRC, ["Thank", "you"]])
    with pytest.raises(ValueError, match=r"mask must be a boolean array .* dtype int64"):
        draw.padding_mask_figure(pad.astype(np.int64), tokens)


# --- heatmaps ----------------------------------------------------------------------------


def test_attention_heatmaps_one_panel_per_head_in_its_colour():
    w = steps_known().weights  # (1, 2, 3, 3)
    fig = draw.attention_heatmaps(w, query_tokens=TGT, key_tokens=SRC)
    axes = grid_axes(fig)
    assert [ax.get_title() for ax in axes] == ["head 0", "head 1"]
    for h, ax in enumerate(axes):
        coll = cells(ax)
        np.testing.assert_array_equal(coll.get_array(), w[0, h].ravel())  # a copy: exact
        assert coll.get_cmap()(1.0) == to_rgba(draw.head_color(h))  # the map's end: a copy
        assert coll.norm.vmin == 0 and coll.norm.vmax == 1
        assert ticks(ax.get_yticklabels()) == TGT and ticks(ax.get_xticklabels()) == SRC
        assert texts(ax) == fmt(w[0, h])
    assert len(fig.axes) == 4  # two colour bars


def test_attention_grid_layers_by_heads():
    w = steps_known().weights
    fig = draw.attention_grid([w, w[:, ::-1]], query_tokens=SRC, key_tokens=SRC)
    axes = grid_axes(fig)
    assert len(axes) == 4
    np.testing.assert_array_equal(cells(axes[2]).get_array(), w[0, 1].ravel())  # a copy
    assert {"layer 0", "layer 1"} <= set(fig_texts(fig))
    with pytest.raises(ValueError, match=r"weights\[1\] has per-sample shape"):
        draw.attention_grid([w, w[:, :1]])
    with pytest.raises(ValueError, match="non-empty list"):
        draw.attention_grid(w)


def test_attention_heatmaps_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"weights must have shape \(B, H, T, S\)"):
        draw.attention_heatmaps(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="key_tokens has 2 labels"):
        draw.attention_heatmaps(np.zeros((2, 3, 3)), key_tokens=["a", "b"])


# --- the Transformer ---------------------------------------------------------------------


def test_transformer_figure_highlights_the_three_attentions():
    fig = draw.transformer_figure()
    (ax,) = fig.axes
    boxes = [p for p in ax.patches if p.get_gid() == "attention"]
    assert [to_rgba(b.get_edgecolor()) for b in boxes] == [
        to_rgba(c) for c in draw.ATTENTION_COLORS.values()
    ]
    labels = " ".join(t.get_text() for t in ax.texts)
    for name in ("encoder self-attention", "decoder causal self-attention", "cross-attention",
                 "K, V", "Q", "You are welcome", "<s> De nada"):
        assert name in labels
    assert len([p for p in ax.patches if p.get_gid() == "layer"]) == 2


def test_transformer_figure_keeps_every_label_inside_its_box():
    """A box's label fits the box, with a margin for the border."""
    fig = draw.transformer_figure()
    (ax,) = fig.axes
    renderer = fig.canvas.get_renderer()
    boxes = [p.get_window_extent(renderer) for p in ax.patches
             if p.get_gid() in {"attention", "block"}]
    checked = 0
    for text in ax.texts:
        bb = text.get_window_extent(renderer)
        centre = ((bb.x0 + bb.x1) / 2, (bb.y0 + bb.y1) / 2)
        around = [b for b in boxes if b.contains(*centre)]
        if not around:
            continue  # a label outside the boxes (title, arrows, sentences)
        box = min(around, key=lambda b: b.width)  # the innermost
        assert box.x0 + 2 <= bb.x0 and bb.x1 <= box.x1 - 2, text.get_text()
        assert box.y0 <= bb.y0 and bb.y1 <= box.y1, text.get_text()
        checked += 1
    assert checked == len(boxes) == 14  # one label in each of the 14 boxes
    plt.close(fig)


def test_transformer_figure_draws_a_residual_round_every_sublayer():
    fig = draw.transformer_figure()
    (ax,) = fig.axes
    arrows = [p for p in ax.patches if p.get_gid() == "residual"]
    assert len(arrows) == 5  # encoder: attention, feed-forward; decoder: 2 attentions, ff
    add_norm = [t for t in ax.texts if t.get_text() == "add & norm"]
    assert len(add_norm) == 5
    boxes = [p for p in ax.patches if p.get_gid() == "block"]
    ends = set()
    for arrow in arrows:
        (x0, y0), (x1, y1) = arrow._posA_posB
        # drawn leftwards, into a box's right edge; both ends at one y (exact)
        assert x1 < x0 and y0 == y1
        (box,) = [b for b in boxes if abs(b.get_x() + b.get_width() - x1) < 1e-9
                  and b.get_y() < y1 < b.get_y() + b.get_height()]
        centre = (box.get_x() + box.get_width() / 2, box.get_y() + box.get_height() / 2)
        (label,) = [t for t in ax.texts if np.allclose(t.get_position(), centre)]
        assert label.get_text() == "add & norm" and np.isclose(y1, centre[1])
        ends.add(centre)
    assert len(ends) == 5  # a different add & norm for each
    lines = [ln for ln in ax.get_lines() if ln.get_gid() == "residual"]
    assert len(lines) == 10  # one path and one junction dot each


def test_transformer_figure_predicts_the_target_shifted_left():
    fig = draw.transformer_figure(source="the black cats", target="<s> los gatos negros")
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert "probabilities of the next token: los gatos negros </s>" in labels
    assert not any("De nada" in label for label in labels)
    plt.close(fig)


# --- line plots and vectors --------------------------------------------------------------


def legend_texts(ax: Axes) -> list[str]:
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


def two_panels() -> Figure:
    x = np.array([1.0, 2.0, 4.0, 8.0])
    return draw.curves_figure([
        draw.CurvePanel([draw.Series(x, x**2, "square", marker="o"),
                         draw.Series(x, 3 * x, "triple", linestyle="--")],
                        title="left", xlabel="n", ylabel="cost", logx=True, logy=True,
                        log_base=2),
        draw.CurvePanel([draw.Series([0, 1, 2], [0.5, 0.25, 0.125], "halves")],
                        title="right", hlines=[draw.RefLine(0.3, "floor"),
                                               draw.RefLine(0.0)], legend=None),
    ])


def test_curves_figure_draws_each_series_with_its_data_and_label():
    left, right = two_panels().axes
    lines = series(left)
    assert [line.get_label() for line in lines] == ["square", "triple"]
    np.testing.assert_array_equal(lines[0].get_xdata(), [1, 2, 4, 8])
    np.testing.assert_array_equal(lines[0].get_ydata(), [1, 4, 16, 64])
    np.testing.assert_array_equal(lines[1].get_ydata(), [3, 6, 12, 24])
    assert lines[0].get_marker() == "o" and lines[1].get_linestyle() == "--"
    # the book's palette, in order
    assert [to_rgba(line.get_color()) for line in lines] == [
        to_rgba(draw.head_color(0)), to_rgba(draw.head_color(1))]
    assert legend_texts(left) == ["square", "triple"]
    assert left.get_xscale() == "log" and left.get_yscale() == "log"
    assert left.xaxis.get_transform().base == 2
    assert (left.get_title(), left.get_xlabel(), left.get_ylabel()) == ("left", "n", "cost")
    assert right.get_xscale() == "linear" and right.get_title() == "right"
    np.testing.assert_array_equal(series(right)[0].get_ydata(), [0.5, 0.25, 0.125])


def test_curves_figure_reference_lines_and_legend_switch():
    right = two_panels().axes[1]
    hlines = [line for line in right.get_lines() if line.get_gid() == "hline"]
    assert [tuple(line.get_ydata()) for line in hlines] == [(0.3, 0.3), (0.0, 0.0)]
    assert hlines[0].get_linestyle() == "--"
    assert right.get_legend() is None  # legend=None
    fig = draw.curves_figure(draw.CurvePanel(
        [draw.Series([1, 2], [1, 2], "y")], hlines=[draw.RefLine(1.5, "floor"),
                                                    draw.RefLine(0.5)]))
    assert legend_texts(fig.axes[0]) == ["y", "floor"]  # unlabelled lines stay out


def test_curves_figure_secondary_axis_and_point_labels():
    fig = draw.curves_figure(draw.CurvePanel(
        [draw.Series([1, 2, 3], [3.0, 2.0, 1.0], "loss"),
         draw.Series([1, 2, 3], [0.1, 0.2, 0.3], "lr", secondary=True),
         draw.Series([2], [2.5], "k0", marker="o", linestyle="", annotate=True)],
        ylabel="loss", ylabel2="learning rate", ylim=(0, None)))
    main, twin = fig.axes
    assert [line.get_label() for line in series(main)] == ["loss", "k0"]
    (lr,) = series(twin)
    np.testing.assert_array_equal(lr.get_ydata(), [0.1, 0.2, 0.3])
    assert twin.get_ylabel() == "learning rate" and main.get_ylim()[0] == 0
    assert to_rgba(twin.yaxis.label.get_color()) == to_rgba(lr.get_color())
    assert legend_texts(twin) == ["loss", "lr"]  # the annotated point is not in the legend
    notes = [t.get_text() for t in main.texts if t.get_gid() == "point_label"]
    assert notes == ["k0"]
    assert series(main)[1].get_linestyle() == "None"


@pytest.mark.parametrize(
    ("panels", "kwargs", "message"),
    [
        ([], {}, "non-empty sequence"),
        ([draw.CurvePanel([])], {}, r"panels\[0\].series must be a non-empty"),
        ([draw.CurvePanel([draw.Series([1, 2, 3], [1, 2], "a")])], {},
         r"panels\[0\].series\[0\].x and .*shapes \(3,\) and \(2,\)"),
        ([draw.CurvePanel([draw.Series(np.ones((2, 2)), np.ones((2, 2)))])], {}, "1-D"),
        ([draw.CurvePanel([draw.Series([0, 1], [1, 2])], logx=True)], {}, "positive on a log x"),
        ([draw.CurvePanel([draw.Series([1, 2], [1, 2])])], {"width": 9}, "width must be"),
        ([draw.CurvePanel([draw.Series([1, 2], [1, 2])])], {"width_ratios": [1, 2]},
         "width_ratios has 2 entries"),
        (["not a panel"], {}, "must be a draw.CurvePanel"),
    ],
)
def test_curves_figure_rejects_bad_input(panels, kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw.curves_figure(panels, **kwargs)


def arrows(ax: Axes) -> list:
    return [p for p in ax.patches if p.get_gid() == "vector"]


def test_vectors_figure_draws_one_labelled_arrow_per_vector():
    keys = np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, -0.5]])
    fig = draw.vectors_figure(keys, np.array([0.5, 0.5]), labels=["a", "b", "c"],
                              title="keys")
    (ax,) = fig.axes
    drawn = arrows(ax)
    assert len(drawn) == 4  # three vectors and the query
    # each arrow runs from the origin to its vector's tip
    for arrow, tip in zip(drawn, [*keys, [0.5, 0.5]], strict=True):
        start, end = arrow._posA_posB
        assert start == (0.0, 0.0)
        np.testing.assert_array_equal(end, tip)
    assert [to_rgba(a.get_edgecolor()) for a in drawn[:3]] == [
        to_rgba(draw.head_color(i)) for i in range(3)]
    assert to_rgba(drawn[3].get_edgecolor()) == to_rgba("black")
    labels = [t for t in ax.texts if t.get_gid() == "vector_label"]
    assert [t.get_text() for t in labels] == ["a", "b", "c", "q"]
    assert [t.xy for t in labels] == [tuple(k) for k in keys] + [(0.5, 0.5)]
    assert ax.get_aspect() == 1.0 and ax.get_title() == "keys"
    # every tip is inside the axes
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    assert x0 < -1 and x1 > 1 and y0 < -0.5 and y1 > 2
    assert "labelled a, b, c" in draw.alt_text(fig)


def test_vectors_figure_keeps_arrows_of_one_direction_apart():
    """Chapter 6's keys: k1 (length 1) and k4 (length 2.5) point the same way, as do
    k0 and the query. On screen each pair is drawn side by side, not one on the other,
    and each label sits on its own arrow's outer side, not between the two."""
    deg = np.deg2rad
    keys = np.array([[np.cos(deg(a)), np.sin(deg(a))] for a in (30, 90, 120, 210)]
                    + [[0.0, 2.5]])
    query = 1.5 * np.array([np.cos(deg(30)), np.sin(deg(30))])
    fig = draw.vectors_figure(keys, query, labels=[f"k{i}" for i in range(5)])
    (ax,) = fig.axes
    fig.canvas.draw()
    drawn = arrows(ax)
    labels = [t for t in ax.texts if t.get_gid() == "vector_label"]

    def on_screen(i):
        """Start, end (pixels) of arrow i, and the unit normal to its direction."""
        start, end = drawn[i].get_transform().transform(np.array(drawn[i]._posA_posB))
        along = (end - start) / np.linalg.norm(end - start)
        return start, end, np.array([-along[1], along[0]])

    for short, long in ((1, 4), (0, 5)):  # k1 under k4; k0 under the query (index 5)
        s0, s1, normal = on_screen(short)
        l0, _, _ = on_screen(long)
        gap = float(np.dot(l0 - s0, normal))  # signed distance between the two lines
        assert abs(gap) >= 3.0, (short, long, gap)  # pixels at 100 dpi: both visible
        for i, line_start in ((short, s0), (long, l0)):
            text = labels[i].get_window_extent().get_points().mean(axis=0)
            own = float(np.dot(text - line_start, normal))
            other = float(np.dot(text - (l0 if i == short else s0), normal))
            assert abs(own) < abs(other), f"label {labels[i].get_text()} nearer the other arrow"
    # arrows that point elsewhere are not moved
    s0, _, _ = on_screen(2)
    np.testing.assert_allclose(s0, ax.transData.transform((0.0, 0.0)), atol=1e-9)


def test_vectors_figure_default_labels_and_no_query():
    fig = draw.vectors_figure(torch.tensor([[1.0, 1.0], [2.0, -1.0]]))
    ax = fig.axes[0]
    assert len(arrows(ax)) == 2
    assert [t.get_text() for t in ax.texts if t.get_gid() == "vector_label"] == ["v0", "v1"]


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((np.ones((3, 3)),), {}, r"vectors must have shape \(N, 2\).*\(3, 3\)"),
        ((np.ones(2),), {}, r"vectors must have shape \(N, 2\)"),
        ((np.ones((0, 2)),), {}, "N >= 1"),
        ((np.ones((2, 2)), np.ones(3)), {}, r"query must have shape \(2,\), got shape \(3,\)"),
        ((np.ones((2, 2)),), {"labels": ["a"]}, r"labels must have one entry per vector \(N = 2"),
        ((np.ones((2, 2)),), {"colors": ["red"]}, "colors must have one entry"),
        ((np.array([[1.0, np.nan]]),), {}, "finite"),
    ],
)
def test_vectors_figure_rejects_bad_input(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw.vectors_figure(*args, **kwargs)


# --- every figure: deterministic, readable, described ------------------------------------


def _builders(t: int = 3, d: int = 6) -> dict[str, Callable[[], Figure]]:
    """One call per drawing function; the running example's sizes by default."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, t, d))
    params = mha.AttentionParams.init(d, seed=0)
    steps = mha.multi_head_attention_steps(x, x, x, params, 2, mask=mha.causal_mask(t))
    pad = mha.padding_mask(np.array([t, t - 1]))
    src, tgt = SRC[:t], TGT[:t]
    padded = [src, [*src[: t - 1], "<pad>"]]
    return {
        "tensor_grid": lambda: draw.tensor_grid(x, "BTD", num_heads=2, tokens=src),
        "split": lambda: draw.split_heads_figure(x, 2, tokens=src),
        "merge": lambda: draw.merge_heads_figure(mha.split_heads(x, 2), tokens=src),
        "weights": lambda: draw.weight_matrix_figure(params.W_q, 2),
        "matmul": lambda: draw.matmul_per_head_figure(x, params.W_q, 2, tokens=src),
        "pipeline": lambda: draw.attention_pipeline_figure(steps, 0, query_tokens=tgt,
                                                           key_tokens=tgt),
        "module": lambda: draw.multi_head_attention_figure(x, params, 2,
                                                           mask=mha.causal_mask(t),
                                                           tokens=src),
        "mask": lambda: draw.mask_figure(pad, query_tokens=src, key_tokens=src, batch=1),
        "padding": lambda: draw.padding_mask_figure(pad, padded),
        "heatmaps": lambda: draw.attention_heatmaps(steps.weights, query_tokens=tgt,
                                                    key_tokens=tgt),
        "grid": lambda: draw.attention_grid([steps.weights] * 2),
        "transformer": draw.transformer_figure,
        "kv_cache": lambda: draw.kv_cache_figure(x, params, 2, tokens=src),
        "grouped": lambda: draw.grouped_heads_figure(
            x, mha.AttentionParams.init(d, seed=0, kv_dim=d // 2), 2, tokens=src),
        "curves": lambda: draw.curves_figure([
            draw.CurvePanel([draw.Series(np.arange(1, t + 1), x[0, :, 0], "x", marker="o"),
                             draw.Series(np.arange(1, t + 1), x[0, :, 1], "lr",
                                         secondary=True)],
                            title="two series", xlabel="step", ylabel="value",
                            ylabel2="rate", hlines=[draw.RefLine(0.0, "zero")]),
            draw.CurvePanel([draw.Series(2.0 ** np.arange(d), np.arange(d) + 1.0, "n")],
                            logx=True, logy=True, log_base=2),
        ]),
        "vectors": lambda: draw.vectors_figure(x[0, :, :2], x[0, 0, 2:4], labels=src,
                                               title="vectors"),
    }


@pytest.mark.parametrize("name", list(_builders()))
@pytest.mark.no_cover  # renders what other tests draw: tracing it again only slows it
def test_same_inputs_give_byte_identical_svg(name):
    # small: rendering text as paths is the slow part
    assert_reproducible(_builders(t=2, d=4)[name])


@pytest.mark.parametrize("name", list(_builders()))
@pytest.mark.no_cover  # renders what other tests draw: tracing it again only slows it
def test_figures_fit_the_text_width_with_readable_fonts(name):
    assert_house_style(_builders()[name]())


@pytest.mark.parametrize("name", ["mask", "padding", "heatmaps", "pipeline", "grouped",
                                  "masks_with_descenders", "alibi"])
def test_grid_titles_stand_clear_of_their_grids(name):
    """A grid's title ends at least 2 points above its grid (the descenders of "padding"
    touched the grid) and overlaps no other grid and no line of the sheet's text."""
    builders = _builders()
    builders["masks_with_descenders"] = lambda: draw.masks_figure([
        draw.MaskPanel(mha.padding_mask([3, 2]), "encoder: padding", SRC, SRC),
        draw.MaskPanel(mha.causal_mask(3), "query: causal (gjpqy)", TGT, TGT)], batch=1)
    builders["alibi"] = lambda: draw.alibi_figure(4, 3)
    fig = builders[name]()
    renderer = rendered(fig)
    two_points = 2 * fig.dpi / 72
    grids = grid_axes(fig)
    titled = [ax for ax in grids if ax.get_title()]
    assert titled
    sheet = [t.get_window_extent(renderer) for t in fig.texts if t.get_text()]
    for ax in titled:
        title = ax.title.get_window_extent(renderer)
        box = ax.get_window_extent(renderer)
        assert title.y0 - box.y1 >= two_points, (ax.get_title(), title.y0 - box.y1)
        for other in [g.get_window_extent(renderer) for g in grids if g is not ax] + sheet:
            assert not title.overlaps(other), (ax.get_title(), other)


def test_alt_text_refuses_foreign_figures():
    with pytest.raises(ValueError, match="not made by mha.draw"):
        draw.alt_text(plt.figure())


def test_bold_head_titles_of_narrow_grids_do_not_overlap():
    """Head titles are drawn bold; the layout must measure them bold too."""
    from mha.draw.layout import Grid, compose

    title = "head 0, slope 1/256"
    grids = [Grid(face=np.ones((2, 1, 4)), title=title, title_color=draw.head_color(h))
             for h in range(3)]
    fig, axes = compose([grids])
    renderer = rendered(fig)
    boxes = [ax.title.get_window_extent(renderer) for ax in axes]
    # Pixel positions of about 500 round at 1e-13; an overlap of 1e-6 px is invisible.
    for left, right in zip(boxes[:-1], boxes[1:], strict=True):
        assert left.x1 <= right.x0 + 1e-6, (left, right)
    assert all(ax.title.get_fontweight() == "bold" for ax in axes)


def test_measure_gives_the_size_compose_draws():
    from mha.draw.layout import Caption, Grid, Op, compose, measure

    rows = [Caption("a caption long enough to matter " * 3),
            [Grid(face=np.ones((3, 5, 4)), title="x", row_labels=list("abc")), Op("@"),
             Grid(face=np.ones((5, 2, 4)), title="head 1", title_color=draw.head_color(1))]]
    fig, _ = compose(rows)
    assert measure(rows) == pytest.approx(tuple(fig.get_size_inches()), abs=1e-12)

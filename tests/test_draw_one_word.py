"""mha.draw.one_word_figure: the bars are the weights they stand for.

Oracles: the weights themselves (copies, so exact comparison is safe), written out here
with ``round``; colours from the house palette.
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
    assert_tight_box_fits,
    gid_texts,
)
from matplotlib.colors import to_rgba

import mha
from mha import draw
from mha.draw import one_word
from mha.notebook import setup_figures

WORDS = "the cat drank milk because it was thirsty".split()


@pytest.fixture(autouse=True)
def _figures():
    setup_figures()
    yield
    plt.close("all")


def row() -> np.ndarray:
    scores = np.array([0, 4, 0, 2, 0, 0, 0, 0], dtype=float)
    return mha.softmax(scores)


def bars(fig):
    (ax,) = fig.axes
    return ax, [p for p in ax.patches if p.get_gid() == "bar"]


def test_one_bar_per_word_with_its_weight_written_above():
    w = row()
    fig = draw.one_word_figure(WORDS, w, query=5)
    ax, drawn = bars(fig)
    heights = np.array([p.get_height() for p in drawn])
    np.testing.assert_array_equal(heights, w)  # the very numbers, copied
    assert gid_texts(ax, "weight") == [f"{round(v, 2) + 0.0:.2f}" for v in w]
    assert [t.get_text() for t in ax.get_xticklabels()] == WORDS


def test_the_query_word_is_marked_and_its_bar_lighter():
    fig = draw.one_word_figure(WORDS, row(), query=5)
    ax, drawn = bars(fig)
    assert ax.get_xticklabels()[5].get_fontweight() == "bold"
    assert [t.get_text() for t in ax.texts if t.get_gid() == "query"] == ["query"]
    assert ax.texts[-1].xy[0] == 5  # the marker sits under the query word
    full = to_rgba(draw.head_color(0))
    assert [to_rgba(p.get_facecolor()) == full for p in drawn] == [i != 5 for i in range(8)]
    assert 'what "it" attends to' == ax.get_title()


def test_accepts_torch_and_a_title():
    fig = draw.one_word_figure(WORDS, torch.from_numpy(row()), query=1, title="cat")
    assert fig.axes[0].get_title() == "cat"


def test_house_style_and_reproducible_svg():
    fig = draw.one_word_figure(WORDS, row(), query=5)
    assert_house_style(fig)
    assert_tight_box_fits(fig)
    assert_inside_the_canvas(fig)
    assert_reproducible(lambda: draw.one_word_figure(WORDS, row(), query=5))


def test_alt_text_names_the_query_and_the_largest_weight():
    text = draw.alt_text(draw.one_word_figure(WORDS, row(), query=5))
    assert '"it"' in text and '"cat"' in text and "8 words" in text


@pytest.mark.parametrize(
    ("tokens", "weights", "query", "message"),
    [
        (WORDS, np.ones((2, 4)) / 4, 0, r"shape \(S,\)"),
        (WORDS[:3], row(), 0, "one word per weight"),
        (WORDS, np.full(8, 0.2), 0, "sum to 1"),
        (WORDS, np.r_[1.5, -0.5, np.zeros(6)], 0, "non-negative"),
        (WORDS, np.r_[np.nan, np.zeros(7)], 0, "finite"),
        (WORDS, row(), 8, r"query must be an int in \[0, 7\]"),
        (WORDS, row(), True, "query must be an int"),
    ],
)
def test_rejects_bad_input(tokens, weights, query, message):
    with pytest.raises(ValueError, match=message):
        draw.one_word_figure(tokens, weights, query)


def test_exported_from_mha_draw():
    assert draw.one_word_figure is one_word.one_word_figure
    assert "one_word_figure" in draw.__all__

"""mha.draw.length_curves_figure: the lines and bands are the mean and the range over
seeds of the per-position numbers of a results document (oracle: the numbers written
here by hand)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from figures import assert_house_style, assert_reproducible, assert_tight_box_fits, series

from mha import draw
from mha.notebook import setup_figures


def fake_results():
    """Two schemes, two seeds, 8 positions, training length 4."""
    runs = []
    for scheme, base in (("a", 1.0), ("b", 2.0)):
        for seed in (0, 1):
            loss = [base + seed + 0.1 * p for p in range(8)]
            accuracy = [None, None] + [1.0 - 0.1 * seed] * 6
            runs.append({"position_scheme": scheme, "seed": seed, "loss": loss,
                         "accuracy": accuracy, "translation_accuracy": accuracy})  # fmt: skip
    return {"data": {"train_len": 4}, "runs": runs}


def test_curves_are_mean_min_max_over_seeds():
    curves = draw.length_curves(fake_results(), "loss")
    assert list(curves) == ["a", "b"]
    mean, low, high = curves["b"]
    np.testing.assert_allclose(low, [2.0 + 0.1 * p for p in range(8)], rtol=1e-12)
    np.testing.assert_allclose(high, [3.0 + 0.1 * p for p in range(8)], rtol=1e-12)
    np.testing.assert_allclose(mean, [2.5 + 0.1 * p for p in range(8)], rtol=1e-12)


def test_smoothing_averages_the_last_positions_and_skips_gaps():
    mean, _, _ = draw.length_curves(fake_results(), "loss", smooth=2)["a"]
    # position 1 has one value; position p >= 2 the mean of p - 1 and p
    np.testing.assert_allclose(mean[0], 1.5, rtol=1e-12)
    np.testing.assert_allclose(mean[1:], [1.55 + 0.1 * p for p in range(7)], rtol=1e-12)
    mean, _, _ = draw.length_curves(fake_results(), "accuracy", smooth=3)["a"]
    assert np.isnan(mean[:2]).all()  # nothing to average yet
    np.testing.assert_allclose(mean[2:], 0.95, rtol=1e-12)  # the gaps are skipped


def test_figure_draws_one_line_per_scheme_and_the_training_length():
    setup_figures()
    results = fake_results()
    fig = draw.length_curves_figure(results, ("loss", "translation_accuracy"),
                                    labels={"a": "A"})  # fmt: skip
    assert_house_style(fig)
    assert_tight_box_fits(fig)
    top, bottom = fig.axes
    lines = series(top)
    assert [line.get_label() for line in lines] == ["A", "b"]
    np.testing.assert_allclose(lines[0].get_ydata(), draw.length_curves(results)["a"][0])
    guides = [line for line in top.get_lines() if line not in lines]
    assert [line.get_xdata()[0] for line in guides] == [4]  # the dashed line at L
    assert len(top.collections) == 2  # one band per scheme
    plt.close(fig)
    assert "(A, b)" in draw.alt_text(fig) and "training length 4" in draw.alt_text(fig)
    assert_reproducible(lambda: draw.length_curves_figure(results))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="measure"):
        draw.length_curves(fake_results(), "perplexity")
    with pytest.raises(ValueError, match="smooth"):
        draw.length_curves(fake_results(), smooth=0)
    with pytest.raises(ValueError, match="order"):
        draw.length_curves_figure(fake_results(), order=["a", "c"])
    with pytest.raises(ValueError, match="measures"):
        draw.length_curves_figure(fake_results(), "loss")

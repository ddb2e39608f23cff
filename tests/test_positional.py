"""Sinusoidal positional encoding (Vaswani et al., 2017, section 3.5)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numerics import EPS64

from mha import sinusoidal_positional_encoding


@pytest.mark.parametrize("d_model", [1, 2, 5, 8, 13])
def test_matches_the_formula_entry_by_entry(d_model: int) -> None:
    max_len = 7
    pe = sinusoidal_positional_encoding(max_len, d_model)
    assert pe.shape == (max_len, d_model) and pe.dtype == np.float64
    for pos in range(max_len):
        for j in range(d_model):
            i = j // 2  # columns 2i and 2i + 1 share a frequency
            angle = pos / 10000 ** (2 * i / d_model)
            expected = math.sin(angle) if j % 2 == 0 else math.cos(angle)
            assert pe[pos, j] == pytest.approx(expected, abs=1e-12), (pos, j)


def test_position_zero_is_sin0_cos0() -> None:
    # exact: sin(0) = 0 and cos(0) = 1
    np.testing.assert_array_equal(sinusoidal_positional_encoding(3, 6)[0], [0, 1, 0, 1, 0, 1])


def test_values_are_bounded_and_pairs_lie_on_the_unit_circle() -> None:
    pe = sinusoidal_positional_encoding(200, 16)
    assert np.all(np.abs(pe) <= 1.0)
    np.testing.assert_allclose(pe[:, 0::2] ** 2 + pe[:, 1::2] ** 2, 1.0, rtol=0, atol=1e-12)


def test_offset_is_a_fixed_rotation() -> None:
    # PE[pos + k] = R_k PE[pos] for every pos: each (sin, cos) pair is rotated by
    # the angle k * frequency, which does not depend on pos. This is why the paper
    # expects the model to learn relative positions easily.
    d_model, offset = 8, 3
    pe = sinusoidal_positional_encoding(50, d_model)
    frequencies = 10000.0 ** (-np.arange(0, d_model, 2) / d_model)
    c, s = np.cos(offset * frequencies), np.sin(offset * frequencies)
    sin_now, cos_now = pe[:-offset, 0::2], pe[:-offset, 1::2]
    np.testing.assert_allclose(pe[offset:, 0::2], sin_now * c + cos_now * s, atol=1e-12)
    np.testing.assert_allclose(pe[offset:, 1::2], cos_now * c - sin_now * s, atol=1e-12)


def test_odd_d_model_keeps_the_last_sine() -> None:
    even = sinusoidal_positional_encoding(10, 6)
    odd = sinusoidal_positional_encoding(10, 7)
    np.testing.assert_allclose(odd[:, 6], np.sin(np.arange(10) / 10000 ** (6 / 7)))
    # the frequencies depend on D, so the shared columns differ except the first pair;
    # the same angles, but sin and cos of arrays of another shape may take another SIMD
    # path (within a few ulps)
    np.testing.assert_allclose(odd[:, :2], even[:, :2], rtol=0, atol=4 * EPS64)


def test_prefix_property_and_dtype() -> None:
    long = sinusoidal_positional_encoding(64, 10)
    np.testing.assert_allclose(sinusoidal_positional_encoding(8, 10), long[:8],
                               rtol=0, atol=4 * EPS64)  # as above: values in [-1, 1]
    assert sinusoidal_positional_encoding(4, 10, dtype=np.float32).dtype == np.float32


def test_rows_are_distinct() -> None:
    pe = sinusoidal_positional_encoding(128, 16)
    distances = np.linalg.norm(pe[:, None, :] - pe[None, :, :], axis=-1)
    assert np.all(distances[~np.eye(128, dtype=bool)] > 1e-3)

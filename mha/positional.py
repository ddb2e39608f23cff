"""Sinusoidal positional encoding (Vaswani et al., 2017, section 3.5)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mha._checks import check_positive_int

__all__ = ["sinusoidal_positional_encoding"]


def sinusoidal_positional_encoding(
    max_len: int, d_model: int, dtype: Any = np.float64
) -> np.ndarray:
    """The fixed sine/cosine position signal added to the token embeddings.

    ``PE[pos, 2i] = sin(pos / 10000^(2i / D))`` and
    ``PE[pos, 2i + 1] = cos(pos / 10000^(2i / D))``: dimension pair ``i`` is a
    rotation at its own frequency, from one cycle per ``2*pi`` positions (``i = 0``)
    down to one per ``10000 * 2*pi``, so ``PE[pos + k]`` is a linear function of
    ``PE[pos]`` for every fixed offset ``k``.

    Parameters
    ----------
    max_len : int
        Number of positions, ``0 .. max_len - 1``.
    d_model : int
        ``D``. An odd ``D`` is allowed: the last (even-indexed) column is a sine
        whose cosine partner would fall outside the array and is dropped.
    dtype : NumPy floating dtype
        Computed in float64, then cast.

    Returns
    -------
    np.ndarray, shape (max_len, D)
    """
    max_len = check_positive_int(max_len, "max_len")
    d_model = check_positive_int(d_model, "d_model")
    positions = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    two_i = np.arange(0, d_model, 2, dtype=np.float64)  # (ceil(D/2),) = 0, 2, 4, ...
    # 10000^(-2i/D) via exp/log: one frequency per pair of dimensions
    frequencies = np.exp(-np.log(10000.0) * two_i / d_model)  # (ceil(D/2),)
    # (max_len, 1) * (1, ceil(D/2)) -> (max_len, ceil(D/2))
    angles = positions * frequencies[None, :]
    encoding = np.empty((max_len, d_model), dtype=np.float64)
    encoding[:, 0::2] = np.sin(angles)
    encoding[:, 1::2] = np.cos(angles[:, : d_model // 2])  # odd D: no partner for the last sine
    return encoding.astype(dtype)

"""RoPE past the length it was trained on: new frequencies, and a factor for the scores.

A model trained on sequences of ``L`` positions (``training_length``, Hugging Face's
``original_max_position_embeddings``) has seen pair ``i`` of :func:`mha.apply_rope`
turned by ``m * theta_i`` only for ``m < L``, with ``theta_i = base^(-2i / Dh)``. The
fast pairs turn many times within ``L`` positions and have met every angle; the slow
ones turn less than once, and a longer sequence shows them angles they never saw. Each
function here stretches RoPE by a ``factor`` ``s`` (to about ``s * L`` positions) by
changing the frequencies, and says how much to sharpen the scores:

* :func:`rope_default`: RoPE as trained;
* :func:`rope_linear`: position interpolation, every frequency divided by ``s``;
* :func:`rope_ntk`: "NTK-aware" scaling, a larger base;
* :func:`rope_dynamic_ntk`: the same, its base growing with the current length;
* :func:`rope_yarn`: YaRN, the fast pairs kept, the slow ones interpolated, a ramp
  between, and sharper scores (:func:`yarn_mscale`);
* :func:`rope_llama3`: Llama 3.1's rule, a ramp between the same two ends.

Each returns a :class:`ScaledRope`: pass its ``inv_freq`` to
``mha.apply_rope(x, positions, inv_freq=...)``, and multiply the rotated queries and
keys each by its ``attention_factor`` (so the scores by its square), as Hugging Face
``transformers`` does by multiplying its cosine and sine tables. The functions compute
in float64 what ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` computes in
float32 (the tests compare the two).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from mha._checks import (
    check_ordered,
    check_positive_int,
    check_real,
    check_rope_scaling,
)
from mha.positional import _frequencies

__all__ = [
    "ScaledRope",
    "rope_default",
    "rope_dynamic_ntk",
    "rope_linear",
    "rope_llama3",
    "rope_ntk",
    "rope_yarn",
    "yarn_mscale",
]


class ScaledRope(NamedTuple):
    """What a RoPE scaling gives: the frequencies and the factor for queries and keys.

    Attributes
    ----------
    inv_freq : np.ndarray, shape (Dh/2,), float64
        ``theta_i``, pair ``i`` turning by ``m * theta_i`` at position ``m``: the
        ``inv_freq`` of :func:`mha.apply_rope`.
    attention_factor : float
        Multiplies the rotated queries and keys (the scores by its square); 1 except
        for YaRN.
    """

    inv_freq: np.ndarray
    attention_factor: float


def _blend(frequencies: np.ndarray, factor: float, keep: np.ndarray) -> np.ndarray:
    """Per pair, ``keep`` of the trained frequency and ``1 - keep`` of it interpolated
    (divided by ``factor``): ``theta * keep + theta / s * (1 - keep)``."""
    return frequencies / factor * (1.0 - keep) + frequencies * keep  # (Dh/2,)


def rope_default(head_dim: int, base: float = 10000.0) -> ScaledRope:
    """RoPE as trained: ``theta_i = base^(-2i / Dh)``, attention factor 1.

    Parameters
    ----------
    head_dim : int
        ``Dh``, the rotary width (even).
    base : float
        ``> 1``; 10000 in the RoFormer paper, 500000 in Llama 3.

    Returns
    -------
    ScaledRope
        ``inv_freq`` of shape (Dh/2,).
    """
    head_dim, base, _ = check_rope_scaling(head_dim, base, 1.0)
    return ScaledRope(_frequencies(head_dim, base), 1.0)


def rope_linear(head_dim: int, factor: float, base: float = 10000.0) -> ScaledRope:
    """Position interpolation (Chen et al., 2023): ``theta_i / s``.

    Position ``m`` is turned as position ``m / s`` was: ``s * L`` positions are squeezed
    into the ``L`` the model was trained on, every angle one it has seen. The price:
    neighbours now differ by ``1 / s`` of a position, which the fast pairs resolve less
    well (the paper fine-tunes briefly afterwards).

    Parameters
    ----------
    head_dim : int
        ``Dh``, the rotary width (even).
    factor : float
        ``s >= 1``; 1 is :func:`rope_default`.
    base : float
        ``> 1``.

    Returns
    -------
    ScaledRope
        Attention factor 1.
    """
    head_dim, base, factor = check_rope_scaling(head_dim, base, factor)
    return ScaledRope(_frequencies(head_dim, base) / factor, 1.0)


def rope_ntk(head_dim: int, factor: float, base: float = 10000.0) -> ScaledRope:
    """NTK-aware scaling: RoPE with the base ``base * s^(Dh / (Dh - 2))``.

    A larger base slows every pair, but unevenly: the exponent is chosen so that the
    slowest pair (``i = Dh/2 - 1``) is divided by exactly ``s``, as position
    interpolation would, while the fastest (``i = 0``) keeps its frequency and the
    pairs between are divided by ``s^(2i / (Dh - 2))``. Proposed by bloc97 (2023, on
    Reddit) and described in the YaRN paper (Peng et al., 2023, section 3.1).
    Hugging Face ``transformers`` has no static version; its "dynamic" one is
    :func:`rope_dynamic_ntk`.

    Parameters
    ----------
    head_dim : int
        ``Dh``, the rotary width, even and ``>= 4``.
    factor : float
        ``s >= 1``.
    base : float
        ``> 1``.

    Returns
    -------
    ScaledRope
        Attention factor 1.
    """
    head_dim, base, factor = check_rope_scaling(head_dim, base, factor)
    if head_dim < 4:
        raise ValueError(
            f"head_dim must be at least 4 for NTK scaling (its exponent is Dh / (Dh - 2)), "
            f"got {head_dim}"
        )
    return ScaledRope(_frequencies(head_dim, base * factor ** (head_dim / (head_dim - 2))), 1.0)


def rope_dynamic_ntk(
    head_dim: int, factor: float, training_length: int, seq_len: int, base: float = 10000.0
) -> ScaledRope:
    """Dynamic NTK scaling: :func:`rope_ntk` with a factor that grows with the length.

    Up to the training length ``L`` RoPE is left as trained; a sequence of
    ``l > L`` positions gets the NTK factor ``s_l = s * l / L - (s - 1)``, which is 1 at
    ``l = L`` and grows ``s`` times as fast as ``l / L``: the base becomes
    ``base * s_l^(Dh / (Dh - 2))``. That is Hugging Face's ``"dynamic"`` rule
    (after emozilla, 2023, on Reddit), which recomputes the frequencies whenever a
    sequence grows past the longest seen so far; the YaRN paper (Peng et al., 2023,
    section 3.3) writes Dynamic NTK with ``s_l = l / L``, this rule at ``s = 1``.

    Parameters
    ----------
    head_dim : int
        ``Dh``, the rotary width, even and ``>= 4``.
    factor : float
        ``s >= 1``.
    training_length : int
        ``L`` (Hugging Face reads it from ``max_position_embeddings``).
    seq_len : int
        ``l``, the current length (the largest position plus 1).
    base : float
        ``> 1``.

    Returns
    -------
    ScaledRope
        Attention factor 1.
    """
    head_dim, base, factor = check_rope_scaling(head_dim, base, factor)
    training_length = check_positive_int(training_length, "training_length")
    seq_len = check_positive_int(seq_len, "seq_len")
    growth = factor * max(seq_len, training_length) / training_length - (factor - 1.0)
    return rope_ntk(head_dim, growth, base)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's temperature: ``0.1 * mscale * ln(s) + 1`` for ``s > 1``, else 1.

    Stretched attention spreads over more keys and grows flatter; YaRN (Peng et al.,
    2023, section 3.4) sharpens it again by multiplying queries and keys each by
    ``sqrt(1 / t) = 0.1 ln(s) + 1`` (``mscale = 1``), fitted on LLaMA. DeepSeek's
    configurations weight the logarithm with ``mscale`` and ``mscale_all_dim``
    (:func:`rope_yarn`, :func:`mha.mla_params.mla_softmax_scale`).

    Parameters
    ----------
    factor : float
        ``s >= 1``.
    mscale : float
        ``>= 0``.

    Returns
    -------
    float
    """
    factor = check_real(factor, "factor", 1.0, strict=False)
    mscale = check_real(mscale, "mscale", 0.0, strict=False)
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def rope_yarn(
    head_dim: int,
    factor: float,
    training_length: int,
    base: float = 10000.0,
    *,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
) -> ScaledRope:
    """YaRN (Peng et al., 2023): keep the fast pairs, interpolate the slow ones, ramp
    between, and sharpen the scores.

    Pair ``i`` turns ``r_i = L / (2 pi / theta_i)`` times within the training length.
    Pairs that turn more than ``beta_fast`` times have seen every angle: they keep
    ``theta_i`` (they also tell neighbours apart, which interpolation would blur).
    Pairs that turn fewer than ``beta_slow`` times are interpolated, ``theta_i / s`` as
    in :func:`rope_linear`. The pair turning exactly ``r`` times sits at the
    (fractional) index ``Dh * ln(L / (2 pi r)) / (2 ln base)``; between the index of
    ``beta_fast`` (``low``, rounded down when ``truncate``) and that of ``beta_slow``
    (``high``, rounded up), both clipped to ``[0, Dh - 1]``, the weight of the
    interpolated frequency rises linearly in ``i``:

    ``ramp_i = clip((i - low) / (high - low), 0, 1)``,
    ``theta'_i = theta_i * (1 - ramp_i) + theta_i / s * ramp_i``.

    (The paper writes the ramp as linear in ``r``; its authors' code and Hugging Face
    ``transformers`` ramp linearly in the index, as here, and add 0.001 to ``high``
    should it equal ``low``.)

    The attention factor, for queries and keys alike: ``attention_factor`` if given;
    else ``yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim)`` when both are
    given and nonzero (DeepSeek's configurations); else the paper's
    ``yarn_mscale(s) = 0.1 ln(s) + 1``. This is ``transformers``' rule.

    Parameters
    ----------
    head_dim : int
        ``Dh``, the rotary width (even).
    factor : float
        ``s >= 1``.
    training_length : int
        ``L``, ``original_max_position_embeddings``.
    base : float
        ``> 1``.
    beta_fast, beta_slow : float
        Keyword only. ``beta_fast > beta_slow > 0`` turns; 32 and 1 in the paper.
    truncate : bool
        Round ``low`` down and ``high`` up to whole pairs (True, the default of the
        paper's code); gpt-oss sets False.
    mscale, mscale_all_dim : float, optional
        ``>= 0``.
    attention_factor : float, optional
        ``> 0``: overrides the computed one.

    Returns
    -------
    ScaledRope
    """
    head_dim, base, factor = check_rope_scaling(head_dim, base, factor)
    training_length = check_positive_int(training_length, "training_length")
    beta_slow = check_real(beta_slow, "beta_slow", 0.0)
    beta_fast = check_real(beta_fast, "beta_fast", 0.0)
    check_ordered(beta_slow, "beta_slow", beta_fast, "beta_fast")
    if not isinstance(truncate, bool):
        raise ValueError(f"truncate must be True or False, got {truncate!r}")
    if mscale is not None:
        mscale = check_real(mscale, "mscale", 0.0, strict=False)
    if mscale_all_dim is not None:
        mscale_all_dim = check_real(mscale_all_dim, "mscale_all_dim", 0.0, strict=False)
    if attention_factor is not None:
        attention_factor = check_real(attention_factor, "attention_factor", 0.0)
    elif mscale and mscale_all_dim:
        attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    else:
        attention_factor = yarn_mscale(factor)

    def pair_turning(turns: float) -> float:  # the index i with r_i = turns
        return head_dim * math.log(training_length / (2 * math.pi * turns)) / (2 * math.log(base))

    low, high = pair_turning(beta_fast), pair_turning(beta_slow)  # low < high
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against 0 / 0
    pair = np.arange(head_dim // 2, dtype=np.float64)  # (Dh/2,) i = 0, 1, ...
    ramp = np.clip((pair - low) / (high - low), 0.0, 1.0)  # 0: fast pairs, 1: slow pairs
    frequencies = _frequencies(head_dim, base)  # (Dh/2,)
    return ScaledRope(_blend(frequencies, factor, keep=1.0 - ramp), attention_factor)


def rope_llama3(
    head_dim: int,
    factor: float,
    training_length: int,
    base: float = 10000.0,
    *,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> ScaledRope:
    """Llama 3.1's scaling: fast pairs kept, slow pairs interpolated, a smooth ramp
    between, by wavelength.

    Pair ``i`` repeats every ``lambda_i = 2 pi / theta_i`` positions. With the training
    length ``L`` (8192 for Llama 3.1, ``s = 8``, factors 1 and 4):

    * ``lambda_i < L / high_freq_factor`` (it turns more than ``high_freq_factor``
      times in ``L``): ``theta_i``, kept;
    * ``lambda_i > L / low_freq_factor`` (fewer than ``low_freq_factor`` turns):
      ``theta_i / s``, interpolated as in :func:`rope_linear`;
    * between: ``theta_i * g + theta_i / s * (1 - g)`` with
      ``g = (L / lambda_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``,
      which is 0 and 1 at the two ends, so no frequency jumps.

    That is :func:`rope_yarn`'s idea with the ramp linear in the number of turns
    ``L / lambda_i`` and no change of temperature. Published with the Llama 3.1
    weights (Meta's reference code, ``apply_scaling``; the models are described in
    Meta's Llama Team, 2024, "The Llama 3 Herd of Models").

    Parameters
    ----------
    head_dim : int
        ``Dh``, the rotary width (even).
    factor : float
        ``s >= 1``.
    training_length : int
        ``L``, ``original_max_position_embeddings``.
    base : float
        ``> 1``; 500000 in Llama 3.
    low_freq_factor, high_freq_factor : float
        Keyword only. ``0 < low_freq_factor < high_freq_factor``.

    Returns
    -------
    ScaledRope
        Attention factor 1.
    """
    head_dim, base, factor = check_rope_scaling(head_dim, base, factor)
    training_length = check_positive_int(training_length, "training_length")
    low_freq_factor = check_real(low_freq_factor, "low_freq_factor", 0.0)
    high_freq_factor = check_real(high_freq_factor, "high_freq_factor", 0.0)
    check_ordered(low_freq_factor, "low_freq_factor", high_freq_factor, "high_freq_factor")
    frequencies = _frequencies(head_dim, base)  # (Dh/2,)
    wavelength = 2 * math.pi / frequencies  # (Dh/2,) positions per turn
    smooth = (training_length / wavelength - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )  # (Dh/2,): 0 at lambda = L / low_freq_factor, 1 at L / high_freq_factor
    keep = np.where(
        wavelength < training_length / high_freq_factor,
        1.0,  # fast pairs
        np.where(wavelength > training_length / low_freq_factor, 0.0, smooth),
    )
    return ScaledRope(_blend(frequencies, factor, keep), 1.0)

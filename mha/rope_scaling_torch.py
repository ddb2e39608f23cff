"""RoPE past its training length, in PyTorch: the torch twin of :mod:`mha.rope_scaling`.

The same functions, names and rules (see there for the formulas and the papers), on
tensors, for a torch model to rotate its queries and keys with
``mha.positional_torch.apply_rope(x, positions, inv_freq=...)`` and multiply them by
the ``attention_factor``. Written again here, not imported: the tests compare the two.

The frequencies come back in float64 (``apply_rope`` computes its angles in float64,
and a position of 100000 times a float32 frequency has lost its last turns of a
degree). A module that keeps them as a buffer should keep them out of ``.to(dtype)``,
or recompute them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from mha._checks import check_ordered, check_positive_int, check_real, check_rope_scaling
from mha.positional_torch import _frequencies

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

Device = torch.device | str | None


class ScaledRope(NamedTuple):
    """``inv_freq`` ``(Dh/2,)`` float64 tensor, and the ``attention_factor`` (a float)
    that multiplies the rotated queries and keys."""

    inv_freq: Tensor
    attention_factor: float


def _blend(frequencies: Tensor, factor: float, keep: Tensor) -> Tensor:
    """``keep`` of each trained frequency, ``1 - keep`` of it divided by ``factor``."""
    return torch.lerp(frequencies / factor, frequencies, keep)  # (Dh/2,)


def rope_default(head_dim: int, base: float = 10000.0, *, device: Device = None) -> ScaledRope:
    """RoPE as trained: ``base^(-2i / Dh)``, as ``mha.rope_scaling.rope_default``."""
    head_dim, base, _ = check_rope_scaling(head_dim, base, 1.0)
    return ScaledRope(_frequencies(head_dim, base, device), 1.0)


def rope_linear(
    head_dim: int, factor: float, base: float = 10000.0, *, device: Device = None
) -> ScaledRope:
    """Position interpolation (Chen et al., 2023): every frequency divided by ``s``."""
    head_dim, base, factor = check_rope_scaling(head_dim, base, factor)
    return ScaledRope(_frequencies(head_dim, base, device) / factor, 1.0)


def rope_ntk(
    head_dim: int, factor: float, base: float = 10000.0, *, device: Device = None
) -> ScaledRope:
    """NTK-aware scaling: the base becomes ``base * s^(Dh / (Dh - 2))`` (``Dh >= 4``)."""
    head_dim, base, factor = check_rope_scaling(head_dim, base, factor)
    if head_dim < 4:
        raise ValueError(
            f"head_dim must be at least 4 for NTK scaling (its exponent is Dh / (Dh - 2)), "
            f"got {head_dim}"
        )
    stretched = base * factor ** (head_dim / (head_dim - 2))
    return ScaledRope(_frequencies(head_dim, stretched, device), 1.0)


def rope_dynamic_ntk(
    head_dim: int,
    factor: float,
    training_length: int,
    seq_len: int,
    base: float = 10000.0,
    *,
    device: Device = None,
) -> ScaledRope:
    """Dynamic NTK: :func:`rope_ntk` with the factor ``s * l / L - (s - 1)`` for a
    sequence of ``l = seq_len > L`` positions, RoPE as trained up to ``L``."""
    head_dim, base, factor = check_rope_scaling(head_dim, base, factor)
    training_length = check_positive_int(training_length, "training_length")
    seq_len = check_positive_int(seq_len, "seq_len")
    length = max(seq_len, training_length)
    return rope_ntk(head_dim, factor * length / training_length - (factor - 1.0), base,
                    device=device)  # fmt: skip


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's ``0.1 * mscale * ln(s) + 1`` (1 for ``s <= 1``), for queries and keys."""
    factor = check_real(factor, "factor", 1.0, strict=False)
    mscale = check_real(mscale, "mscale", 0.0, strict=False)
    if factor <= 1.0:
        return 1.0
    return 1.0 + 0.1 * mscale * math.log(factor)


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
    device: Device = None,
) -> ScaledRope:
    """YaRN (Peng et al., 2023), as ``mha.rope_scaling.rope_yarn``: pairs turning more
    than ``beta_fast`` times in ``L`` keep their frequency, fewer than ``beta_slow``
    are divided by ``s``, a ramp linear in the pair index between; the attention
    factor is ``attention_factor``, or ``mscale``'s over ``mscale_all_dim``'s when both
    are given, or ``0.1 ln(s) + 1``."""
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
    # The pair index at which a pair turns `turns` times in L positions:
    # 2 pi base^(2i/Dh) = L / turns  <=>  i = Dh ln(L / (2 pi turns)) / (2 ln base).
    bounds = [
        head_dim * math.log(training_length / (2 * math.pi * turns)) / (2 * math.log(base))
        for turns in (beta_fast, beta_slow)
    ]
    if truncate:
        bounds = [math.floor(bounds[0]), math.ceil(bounds[1])]
    low, high = max(bounds[0], 0), min(bounds[1], head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no 0 / 0
    pair = torch.arange(head_dim // 2, dtype=torch.float64, device=device)  # (Dh/2,)
    interpolated = ((pair - low) / (high - low)).clamp(0.0, 1.0)  # (Dh/2,) weight of theta/s
    frequencies = _frequencies(head_dim, base, device)  # (Dh/2,)
    return ScaledRope(_blend(frequencies, factor, 1.0 - interpolated), attention_factor)


def rope_llama3(
    head_dim: int,
    factor: float,
    training_length: int,
    base: float = 10000.0,
    *,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    device: Device = None,
) -> ScaledRope:
    """Llama 3.1's scaling, as ``mha.rope_scaling.rope_llama3``: wavelengths below
    ``L / high_freq_factor`` kept, above ``L / low_freq_factor`` divided by ``s``, and
    between a weight ``(L / wavelength - low) / (high - low)`` on the kept one."""
    head_dim, base, factor = check_rope_scaling(head_dim, base, factor)
    training_length = check_positive_int(training_length, "training_length")
    low_freq_factor = check_real(low_freq_factor, "low_freq_factor", 0.0)
    high_freq_factor = check_real(high_freq_factor, "high_freq_factor", 0.0)
    check_ordered(low_freq_factor, "low_freq_factor", high_freq_factor, "high_freq_factor")
    frequencies = _frequencies(head_dim, base, device)  # (Dh/2,)
    wavelength = 2 * math.pi / frequencies  # (Dh/2,) positions per turn
    turns = training_length / wavelength  # (Dh/2,) turns within L
    smooth = (turns - low_freq_factor) / (high_freq_factor - low_freq_factor)  # (Dh/2,)
    keep = torch.where(wavelength < training_length / high_freq_factor, 1.0, smooth)
    keep = torch.where(wavelength > training_length / low_freq_factor, 0.0, keep)
    return ScaledRope(_blend(frequencies, factor, keep), 1.0)

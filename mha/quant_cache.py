"""A quantised KV cache: keys and values stored in 8, 4 or 2 bits, and the error it costs.

Quantising a group of numbers replaces each by an integer code of ``bits`` bits and
keeps, for the whole group, one float ``scale`` (and, asymmetric, one float ``zero``):

* **symmetric**: ``scale = max|x| / (2**(bits-1) - 1)``, ``code = round(x / scale)``
  in ``-(2**(bits-1) - 1) .. 2**(bits-1) - 1``, ``x_hat = code * scale`` (so 0 stays 0);
* **asymmetric**: ``zero = min x``, ``scale = (max x - min x) / (2**bits - 1)``,
  ``code = round((x - zero) / scale)`` in ``0 .. 2**bits - 1``,
  ``x_hat = code * scale + zero``. The zero point is kept as a float, the group's
  minimum, as KIVI does; an integer zero point would be rounded and could clip.

Either way ``|x - x_hat| <= scale / 2`` for every element, and a value on the grid comes
back exactly. A group whose values are all equal (all 0, symmetric) has no spread:
its scale is stored as 1 and its codes are 0, so it too comes back exactly.

*Which* numbers share a scale is the choice that matters (Liu et al., 2024, "KIVI: A
Tuning-Free Asymmetric 2bit Quantization for KV Cache"). For heads ``(..., S, Dh)``:

* **per-token** (``per="token"``, ``axis=-1``): a group is ``group_size`` channels of one
  token; the statistics run over channels. KIVI's choice for values.
* **per-channel** (``per="channel"``, ``axis=-2``): a group is ``group_size`` tokens of one
  channel; the statistics run over tokens. KIVI's choice for keys, some of whose
  channels are much larger than the others in every token: per-token, such an outlier
  channel sets the scale of the whole token and the small channels round to nothing;
  per-channel, it only sets its own.

Per-channel quantisation needs whole groups of tokens, and a cache receives tokens one
at a time. :class:`QuantizedKVCache` therefore keeps the newest tokens in full
precision: at least ``residual`` of them (KIVI keeps such a window), and with
per-channel quantisation also those of the last, partial group. A group is quantised
once it is complete *and* the ``residual`` newest tokens stay behind it; per-token
quantisation needs no complete group and quantises every token but the last
``residual``. So with ``residual=0`` values are all quantised, and keys all but the
fewer than ``group_size`` tokens of the unfinished group.

Codes are stored one per ``int8``/``uint8`` here, for clarity; real kernels pack two
4-bit or four 2-bit codes per byte. :meth:`QuantizedKVCache.stored_bits` counts the
packed size.

Shapes: B batch, Hkv key/value heads, S cached length, Dh head_dim, G ``group_size``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mha._checks import (
    PER,
    as_float_array,
    check_bits,
    check_non_negative_int,
    check_per,
    check_positive_int,
    check_symmetric,
)
from mha.attention import kv_head_index, scaled_dot_product_attention
from mha.kv_cache import KVCache

__all__ = [
    "PER",
    "QuantizationError",
    "Quantized",
    "QuantizedHeads",
    "QuantizedKVCache",
    "dequantize",
    "quantization_error",
    "quantize",
    "relative_error",
]

@dataclass(frozen=True, eq=False)
class Quantized:
    """An array in ``bits``-bit codes, one scale (and zero) per group.

    Attributes
    ----------
    codes : np.ndarray, int8 (symmetric) or uint8, the shape of the original array
    scale : np.ndarray, float
        The original shape with ``axis`` divided by ``group_size``: one per group.
    zero : np.ndarray or None
        Same shape as ``scale``: the group's minimum (asymmetric), None (symmetric).
    bits, axis, group_size : int
        ``axis`` non-negative: the axis along which groups of ``group_size`` run.
    """

    codes: np.ndarray
    scale: np.ndarray
    zero: np.ndarray | None
    bits: int
    axis: int
    group_size: int

    @property
    def symmetric(self) -> bool:
        return self.zero is None


def _grouped(x: np.ndarray, axis: int, group_size: int) -> np.ndarray:
    """``(..., L, ...)`` -> ``(..., L / G, G)``: ``axis`` moved last and cut in groups."""
    x = np.moveaxis(x, axis, -1)  # (..., L)
    return x.reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)  # (..., L/G, G)


def _ungrouped(x: np.ndarray, axis: int) -> np.ndarray:
    """The inverse of :func:`_grouped`: ``(..., L / G, G)`` -> ``(..., L, ...)``."""
    x = x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])  # (..., L)
    return np.moveaxis(x, -1, axis)


def quantize(
    x: Any,
    bits: int = 8,
    *,
    axis: int = -1,
    group_size: int | None = None,
    symmetric: bool = True,
) -> Quantized:
    """Quantise ``x`` in groups of ``group_size`` consecutive entries along ``axis``.

    Parameters
    ----------
    x : array_like, any shape, float
    bits : int, 2..8
    axis : int
        The axis the groups run along (their statistics are taken over it). For heads
        ``(..., S, Dh)``: ``-1`` is per-token, ``-2`` per-channel (:data:`PER`).
    group_size : int, optional
        Must divide ``x.shape[axis]``. Default: the whole axis is one group.
    symmetric : bool
        Symmetric (scale only) or asymmetric (scale and zero); see the module's notes.

    Returns
    -------
    Quantized
    """
    x = as_float_array(x, "x")
    bits = check_bits(bits)
    symmetric = check_symmetric(symmetric)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis must be an int naming one of x's {x.ndim} axes, got {axis!r}")
    axis %= x.ndim
    length = x.shape[axis]
    group_size = length if group_size is None else check_positive_int(group_size, "group_size")
    if length % group_size:
        raise ValueError(
            f"group_size={group_size} must divide the length {length} of axis {axis} "
            f"(x of shape {x.shape})"
        )
    groups = _grouped(x, axis, group_size)  # (..., L/G, G)
    if symmetric:
        top = 2 ** (bits - 1) - 1  # codes -top..top: 127, 7 or 1
        spread = np.max(np.abs(groups), axis=-1)  # (..., L/G)
        scale = np.where(spread > 0, spread / top, 1.0).astype(x.dtype)
        codes = np.round(groups / scale[..., None]).astype(np.int8)  # (..., L/G, G)
        zero = None
    else:
        top = 2**bits - 1  # codes 0..top: 255, 15 or 3
        zero = np.min(groups, axis=-1)  # (..., L/G)
        spread = np.max(groups, axis=-1) - zero
        scale = np.where(spread > 0, spread / top, 1.0).astype(x.dtype)
        codes = np.round((groups - zero[..., None]) / scale[..., None]).astype(np.uint8)
        zero = np.moveaxis(zero, -1, axis)
    return Quantized(
        codes=_ungrouped(codes, axis),
        scale=np.moveaxis(scale, -1, axis),  # the axis holds L/G groups now
        zero=zero,
        bits=bits,
        axis=axis,
        group_size=group_size,
    )


def dequantize(q: Quantized) -> np.ndarray:
    """The values the codes stand for: ``codes * scale (+ zero)``, the original shape."""
    if not isinstance(q, Quantized):
        raise ValueError(f"q must be a Quantized, got {type(q).__name__}")
    codes = _grouped(q.codes, q.axis, q.group_size).astype(q.scale.dtype)  # (..., L/G, G)
    values = codes * np.moveaxis(q.scale, q.axis, -1)[..., None]
    if q.zero is not None:
        values = values + np.moveaxis(q.zero, q.axis, -1)[..., None]
    return _ungrouped(values, q.axis)


class QuantizedHeads:
    """Key (or value) heads ``(B, Hkv, S, Dh)`` held quantised, the newest in full precision.

    The oldest tokens are kept as :class:`Quantized` chunks, the newest in ``recent``;
    :meth:`append` moves tokens from ``recent`` into a new chunk under the rule of the
    module's notes (whole groups of ``group_size`` tokens per-channel, any number
    per-token; at least ``residual`` tokens left behind).

    Attributes
    ----------
    chunks : list of Quantized, each (B, Hkv, S_chunk, Dh), oldest first
    recent : np.ndarray, shape (B, Hkv, S_recent, Dh), or None while empty
    """

    def __init__(self, bits: int, per: str, group_size: int, symmetric: bool, residual: int):
        self.bits = check_bits(bits)
        self.axis = check_per(per, "per")
        self.per = per
        self.group_size = check_positive_int(group_size, "group_size")
        self.symmetric = check_symmetric(symmetric)
        self.residual = check_non_negative_int(residual, "residual")
        self.chunks: list[Quantized] = []
        self.recent: np.ndarray | None = None

    @property
    def quantized_length(self) -> int:
        return sum(chunk.codes.shape[2] for chunk in self.chunks)

    @property
    def length(self) -> int:
        return self.quantized_length + (0 if self.recent is None else self.recent.shape[2])

    def append(self, heads: np.ndarray) -> None:
        """Add ``(B, Hkv, S_new, Dh)`` heads; quantise the tokens the rule lets go."""
        if self.per == "token" and heads.shape[-1] % self.group_size:
            raise ValueError(
                f"group_size={self.group_size} must divide Dh={heads.shape[-1]} for "
                f"per-token quantisation (heads of shape {heads.shape})"
            )
        recent = heads if self.recent is None else np.concatenate([self.recent, heads], axis=2)
        # Per-channel groups are whole groups of tokens; a per-token group is in one token.
        step = self.group_size if self.per == "channel" else 1
        ready = max(recent.shape[2] - self.residual, 0) // step * step
        if ready:
            self.chunks.append(
                quantize(
                    recent[:, :, :ready],
                    self.bits,
                    axis=self.axis,
                    group_size=self.group_size,
                    symmetric=self.symmetric,
                )
            )
        self.recent = recent[:, :, ready:]

    def dequantized(self) -> np.ndarray:
        """All the heads as attention reads them: ``(B, Hkv, S, Dh)``, the quantised
        ones dequantised, the recent ones as they came."""
        return np.concatenate([dequantize(c) for c in self.chunks] + [self.recent], axis=2)

    def stored_bits(self, full_bits: int = 16) -> int:
        """Bits this store needs with packed codes, scales and zeros and recent tokens in
        ``full_bits`` each."""
        total = 0 if self.recent is None else self.recent.size * full_bits
        for c in self.chunks:
            total += c.codes.size * c.bits + c.scale.size * full_bits * (1 if c.symmetric else 2)
        return total


@dataclass(eq=False)
class QuantizedKVCache(KVCache):
    """A :class:`mha.KVCache` that stores its keys and values quantised (KIVI-style).

    Pass it as ``cache=`` to :func:`mha.multi_head_attention_steps` like a
    :class:`mha.KVCache`: each call appends the new heads, and attention reads the
    dequantised keys and values (the ``residual`` newest, and the unfinished key
    group, in full precision; see the module's notes).

    Parameters (keyword only)
    ----------
    bits : int, 2..8
    key_per, value_per : "channel" or "token"
        How keys and values are grouped; KIVI's pairing is the default.
    group_size : int
        ``G``: tokens per group per-channel, channels per group per-token (must divide
        Dh then).
    symmetric : bool
        Default False: asymmetric, as KIVI.
    residual : int, >= 0
        The newest tokens kept in full precision.

    Attributes
    ----------
    keys, values : QuantizedHeads
        What is stored.
    k_heads, v_heads : np.ndarray, shape (B, Hkv, S, Dh)
        The dequantised heads the last :meth:`append` returned (what attention read),
        kept for inspection and for :class:`mha.KVCache`'s ``length``.
    """

    bits: int = field(default=8, kw_only=True)
    key_per: str = field(default="channel", kw_only=True)
    value_per: str = field(default="token", kw_only=True)
    group_size: int = field(default=32, kw_only=True)
    symmetric: bool = field(default=False, kw_only=True)
    residual: int = field(default=0, kw_only=True)
    keys: QuantizedHeads = field(init=False, repr=False)
    values: QuantizedHeads = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.window is not None or self.k_heads is not None or self.v_heads is not None:
            raise ValueError(
                "a QuantizedKVCache starts empty and does not roll: pass neither window "
                "nor k_heads/v_heads"
            )
        check_per(self.key_per, "key_per")
        check_per(self.value_per, "value_per")
        self.keys = QuantizedHeads(
            self.bits, self.key_per, self.group_size, self.symmetric, self.residual
        )
        self.values = QuantizedHeads(
            self.bits, self.value_per, self.group_size, self.symmetric, self.residual
        )

    def append(self, k_heads: np.ndarray, v_heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store the heads of new positions; return all heads as attention reads them,
        dequantised, ``(B, Hkv, S, Dh)`` each."""
        k_heads = as_float_array(k_heads, "k_heads")
        v_heads = as_float_array(v_heads, "v_heads")
        if k_heads.ndim != 4 or v_heads.shape != k_heads.shape:
            raise ValueError(
                f"k_heads and v_heads must have one shape (B, Hkv, S_new, Dh), got "
                f"{k_heads.shape} and {v_heads.shape}"
            )
        if self.k_heads is not None and (
            k_heads.shape[:2] + k_heads.shape[3:] != self.k_heads.shape[:2] + self.k_heads.shape[3:]
        ):
            raise ValueError(
                f"new key heads {k_heads.shape} do not fit the cached ones "
                f"{self.k_heads.shape}: (B, Hkv, S, Dh) must agree except S"
            )
        self.keys.append(k_heads)
        self.values.append(v_heads)
        self.k_heads, self.v_heads = self.keys.dequantized(), self.values.dequantized()
        return self.k_heads, self.v_heads

    def stored_bits(self, full_bits: int = 16) -> int:
        """Bits the keys and values take, codes packed, scales, zeros and full-precision
        tokens at ``full_bits`` (16: a float16 or bfloat16 cache). Divide by
        ``2 * B * Hkv * S * Dh`` for bits per cached number."""
        return self.keys.stored_bits(full_bits) + self.values.stored_bits(full_bits)


def relative_error(exact: Any, approx: Any) -> float:
    """``||approx - exact|| / ||exact||`` (Frobenius norms over all entries)."""
    exact, approx = as_float_array(exact, "exact"), as_float_array(approx, "approx")
    if exact.shape != approx.shape:
        raise ValueError(f"exact {exact.shape} and approx {approx.shape} must have one shape")
    return float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))


@dataclass(frozen=True)
class QuantizationError:
    """Relative errors (:func:`relative_error`) a quantised cache introduces, measured."""

    keys: float
    values: float
    weights: float
    output: float


def quantization_error(
    q_heads: Any,
    k_heads: Any,
    v_heads: Any,
    *,
    bits: int,
    key_per: str = "channel",
    value_per: str = "token",
    group_size: int = 32,
    symmetric: bool = False,
    residual: int = 0,
    mask: Any | None = None,
) -> QuantizationError:
    """Measure what a :class:`QuantizedKVCache` does to keys, values, weights and output.

    The keys and values are appended to a fresh cache in one call, read back
    dequantised, and attention is computed with the exact and the dequantised ones.

    Parameters
    ----------
    q_heads : array_like, shape (B, H, T, Dh)
    k_heads, v_heads : array_like, shape (B, Hkv, S, Dh)
        ``Hkv`` dividing ``H`` (grouped-query attention).
    bits, key_per, value_per, group_size, symmetric, residual
        As in :class:`QuantizedKVCache`.
    mask : bool array_like, optional
        True = may attend, broadcastable to ``(B, H, T, S)``.

    Returns
    -------
    QuantizationError
        Relative errors of the keys, the values, the attention weights ``(B, H, T, S)``
        and the attention output (context) ``(B, H, T, Dh)``.
    """
    q_heads = as_float_array(q_heads, "q_heads")
    k_heads = as_float_array(k_heads, "k_heads")
    v_heads = as_float_array(v_heads, "v_heads")
    if q_heads.ndim != 4 or k_heads.ndim != 4:
        raise ValueError(
            f"q_heads (B, H, T, Dh) and k_heads (B, Hkv, S, Dh) must be 4-D, got "
            f"{q_heads.shape} and {k_heads.shape}"
        )
    cache = QuantizedKVCache(
        bits=bits,
        key_per=key_per,
        value_per=value_per,
        group_size=group_size,
        symmetric=symmetric,
        residual=residual,
    )
    k_hat, v_hat = cache.append(k_heads, v_heads)  # (B, Hkv, S, Dh) each
    index = kv_head_index(q_heads.shape[1], k_heads.shape[1])  # (H,): each head's kv head
    exact_out, exact_w = scaled_dot_product_attention(
        q_heads, k_heads[:, index], v_heads[:, index], mask
    )
    out, w = scaled_dot_product_attention(q_heads, k_hat[:, index], v_hat[:, index], mask)
    return QuantizationError(
        keys=relative_error(k_heads, k_hat),
        values=relative_error(v_heads, v_hat),
        weights=relative_error(exact_w, w),
        output=relative_error(exact_out, out),
    )

"""The quantised KV cache in torch: the twin of :mod:`mha.quant_cache`, written again.

The same formulas, names and rules (symmetric or asymmetric with a float zero point,
2 to 8 bits, groups of ``group_size`` along the token axis, per-channel, or the channel
axis, per-token; the newest tokens and an unfinished per-channel key group held in
full precision): see the specification's notes. :class:`QuantizedKVCache` is a
:class:`mha.kv_cache_torch.KVCache`, so :class:`mha.modules.MultiHeadAttention` takes it
as ``cache=``. :func:`quantization_error` computes its attention here, not with the
specification's.

Shapes: B batch, Hkv key/value heads, S cached length, Dh head_dim, G ``group_size``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mha._checks import (
    PER,
    check_bits,
    check_non_negative_int,
    check_per,
    check_positive_int,
    check_symmetric,
)
from mha.kv_cache_torch import KVCache
from mha.modules import kv_head_index

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

def _check_float(x: object, name: str) -> Tensor:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point Tensor, got {type(x).__name__}")
    return x


@dataclass(frozen=True, eq=False)
class Quantized:
    """A tensor in ``bits``-bit codes, one scale (and zero) per group: the fields of
    :class:`mha.quant_cache.Quantized`, as tensors (codes int8 symmetric, else uint8)."""

    codes: Tensor
    scale: Tensor
    zero: Tensor | None
    bits: int
    axis: int
    group_size: int

    @property
    def symmetric(self) -> bool:
        return self.zero is None


def quantize(
    x: Tensor,
    bits: int = 8,
    *,
    axis: int = -1,
    group_size: int | None = None,
    symmetric: bool = True,
) -> Quantized:
    """Quantise ``x`` in groups of ``group_size`` consecutive entries along ``axis``
    (default: the whole axis); see :func:`mha.quant_cache.quantize`."""
    x = _check_float(x, "x")
    bits = check_bits(bits)
    symmetric = check_symmetric(symmetric)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis must be an int naming one of x's {x.dim()} dims, got {axis!r}")
    axis %= x.dim()
    length = x.shape[axis]
    group_size = length if group_size is None else check_positive_int(group_size, "group_size")
    if length % group_size:
        raise ValueError(
            f"group_size={group_size} must divide the length {length} of axis {axis} "
            f"(x of shape {tuple(x.shape)})"
        )
    # (..., L, ...) -> (..., L/G, G): unflatten the axis into groups, in place.
    groups = x.unflatten(axis, (length // group_size, group_size))
    stat = axis + 1  # the dim inside each group
    if symmetric:
        top = 2 ** (bits - 1) - 1
        spread = groups.abs().amax(dim=stat, keepdim=True)  # one per group
        scale = torch.where(spread > 0, spread / top, torch.ones_like(spread))
        codes = torch.round(groups / scale).to(torch.int8)
        zero = None
    else:
        top = 2**bits - 1
        zero = groups.amin(dim=stat, keepdim=True)
        spread = groups.amax(dim=stat, keepdim=True) - zero
        scale = torch.where(spread > 0, spread / top, torch.ones_like(spread))
        codes = torch.round((groups - zero) / scale).to(torch.uint8)
        zero = zero.squeeze(stat)
    return Quantized(
        codes=codes.flatten(axis, stat),
        scale=scale.squeeze(stat),
        zero=zero,
        bits=bits,
        axis=axis,
        group_size=group_size,
    )


def dequantize(q: Quantized) -> Tensor:
    """``codes * scale (+ zero)``, the original shape."""
    if not isinstance(q, Quantized):
        raise ValueError(f"q must be a torch Quantized, got {type(q).__name__}")
    groups = q.codes.unflatten(q.axis, (q.scale.shape[q.axis], q.group_size))  # (.., L/G, G, ..)
    values = groups.to(q.scale.dtype) * q.scale.unsqueeze(q.axis + 1)
    if q.zero is not None:
        values = values + q.zero.unsqueeze(q.axis + 1)
    return values.flatten(q.axis, q.axis + 1)


class QuantizedHeads:
    """Key (or value) heads ``(B, Hkv, S, Dh)`` held quantised, the newest in full
    precision: :class:`mha.quant_cache.QuantizedHeads` in torch."""

    def __init__(self, bits: int, per: str, group_size: int, symmetric: bool, residual: int):
        self.bits = check_bits(bits)
        self.axis = check_per(per, "per")
        self.per = per
        self.group_size = check_positive_int(group_size, "group_size")
        self.symmetric = check_symmetric(symmetric)
        self.residual = check_non_negative_int(residual, "residual")
        self.chunks: list[Quantized] = []
        self.recent: Tensor | None = None

    @property
    def quantized_length(self) -> int:
        return sum(chunk.codes.shape[2] for chunk in self.chunks)

    @property
    def length(self) -> int:
        return self.quantized_length + (0 if self.recent is None else self.recent.shape[2])

    def append(self, heads: Tensor) -> None:
        """Add ``(B, Hkv, S_new, Dh)`` heads; quantise the tokens the rule lets go."""
        if self.per == "token" and heads.shape[-1] % self.group_size:
            raise ValueError(
                f"group_size={self.group_size} must divide Dh={heads.shape[-1]} for "
                f"per-token quantisation (heads of shape {tuple(heads.shape)})"
            )
        recent = heads if self.recent is None else torch.cat([self.recent, heads], dim=2)
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

    def dequantized(self) -> Tensor:
        """All the heads as attention reads them, ``(B, Hkv, S, Dh)``."""
        return torch.cat([dequantize(c) for c in self.chunks] + [self.recent], dim=2)

    def stored_bits(self, full_bits: int = 16) -> int:
        """Bits with packed codes, and scales, zeros and recent tokens at ``full_bits``."""
        total = 0 if self.recent is None else self.recent.numel() * full_bits
        for c in self.chunks:
            total += c.codes.numel() * c.bits + c.scale.numel() * full_bits * (
                1 if c.symmetric else 2
            )
        return total


class QuantizedKVCache(KVCache):
    """A :class:`mha.kv_cache_torch.KVCache` storing keys and values quantised, for
    :class:`mha.modules.MultiHeadAttention`'s ``cache=``; the arguments (keyword only)
    and attributes of :class:`mha.quant_cache.QuantizedKVCache`."""

    def __init__(
        self,
        *,
        bits: int = 8,
        key_per: str = "channel",
        value_per: str = "token",
        group_size: int = 32,
        symmetric: bool = False,
        residual: int = 0,
    ):
        super().__init__()
        check_per(key_per, "key_per")
        check_per(value_per, "value_per")
        self.bits, self.key_per, self.value_per = bits, key_per, value_per
        self.group_size, self.symmetric, self.residual = group_size, symmetric, residual
        self.keys = QuantizedHeads(bits, key_per, group_size, symmetric, residual)
        self.values = QuantizedHeads(bits, value_per, group_size, symmetric, residual)

    def append(self, k_heads: Tensor, v_heads: Tensor) -> tuple[Tensor, Tensor]:
        """Store new ``(B, Hkv, S_new, Dh)`` heads; return all heads dequantised."""
        _check_float(k_heads, "k_heads")
        _check_float(v_heads, "v_heads")
        if k_heads.dim() != 4 or v_heads.shape != k_heads.shape:
            raise ValueError(
                f"k_heads and v_heads must have one shape (B, Hkv, S_new, Dh), got "
                f"{tuple(k_heads.shape)} and {tuple(v_heads.shape)}"
            )
        cached = self.k_heads
        if cached is not None and (
            k_heads.shape[:2] != cached.shape[:2] or k_heads.shape[3] != cached.shape[3]
        ):
            raise ValueError(
                f"new key heads {tuple(k_heads.shape)} do not fit the cached ones "
                f"{tuple(cached.shape)}: (B, Hkv, S, Dh) must agree except S"
            )
        self.keys.append(k_heads)
        self.values.append(v_heads)
        self.k_heads, self.v_heads = self.keys.dequantized(), self.values.dequantized()
        return self.k_heads, self.v_heads

    def stored_bits(self, full_bits: int = 16) -> int:
        """Bits the keys and values take (see the specification's)."""
        return self.keys.stored_bits(full_bits) + self.values.stored_bits(full_bits)


def relative_error(exact: Tensor, approx: Tensor) -> float:
    """``||approx - exact|| / ||exact||`` (Frobenius norms over all entries)."""
    _check_float(exact, "exact")
    _check_float(approx, "approx")
    if exact.shape != approx.shape:
        raise ValueError(
            f"exact {tuple(exact.shape)} and approx {tuple(approx.shape)} must have one shape"
        )
    return float(torch.linalg.vector_norm(approx - exact) / torch.linalg.vector_norm(exact))


@dataclass(frozen=True)
class QuantizationError:
    """Relative errors a quantised cache introduces, measured."""

    keys: float
    values: float
    weights: float
    output: float


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """``softmax(q k^T / sqrt(Dh)) v``; returns (context, weights). Every row of ``mask``
    must allow a key (this is a measuring tool, not the module's attention)."""
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (B, H, T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights  # (B, H, T, Dh), (B, H, T, S)


def quantization_error(
    q_heads: Tensor,
    k_heads: Tensor,
    v_heads: Tensor,
    *,
    bits: int,
    key_per: str = "channel",
    value_per: str = "token",
    group_size: int = 32,
    symmetric: bool = False,
    residual: int = 0,
    mask: Tensor | None = None,
) -> QuantizationError:
    """Measure what a :class:`QuantizedKVCache` does to keys, values, weights and output:
    ``q_heads (B, H, T, Dh)``, ``k_heads`` and ``v_heads (B, Hkv, S, Dh)``, ``mask`` bool
    broadcastable to ``(B, H, T, S)`` with every row allowing a key; see
    :func:`mha.quant_cache.quantization_error`."""
    for name, x in (("q_heads", q_heads), ("k_heads", k_heads), ("v_heads", v_heads)):
        if _check_float(x, name).dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, heads, length, Dh), got {tuple(x.shape)}")
    cache = QuantizedKVCache(
        bits=bits,
        key_per=key_per,
        value_per=value_per,
        group_size=group_size,
        symmetric=symmetric,
        residual=residual,
    )
    k_hat, v_hat = cache.append(k_heads, v_heads)
    index = kv_head_index(q_heads.shape[1], k_heads.shape[1]).to(q_heads.device)  # (H,)
    exact_out, exact_w = _attend(q_heads, k_heads[:, index], v_heads[:, index], mask)
    out, w = _attend(q_heads, k_hat[:, index], v_hat[:, index], mask)
    return QuantizationError(
        keys=relative_error(k_heads, k_hat),
        values=relative_error(v_heads, v_hat),
        weights=relative_error(exact_w, w),
        output=relative_error(exact_out, out),
    )

"""The KV cache of :class:`mha.modules.MultiHeadAttention`: key and value heads of the
positions decoded so far, growing, fixed (cross-attention) or rolling (a window).

The torch twin of the specification's :class:`mha.KVCache` (same field names and
rules, written again here, not imported: the tests compare the two layers).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mha._checks import check_positive_int

__all__ = ["KVCache"]


class KVCache:
    """The key and value heads one attention layer has computed so far.

    Pass one to :meth:`MultiHeadAttention.forward` at every decoding step: the keys
    and values of the new positions are projected, appended here, and the new queries
    attend to everything cached. With grouped-query attention only the ``Hkv`` shared
    heads are stored, which is the memory grouped-query attention saves.

    Parameters
    ----------
    fixed : bool
        For cross-attention: the first call stores the projected encoder memory, and
        later calls reuse it without projecting ``key`` and ``value`` again.
    window : int, optional
        A rolling cache for sliding-window attention, each query seeing itself and the
        ``window - 1`` positions before it. :meth:`append` first cuts the stored
        entries to the last ``window - 1`` (all a new query may still need besides
        itself), then appends the new ones: one position at a time, the cache holds
        exactly ``window`` entries once warm, however long the sequence; a block of
        ``T`` new positions makes it hold at most ``window - 1 + T``, and the block's
        queries must be masked with ``mha.sliding_window_mask(T, window, num_keys=S)``,
        ``S`` the number of keys after the append (all True, omissible, for ``T = 1``).
        Default None: keep everything. Not allowed with ``fixed``: the encoder
        memory is not a sequence that grows.

    Attributes
    ----------
    k_heads, v_heads : Tensor, shape (B, Hkv, S, Dh), or None while empty
        The same names as the specification's :class:`mha.KVCache`.
    """

    def __init__(self, fixed: bool = False, window: int | None = None):
        if window is not None:
            window = check_positive_int(window, "window")
            if fixed:
                raise ValueError(
                    f"window={window} needs a cache that grows: a fixed (cross-attention) "
                    "cache stores the encoder memory once and cannot roll"
                )
        self.fixed = fixed
        self.window = window
        self.k_heads: Tensor | None = None
        self.v_heads: Tensor | None = None

    @property
    def length(self) -> int:
        """``S``, the number of positions cached."""
        return 0 if self.k_heads is None else self.k_heads.shape[2]

    @property
    def kept_length(self) -> int:
        """How many cached positions the next :meth:`append` keeps: all of them, or with
        a window the last ``window - 1``."""
        return self.length if self.window is None else min(self.length, self.window - 1)

    def check_block(self, size: int, num_keys: int, has_mask: bool) -> None:
        """Refuse a block of ``size > 1`` new positions through a rolling cache without a
        mask (its first query would see the later ones); the mask it needs is
        ``mha.sliding_window_mask(size, window, num_keys=num_keys)``. The rule of the
        specification's :meth:`mha.KVCache.check_block`, stated again for this layer.
        """
        if self.window is not None and size > 1 and not has_mask:
            raise ValueError(
                f"{size} new positions through a rolling cache (window={self.window}) "
                "need a mask: without one the first would see the later ones; pass "
                f"mha.sliding_window_mask({size}, {self.window}, num_keys={num_keys})"
            )

    def append(self, k_heads: Tensor, v_heads: Tensor) -> tuple[Tensor, Tensor]:
        """Store new key and value heads after the (kept) cached ones; return all the
        heads now stored, ``(B, Hkv, kept_length + S_new, Dh)`` each."""
        if self.k_heads is not None:
            cached = self.k_heads
            if k_heads.shape[:2] != cached.shape[:2] or k_heads.shape[3] != cached.shape[3]:
                raise ValueError(
                    f"new key heads {tuple(k_heads.shape)} do not fit the cached ones "
                    f"{tuple(cached.shape)}: (B, Hkv, S, Dh) must agree except S"
                )
            start = self.length - self.kept_length  # not [-kept:], which is all for 0
            # (B, Hkv, kept + S_new, Dh) each
            k_heads = torch.cat([cached[:, :, start:], k_heads], dim=2)
            v_heads = torch.cat([self.v_heads[:, :, start:], v_heads], dim=2)
        self.k_heads, self.v_heads = k_heads, v_heads
        return k_heads, v_heads

"""The specification's KV cache: the key and value heads of earlier positions.

:func:`mha.multi_head_attention_steps` takes one as ``cache=``. With a ``window`` the
cache rolls, for sliding-window attention; :meth:`KVCache.check_block` is the rule a
block of several new positions must follow then (the mask it needs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mha._checks import check_positive_int

__all__ = ["KVCache"]


@dataclass(eq=False)
class KVCache:
    """The key and value heads one attention layer has computed so far.

    Decoding one token at a time, the keys and values of the earlier positions do not
    change: :func:`multi_head_attention_steps` with a cache projects only the new
    positions, appends their heads here, and lets the new queries attend to all of
    them. With grouped-query attention only the ``Hkv`` shared heads are stored.

    With a ``window`` the cache rolls, for sliding-window attention
    (:func:`mha.sliding_window_mask`): :meth:`append` first cuts the stored entries to
    the last ``window - 1`` (all that a new query may still need besides itself), then
    appends the new ones. Decoding one position at a time, it holds exactly ``window``
    entries once warm, however long the sequence; a block of ``T`` new positions makes
    it hold at most ``window - 1 + T``. The queries of a block must then be masked with
    ``mha.sliding_window_mask(T, window, num_keys=S)``, ``S`` being the number of keys
    after the append (for ``T = 1`` that mask is all True and may be left out).

    Attributes
    ----------
    k_heads, v_heads : np.ndarray, shape (B, Hkv, S, Dh), or None while empty
    window : int, optional
        Positions each query attends to, itself included. Default None: keep
        everything.
    """

    k_heads: np.ndarray | None = None
    v_heads: np.ndarray | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        if self.window is not None:
            self.window = check_positive_int(self.window, "window")

    @property
    def length(self) -> int:
        """``S``, the number of positions cached."""
        return 0 if self.k_heads is None else self.k_heads.shape[2]

    @property
    def kept_length(self) -> int:
        """How many cached positions the next :meth:`append` keeps: all of them, or with
        a window the last ``window - 1``. The keys after the append number this plus
        the new ones."""
        return self.length if self.window is None else min(self.length, self.window - 1)

    def check_block(self, size: int, num_keys: int, has_mask: bool) -> None:
        """Refuse a block of ``size > 1`` new positions through a rolling cache without a
        mask: unmasked, its first query would see the later ones. The mask it needs is
        ``mha.sliding_window_mask(size, window, num_keys=num_keys)``, ``num_keys``
        counting the kept cached positions and the new ones. One position needs none.
        (The torch cache, :class:`mha.kv_cache_torch.KVCache`, states the same rule again.)
        """
        if self.window is not None and size > 1 and not has_mask:
            raise ValueError(
                f"{size} new positions through a rolling cache (window={self.window}) "
                "need a mask: without one the first would see the later ones; pass "
                f"mha.sliding_window_mask({size}, {self.window}, num_keys={num_keys})"
            )

    def append(self, k_heads: np.ndarray, v_heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store the heads of new positions after the (kept) cached ones; return all the
        heads now stored, ``(B, Hkv, kept_length + S_new, Dh)`` each."""
        if self.k_heads is not None:
            if k_heads.shape[:2] + k_heads.shape[3:] != self.k_heads.shape[:2] + (
                self.k_heads.shape[3],
            ):
                raise ValueError(
                    f"new key heads {k_heads.shape} do not fit the cached ones "
                    f"{self.k_heads.shape}: (B, Hkv, S, Dh) must agree except S"
                )
            # Start index, not [-kept:]: with kept = 0, [-0:] would keep everything.
            start = self.length - self.kept_length
            k_heads = np.concatenate([self.k_heads[:, :, start:], k_heads], axis=2)  # along S
            v_heads = np.concatenate([self.v_heads[:, :, start:], v_heads], axis=2)
        self.k_heads, self.v_heads = k_heads, v_heads
        return k_heads, v_heads

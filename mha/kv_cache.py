"""The specification's KV cache: the key and value heads of earlier positions.

:func:`mha.multi_head_attention_steps` takes one as ``cache=``. With a ``window`` the
cache rolls, for sliding-window attention, optionally keeping the first ``num_sinks``
positions for good (attention sinks); :meth:`KVCache.check_block` is the rule a block
of several new positions must follow then (the mask it needs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mha._checks import check_non_negative_int, check_positive_int

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

    With ``num_sinks`` as well (StreamingLLM's attention sinks, Xiao et al., 2024,
    :func:`mha.sliding_window_mask`) the cut spares the first ``num_sinks`` positions:
    :meth:`append` keeps those and the last ``window - 1``, evicting the middle, so a
    warm cache decoding one position at a time holds ``num_sinks + window`` entries.
    Attention over them equals full attention under
    ``mha.sliding_window_mask(T, window, num_keys=S, num_sinks=num_sinks)`` (all True
    for ``T = 1``: one new query may see every key kept), because the kept keys keep
    the positions they were rotated or biased at. (StreamingLLM instead numbers the
    positions within the cache, so that no distance exceeds the cache's size; that
    choice belongs to whoever applies the positions, not to this cache.)

    Attributes
    ----------
    k_heads, v_heads : np.ndarray, shape (B, Hkv, S, Dh), or None while empty
    window : int, optional
        Positions each query attends to, itself included. Default None: keep
        everything.
    num_sinks : int
        ``>= 0``: the first positions kept for good; needs a ``window``. Default 0.
    """

    k_heads: np.ndarray | None = None
    v_heads: np.ndarray | None = None
    window: int | None = None
    num_sinks: int = 0

    def __post_init__(self) -> None:
        if self.window is not None:
            self.window = check_positive_int(self.window, "window")
        self.num_sinks = check_non_negative_int(self.num_sinks, "num_sinks")
        if self.num_sinks and self.window is None:
            raise ValueError(
                f"num_sinks={self.num_sinks} needs a window: without one the cache "
                "keeps every position anyway"
            )

    @property
    def length(self) -> int:
        """``S``, the number of positions cached."""
        return 0 if self.k_heads is None else self.k_heads.shape[2]

    @property
    def kept_length(self) -> int:
        """How many cached positions the next :meth:`append` keeps: all of them, or with
        a window the last ``window - 1`` (after the ``num_sinks`` first). The keys after
        the append number this plus the new ones."""
        if self.window is None:
            return self.length
        return min(self.length, self.num_sinks + self.window - 1)

    def check_block(self, size: int, num_keys: int, has_mask: bool) -> None:
        """Refuse a block of ``size > 1`` new positions through a rolling cache without a
        mask: unmasked, its first query would see the later ones. The mask it needs is
        ``mha.sliding_window_mask(size, window, num_keys=num_keys, num_sinks=num_sinks)``,
        ``num_keys`` counting the kept cached positions and the new ones. One position
        needs none. (The torch cache, :class:`mha.kv_cache_torch.KVCache`, states the
        same rule again, without sinks.)
        """
        if self.window is not None and size > 1 and not has_mask:
            sinks = f", num_sinks={self.num_sinks}" if self.num_sinks else ""
            raise ValueError(
                f"{size} new positions through a rolling cache (window={self.window}"
                f"{sinks}) need a mask: without one the first would see the later ones; "
                f"pass mha.sliding_window_mask({size}, {self.window}, num_keys={num_keys}"
                f"{sinks})"
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
            # The sinks (none without num_sinks), then the band from `start` on. A start
            # index, not [-kept:]: with nothing kept, [-0:] would keep everything.
            sinks = min(self.num_sinks, self.kept_length)
            start = self.length - (self.kept_length - sinks)
            kept = np.r_[0:sinks, start : self.length]  # (kept_length,) indices along S
            k_heads = np.concatenate([self.k_heads[:, :, kept], k_heads], axis=2)  # along S
            v_heads = np.concatenate([self.v_heads[:, :, kept], v_heads], axis=2)
        self.k_heads, self.v_heads = k_heads, v_heads
        return k_heads, v_heads

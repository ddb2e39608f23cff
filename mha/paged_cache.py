"""A paged KV cache: many sequences' key and value heads in one pool of fixed-size blocks.

A contiguous cache (:class:`mha.KVCache`) gives each sequence one growing array; a
server that must reserve memory up front reserves the longest a request may become,
and most of it stays empty. Paging (Kwon et al., 2023, "Efficient Memory Management
for Large Language Model Serving with PagedAttention", the vLLM paper) cuts the
memory into *blocks* of ``block_size`` positions. A sequence owns a list of block ids,
its *block table*; position ``p`` lives in block ``table[p // block_size]`` at offset
``p % block_size``. A sequence takes a new block only when its last one is full, so
at most ``block_size - 1`` slots of each sequence are empty; when it finishes, its
blocks go back to the pool for the next request.

Attention is unchanged: :meth:`PagedKVCache.gather` reads a sequence's keys and values
back in order, and :func:`paged_attention` attends to them, equal to what the
contiguous cache gives. :func:`memory_waste` compares the two ways of reserving.

Shapes: Hkv key/value heads, Dh head_dim, ``N`` sequences in one call, ``S`` a
sequence's cached length, ``block_size`` positions per block.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mha._checks import (
    as_float_array,
    check_ndim,
    check_non_negative_int,
    check_positive_int,
    check_seq_id,
)
from mha.attention import kv_head_index, scaled_dot_product_attention
from mha.kv_cache import KVCache
from mha.masks import causal_mask

__all__ = [
    "EMPTY",
    "MemoryWaste",
    "PagedKVCache",
    "PagedSequence",
    "memory_waste",
    "paged_attention",
]

EMPTY = -1  # the owner of a free slot in :meth:`PagedKVCache.occupancy`


class PagedKVCache:
    """Key and value heads of many sequences in a pool of ``num_blocks`` blocks.

    Parameters
    ----------
    num_blocks : int
        Blocks in the pool (its whole memory: ``num_blocks * block_size`` positions).
    block_size : int
        Positions per block.
    num_kv_heads, head_dim : int
        ``Hkv`` and ``Dh`` of the keys and values stored.
    dtype : numpy dtype, default float64

    Attributes
    ----------
    k_pool, v_pool : np.ndarray, shape (num_blocks, Hkv, block_size, Dh)
        The memory. A block's slots hold one sequence's consecutive positions; a free
        block's contents are stale and never read.
    block_tables : dict[int, list[int]]
        Each sequence's block ids, in order of position (read-only by convention).
    lengths : dict[int, int]
        Each sequence's number of cached positions.

    Free blocks are handed out lowest id first, so that freed blocks are the next to be
    reused and a drawing of the pool is the same on every run.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: Any = np.float64,
    ):
        self.num_blocks = check_positive_int(num_blocks, "num_blocks")
        self.block_size = check_positive_int(block_size, "block_size")
        self.num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        self.head_dim = check_positive_int(head_dim, "head_dim")
        if not np.issubdtype(np.dtype(dtype), np.floating):
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype!r}")
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        self.k_pool = np.zeros(shape, dtype=dtype)  # (num_blocks, Hkv, block_size, Dh)
        self.v_pool = np.zeros(shape, dtype=dtype)
        self.block_tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self._free = list(range(num_blocks))  # a heap: the lowest free id first

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_needed(self, length: int) -> int:
        """Blocks a sequence of ``length`` positions occupies: ``ceil(length / block_size)``."""
        return -(-check_non_negative_int(length, "length") // self.block_size)

    def _known(self, seq_id: object) -> int:
        seq_id = check_seq_id(seq_id)
        if seq_id not in self.block_tables:
            raise ValueError(
                f"seq_id={seq_id} is not in the cache (sequences held: {sorted(self.block_tables)})"
            )
        return seq_id

    def append(self, seq_id: int, k_heads: Any, v_heads: Any) -> tuple[np.ndarray, np.ndarray]:
        """Store the heads of a sequence's new positions after its cached ones.

        A sequence seen for the first time starts empty. New blocks are taken from the
        pool only when the sequence's last block is full; if the pool has too few, a
        ValueError is raised before anything is written.

        Parameters
        ----------
        seq_id : int, >= 0
        k_heads, v_heads : array_like, shape (Hkv, S_new, Dh)
            One sequence's new positions (no batch axis).

        Returns
        -------
        k_heads, v_heads : np.ndarray, shape (Hkv, S, Dh)
            All the sequence's heads now stored, as :meth:`gather` reads them (as
            :meth:`mha.KVCache.append` returns them).
        """
        seq_id = check_seq_id(seq_id)
        k_heads = as_float_array(k_heads, "k_heads")
        v_heads = as_float_array(v_heads, "v_heads")
        check_ndim(k_heads, 3, "k_heads", "(Hkv, S_new, Dh)")
        want = (self.num_kv_heads, k_heads.shape[1], self.head_dim)
        for name, x in (("k_heads", k_heads), ("v_heads", v_heads)):
            if x.shape != want:
                raise ValueError(
                    f"{name} has shape {x.shape}, but this cache stores (Hkv, S_new, Dh) "
                    f"= {want} (k_heads {k_heads.shape})"
                )
        start = self.lengths.get(seq_id, 0)
        end = start + k_heads.shape[1]
        table = self.block_tables.get(seq_id, [])
        missing = self.blocks_needed(end) - len(table)
        if missing > len(self._free):
            raise ValueError(
                f"seq_id={seq_id} needs {missing} new block(s) for {k_heads.shape[1]} "
                f"positions, but only {len(self._free)} of {self.num_blocks} are free: "
                "free a finished sequence first"
            )
        table = table + [heapq.heappop(self._free) for _ in range(missing)]
        self.block_tables[seq_id], self.lengths[seq_id] = table, end
        for pos in range(start, end):  # one position at a time: the block-table lookup
            block, offset = table[pos // self.block_size], pos % self.block_size
            self.k_pool[block, :, offset] = k_heads[:, pos - start]  # (Hkv, Dh)
            self.v_pool[block, :, offset] = v_heads[:, pos - start]
        return self.gather(seq_id)

    def gather(self, seq_id: int) -> tuple[np.ndarray, np.ndarray]:
        """A sequence's key and value heads, read from its blocks in order.

        Returns
        -------
        k_heads, v_heads : np.ndarray, shape (Hkv, S, Dh)
            Copies, equal to what a contiguous cache holds for this sequence.
        """
        seq_id = self._known(seq_id)
        table, length = self.block_tables[seq_id], self.lengths[seq_id]
        out = []
        for pool in (self.k_pool, self.v_pool):
            blocks = pool[table]  # (n_blocks, Hkv, block_size, Dh), a copy
            heads = blocks.transpose(1, 0, 2, 3)  # -> (Hkv, n_blocks, block_size, Dh)
            heads = heads.reshape(self.num_kv_heads, len(table) * self.block_size, self.head_dim)
            out.append(heads[:, :length])  # the last block's unused slots cut off
        return out[0], out[1]

    def free(self, seq_id: int) -> list[int]:
        """Forget a finished sequence and return its blocks to the pool; returns their ids.
        Their contents are not cleared: a block is only read up to its owner's length."""
        seq_id = self._known(seq_id)
        table = self.block_tables.pop(seq_id)
        del self.lengths[seq_id]
        for block in table:
            heapq.heappush(self._free, block)
        return table

    def slots(self, seq_id: int) -> np.ndarray:
        """Where each position of a sequence lives: ``(S, 2)`` int rows ``(block, offset)``,
        ``block = table[p // block_size]`` and ``offset = p % block_size``."""
        seq_id = self._known(seq_id)
        positions = np.arange(self.lengths[seq_id])  # (S,)
        table = np.asarray(self.block_tables[seq_id], dtype=int)
        return np.stack([table[positions // self.block_size], positions % self.block_size], 1)

    def sequence(self, seq_id: int) -> PagedSequence:
        """One sequence of the pool as a :class:`mha.KVCache` with ``B = 1``, for
        :func:`mha.multi_head_attention_steps`'s ``cache=``."""
        return PagedSequence(pool=self, seq_id=check_seq_id(seq_id))

    def occupancy(self) -> np.ndarray:
        """The pool as a picture: ``(num_blocks, block_size)`` ints, the id of the sequence
        each slot holds a position of, ``-1`` where the slot is free (a free block, or
        the unused end of a sequence's last block)."""
        owner = np.full((self.num_blocks, self.block_size), EMPTY, dtype=int)
        for seq_id in self.block_tables:
            block, offset = self.slots(seq_id).T
            owner[block, offset] = seq_id
        return owner


@dataclass(eq=False)
class PagedSequence(KVCache):
    """One sequence of a :class:`PagedKVCache`, usable wherever a :class:`mha.KVCache` is
    (a batch of one): :meth:`append` writes the new heads into the pool's blocks and
    returns the sequence's heads gathered back, ``(1, Hkv, S, Dh)`` each. Made by
    :meth:`PagedKVCache.sequence`.

    Attributes
    ----------
    pool : PagedKVCache
    seq_id : int
    k_heads, v_heads : np.ndarray, shape (1, Hkv, S, Dh), or None before the first append
        What the last :meth:`append` returned: a gathered copy, for inspection (the
        pool holds the data).
    """

    pool: PagedKVCache | None = field(default=None, kw_only=True)
    seq_id: int = field(default=0, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.pool, PagedKVCache):
            raise ValueError(f"pool must be a PagedKVCache, got {type(self.pool).__name__}")
        if self.window is not None:
            raise ValueError(f"a paged sequence does not roll: window={self.window}")

    @property
    def length(self) -> int:
        return self.pool.lengths.get(self.seq_id, 0)

    def append(self, k_heads: np.ndarray, v_heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store ``(1, Hkv, S_new, Dh)`` new heads; return all, ``(1, Hkv, S, Dh)`` each."""
        if np.ndim(k_heads) != 4 or np.shape(k_heads)[0] != 1:
            raise ValueError(
                f"k_heads must have shape (1, Hkv, S_new, Dh): a paged sequence is a batch "
                f"of one, got {np.shape(k_heads)}"
            )
        k, v = self.pool.append(self.seq_id, k_heads[0], np.asarray(v_heads)[0])
        self.k_heads, self.v_heads = k[None], v[None]  # (Hkv, S, Dh) -> (1, Hkv, S, Dh)
        return self.k_heads, self.v_heads


def paged_attention(
    q_heads: Any, cache: PagedKVCache, seq_ids: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Causal attention of ``N`` sequences' newest queries to their paged keys and values.

    Sequence ``i``'s ``T`` queries are its last ``T`` cached positions (append their
    keys and values first, as :func:`mha.multi_head_attention_steps` does with a
    cache): query ``t`` sees positions up to its own, ``mha.causal_mask(T,
    num_keys=S_i)``. The sequences may have different lengths ``S_i``.

    Parameters
    ----------
    q_heads : array_like, shape (N, H, T, Dh)
        ``H`` a multiple of the cache's ``Hkv`` (grouped-query attention: query head
        ``h`` reads key/value head ``h // (H / Hkv)``).
    cache : PagedKVCache
    seq_ids : list of int, length N
        The sequence each row of ``q_heads`` belongs to; each holds at least ``T``
        positions.

    Returns
    -------
    context : np.ndarray, shape (N, H, T, Dh)
    weights : np.ndarray, shape (N, H, T, S_max)
        ``S_max`` the longest of the sequences; the weights past a sequence's own
        length are exactly 0, as if it had been padded.
    """
    if not isinstance(cache, PagedKVCache):
        raise ValueError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    q_heads = as_float_array(q_heads, "q_heads")
    check_ndim(q_heads, 4, "q_heads", "(N, H, T, Dh)")
    seq_ids = [cache._known(s) for s in seq_ids]
    n, num_heads, size, head_dim = q_heads.shape
    if len(seq_ids) != n:
        raise ValueError(f"seq_ids names {len(seq_ids)} sequences for q_heads {q_heads.shape}")
    if head_dim != cache.head_dim:
        raise ValueError(f"q_heads {q_heads.shape} must have Dh = {cache.head_dim}, the cache's")
    index = kv_head_index(num_heads, cache.num_kv_heads)  # (H,): each head's kv head
    lengths = [cache.lengths[s] for s in seq_ids]
    if min(lengths) < size:
        raise ValueError(
            f"q_heads has T={size} queries, but a sequence holds only {min(lengths)} "
            f"positions (lengths {lengths}): the queries are the last T cached positions"
        )
    context = np.zeros_like(q_heads)  # (N, H, T, Dh)
    weights = np.zeros((n, num_heads, size, max(lengths)), dtype=q_heads.dtype)
    for i, (seq_id, length) in enumerate(zip(seq_ids, lengths, strict=True)):
        k, v = cache.gather(seq_id)  # (Hkv, S_i, Dh) each
        context[i], weights[i, :, :, :length] = scaled_dot_product_attention(
            q_heads[i], k[index], v[index], causal_mask(size, num_keys=length)
        )  # (H, T, Dh) and (H, T, S_i)
    return context, weights


@dataclass(frozen=True)
class MemoryWaste:
    """Empty cache slots of each request under two ways of reserving memory.

    Attributes
    ----------
    lengths : np.ndarray, shape (R,)          positions each request ends up caching
    contiguous : np.ndarray, shape (R,)       ``max_length - length``: slots reserved for
                                              the longest possible request, never used
    paged : np.ndarray, shape (R,)            unused slots of the request's last block
    max_length, block_size : int
    """

    lengths: np.ndarray
    contiguous: np.ndarray
    paged: np.ndarray
    max_length: int
    block_size: int

    @property
    def contiguous_fraction(self) -> float:
        """Share of the contiguously reserved slots left empty."""
        return float(self.contiguous.sum() / (self.lengths.size * self.max_length))

    @property
    def paged_fraction(self) -> float:
        """Share of the slots in the requests' blocks left empty."""
        return float(self.paged.sum() / (self.lengths.sum() + self.paged.sum()))


def memory_waste(lengths: Any, block_size: int, max_length: int) -> MemoryWaste:
    """Slots wasted by contiguous reservation and by paging, over a list of requests.

    A contiguous cache must reserve, before a request starts, room for the longest it
    may become (``max_length``); a paged cache takes blocks as the request grows, and
    only the last one is partly empty (fewer than ``block_size`` slots).

    Parameters
    ----------
    lengths : array_like of int, shape (R,)
        Final cached length of each request, ``1 <= length <= max_length``.
    block_size : int
    max_length : int

    Returns
    -------
    MemoryWaste
    """
    block_size = check_positive_int(block_size, "block_size")
    max_length = check_positive_int(max_length, "max_length")
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"lengths must be a non-empty 1-D list of integers, got {lengths!r}")
    if arr.min() < 1 or arr.max() > max_length:
        raise ValueError(
            f"lengths must lie in 1..max_length={max_length}, got {arr.min()}..{arr.max()}"
        )
    blocks = -(-arr // block_size)  # ceil: blocks each request ends up owning
    return MemoryWaste(
        lengths=arr,
        contiguous=max_length - arr,
        paged=blocks * block_size - arr,
        max_length=max_length,
        block_size=block_size,
    )

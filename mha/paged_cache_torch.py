"""The paged KV cache in torch: the twin of :mod:`mha.paged_cache`, written again.

Same names and rules as the specification (a pool of blocks, a block table per
sequence, blocks freed and reused lowest id first); the code differs on purpose: the
positions are written and read through their slots all at once, and
:func:`paged_attention` attends for all sequences in one batched product over their
padded block tables, the way a serving kernel does, where the specification loops
over the sequences. The tests compare the two.

Shapes: Hkv key/value heads, Dh head_dim, ``N`` sequences in one call, ``S`` a
sequence's cached length, ``block_size`` positions per block.
"""

from __future__ import annotations

import heapq

import torch
from torch import Tensor

from mha._checks import check_non_negative_int, check_positive_int, check_seq_id
from mha.kv_cache_torch import KVCache
from mha.modules import kv_head_index

__all__ = ["PagedKVCache", "PagedSequence", "paged_attention"]

EMPTY = -1  # the owner of a free slot in :meth:`PagedKVCache.occupancy`


class PagedKVCache:
    """Key and value heads of many sequences in a pool of ``num_blocks`` blocks.

    The torch twin of :class:`mha.paged_cache.PagedKVCache`: see there.

    Parameters
    ----------
    num_blocks, block_size, num_kv_heads, head_dim : int
    dtype : torch.dtype, default torch.float64
    device : torch.device or str, optional

    Attributes
    ----------
    k_pool, v_pool : Tensor, shape (num_blocks, Hkv, block_size, Dh)
    block_tables : dict[int, list[int]]
    lengths : dict[int, int]
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ):
        self.num_blocks = check_positive_int(num_blocks, "num_blocks")
        self.block_size = check_positive_int(block_size, "block_size")
        self.num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        self.head_dim = check_positive_int(head_dim, "head_dim")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        self.k_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.v_pool = torch.zeros(shape, dtype=dtype, device=device)
        self.block_tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self._free = list(range(num_blocks))  # a heap: the lowest free id first

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_needed(self, length: int) -> int:
        """``ceil(length / block_size)``."""
        return -(-check_non_negative_int(length, "length") // self.block_size)

    def _known(self, seq_id: object) -> int:
        seq_id = check_seq_id(seq_id)
        if seq_id not in self.block_tables:
            raise ValueError(
                f"seq_id={seq_id} is not in the cache (sequences held: {sorted(self.block_tables)})"
            )
        return seq_id

    def _slots(self, seq_id: int, start: int, end: int) -> tuple[Tensor, Tensor]:
        """Block ids and offsets of positions ``start:end``, ``(end - start,)`` each."""
        positions = torch.arange(start, end, device=self.k_pool.device)
        table = torch.tensor(self.block_tables[seq_id], dtype=torch.long, device=self.k_pool.device)
        return table[positions // self.block_size], positions % self.block_size

    def append(self, seq_id: int, k_heads: Tensor, v_heads: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``(Hkv, S_new, Dh)`` new key and value heads of one sequence after its
        cached ones; return all its heads, ``(Hkv, S, Dh)`` each. Blocks are taken only
        when needed; too few free ones raise ValueError before anything is written."""
        seq_id = check_seq_id(seq_id)
        for name, x in (("k_heads", k_heads), ("v_heads", v_heads)):
            if not isinstance(x, Tensor) or not x.is_floating_point():
                raise ValueError(f"{name} must be a floating-point Tensor, got {type(x)}")
        if k_heads.dim() != 3:
            raise ValueError(
                f"k_heads must have shape (Hkv, S_new, Dh), got {tuple(k_heads.shape)}"
            )
        want = (self.num_kv_heads, k_heads.shape[1], self.head_dim)
        for name, x in (("k_heads", k_heads), ("v_heads", v_heads)):
            if tuple(x.shape) != want:
                raise ValueError(
                    f"{name} has shape {tuple(x.shape)}, but this cache stores "
                    f"(Hkv, S_new, Dh) = {want} (k_heads {tuple(k_heads.shape)})"
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
        self.block_tables[seq_id] = table + [heapq.heappop(self._free) for _ in range(missing)]
        self.lengths[seq_id] = end
        blocks, offsets = self._slots(seq_id, start, end)  # (S_new,) each
        # Indices around a slice: the indexed result is (S_new, Hkv, Dh).
        self.k_pool[blocks, :, offsets] = k_heads.transpose(0, 1).to(self.k_pool.dtype)
        self.v_pool[blocks, :, offsets] = v_heads.transpose(0, 1).to(self.v_pool.dtype)
        return self.gather(seq_id)

    def gather(self, seq_id: int) -> tuple[Tensor, Tensor]:
        """A sequence's key and value heads in order: ``(Hkv, S, Dh)`` each (copies)."""
        seq_id = self._known(seq_id)
        blocks, offsets = self._slots(seq_id, 0, self.lengths[seq_id])
        k = self.k_pool[blocks, :, offsets]  # (S, Hkv, Dh)
        v = self.v_pool[blocks, :, offsets]
        return k.transpose(0, 1), v.transpose(0, 1)  # -> (Hkv, S, Dh)

    def free(self, seq_id: int) -> list[int]:
        """Forget a finished sequence; its blocks return to the pool. Returns their ids."""
        seq_id = self._known(seq_id)
        table = self.block_tables.pop(seq_id)
        del self.lengths[seq_id]
        for block in table:
            heapq.heappush(self._free, block)
        return table

    def slots(self, seq_id: int) -> Tensor:
        """``(S, 2)`` rows ``(block, offset)``: where each position of a sequence lives."""
        seq_id = self._known(seq_id)
        return torch.stack(self._slots(seq_id, 0, self.lengths[seq_id]), dim=1)

    def sequence(self, seq_id: int) -> PagedSequence:
        """One sequence as a :class:`mha.kv_cache_torch.KVCache` (``B = 1``), for
        :class:`mha.modules.MultiHeadAttention`'s ``cache=``."""
        return PagedSequence(self, check_seq_id(seq_id))

    def occupancy(self) -> Tensor:
        """``(num_blocks, block_size)`` long: the sequence id each slot holds a position
        of, ``-1`` where free."""
        owner = torch.full((self.num_blocks, self.block_size), EMPTY, dtype=torch.long)
        for seq_id in self.block_tables:
            blocks, offsets = self._slots(seq_id, 0, self.lengths[seq_id])
            owner[blocks.cpu(), offsets.cpu()] = seq_id
        return owner


class PagedSequence(KVCache):
    """One sequence of a :class:`PagedKVCache` as a torch :class:`KVCache` (a batch of
    one): :class:`mha.paged_cache.PagedSequence` in torch. ``k_heads``, ``v_heads``:
    the ``(1, Hkv, S, Dh)`` heads the last :meth:`append` gathered back."""

    def __init__(self, pool: PagedKVCache, seq_id: int):
        if not isinstance(pool, PagedKVCache):
            raise ValueError(f"pool must be a torch PagedKVCache, got {type(pool).__name__}")
        super().__init__()
        self.pool, self.seq_id = pool, check_seq_id(seq_id)

    @property
    def length(self) -> int:
        return self.pool.lengths.get(self.seq_id, 0)

    def append(self, k_heads: Tensor, v_heads: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``(1, Hkv, S_new, Dh)`` new heads; return all, ``(1, Hkv, S, Dh)`` each."""
        if not isinstance(k_heads, Tensor) or k_heads.dim() != 4 or k_heads.shape[0] != 1:
            raise ValueError(
                "k_heads must be a Tensor of shape (1, Hkv, S_new, Dh): a paged sequence "
                f"is a batch of one, got {getattr(k_heads, 'shape', k_heads)}"
            )
        k, v = self.pool.append(self.seq_id, k_heads[0], v_heads[0])
        self.k_heads, self.v_heads = k[None], v[None]  # (Hkv, S, Dh) -> (1, Hkv, S, Dh)
        return self.k_heads, self.v_heads


def paged_attention(
    q_heads: Tensor, cache: PagedKVCache, seq_ids: list[int]
) -> tuple[Tensor, Tensor]:
    """Causal attention of ``N`` sequences' newest queries to their paged keys and values,
    all sequences in one batched product.

    The rules of :func:`mha.paged_cache.paged_attention`: ``q_heads (N, H, T, Dh)``,
    sequence ``i``'s queries are its last ``T`` cached positions; returns ``context
    (N, H, T, Dh)`` and ``weights (N, H, T, S_max)``, zero past each sequence's length.

    The block tables are padded to the longest (with block 0, any valid id: its slots
    are masked), the blocks read into one ``(N, H, S_pad, Dh)`` tensor, and one mask
    says which key each query may see: its own sequence's, up to its own position.
    """
    if not isinstance(cache, PagedKVCache):
        raise ValueError(f"cache must be a torch PagedKVCache, got {type(cache).__name__}")
    if not isinstance(q_heads, Tensor) or q_heads.dim() != 4:
        raise ValueError(f"q_heads must be a Tensor of shape (N, H, T, Dh), got {q_heads!r:.80}")
    seq_ids = [cache._known(s) for s in seq_ids]
    n, num_heads, size, head_dim = q_heads.shape
    if len(seq_ids) != n:
        raise ValueError(
            f"seq_ids names {len(seq_ids)} sequences for q_heads {tuple(q_heads.shape)}"
        )
    if head_dim != cache.head_dim:
        raise ValueError(
            f"q_heads {tuple(q_heads.shape)} must have Dh = {cache.head_dim}, the cache's"
        )
    index = kv_head_index(num_heads, cache.num_kv_heads).to(q_heads.device)  # (H,)
    lengths = torch.tensor([cache.lengths[s] for s in seq_ids], device=q_heads.device)  # (N,)
    if int(lengths.min()) < size:
        raise ValueError(
            f"q_heads has T={size} queries, but a sequence holds only {int(lengths.min())} "
            f"positions (lengths {lengths.tolist()}): the queries are the last T cached ones"
        )
    widest = max(len(cache.block_tables[s]) for s in seq_ids)
    tables = torch.zeros(n, widest, dtype=torch.long, device=q_heads.device)  # (N, n_blocks)
    for i, seq_id in enumerate(seq_ids):
        tables[i, : len(cache.block_tables[seq_id])] = torch.tensor(cache.block_tables[seq_id])
    s_pad = widest * cache.block_size
    key_pos = torch.arange(s_pad, device=q_heads.device)  # (S_pad,)
    query_pos = lengths[:, None] - size + torch.arange(size, device=q_heads.device)  # (N, T)
    allowed = key_pos <= query_pos[:, :, None]  # (N, T, S_pad): causal, so within length
    valid = (key_pos < lengths[:, None])[:, None, :, None]  # (N, 1, S_pad, 1)

    def read(pool: Tensor) -> Tensor:
        blocks = pool[tables]  # (N, n_blocks, Hkv, block_size, Dh)
        heads = blocks.transpose(1, 2).reshape(n, cache.num_kv_heads, s_pad, head_dim)
        heads = heads.masked_fill(~valid, 0.0)  # stale slots: never let a NaN through
        return heads.index_select(1, index)  # (N, Hkv, S_pad, Dh) -> (N, H, S_pad, Dh)

    k, v = read(cache.k_pool), read(cache.v_pool)
    scores = q_heads @ k.transpose(-2, -1) / head_dim**0.5  # (N, H, T, S_pad)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # every row sees at least its own position
    context = weights @ v  # (N, H, T, S_pad) @ (N, H, S_pad, Dh) -> (N, H, T, Dh)
    return context, weights[..., : int(lengths.max())]

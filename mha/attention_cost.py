"""What attention costs in training: multiply-adds of the forward and the backward,
and the memory the backward must keep.

Plain arithmetic, like :mod:`mha.cost` (which counts what decoding with a KV cache
costs). The counts are checked against ``torch.utils.flop_counter.FlopCounterMode``
on autograd and against the tiles :func:`mha.tiled_backward.flash_attention_backward`
computes (in ``tests/test_backward.py``).

Shape names as in :mod:`mha`: T queries, S keys, Dh head width, Dv value width, H heads,
B batch.
"""

from __future__ import annotations

from mha._checks import check_non_negative_int, check_positive_int

__all__ = ["attention_backward_bytes", "attention_backward_macs", "attention_macs"]


def _score_pairs(num_queries: int, num_keys: int, tile_size: int | None, causal: bool) -> int:
    """(query, key) pairs whose score is computed: all ``T * S`` of them, except in the
    tiles that :func:`mha.flash_attention` skips under ``causal`` (those whose every pair
    is above the diagonal)."""
    num_queries = check_non_negative_int(num_queries, "num_queries")
    num_keys = check_non_negative_int(num_keys, "num_keys")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if tile_size is None or not causal:
        if tile_size is not None:
            check_positive_int(tile_size, "tile_size")
        return num_queries * num_keys
    tile_size = check_positive_int(tile_size, "tile_size")
    if num_keys < num_queries:
        raise ValueError(
            f"causal=True needs at least as many keys as queries, got "
            f"num_queries={num_queries} and num_keys={num_keys}"
        )
    pairs = 0
    for q0 in range(0, num_queries, tile_size):
        q1 = min(q0 + tile_size, num_queries)
        # The row of tiles' last query sees keys 0..q1 - 1 + S - T: the tiles starting
        # there or before are computed, each whole (the mask only sets -inf in them).
        last_key = q1 - 1 + num_keys - num_queries
        computed_keys = min(num_keys, (last_key // tile_size + 1) * tile_size)
        pairs += (q1 - q0) * computed_keys
    return pairs


def _attention_sizes(
    head_dim: int, value_dim: int | None, num_heads: int, batch_size: int
) -> tuple[int, int, int]:
    head_dim = check_positive_int(head_dim, "head_dim")
    value_dim = head_dim if value_dim is None else check_positive_int(value_dim, "value_dim")
    heads = check_positive_int(num_heads, "num_heads") * check_positive_int(
        batch_size, "batch_size"
    )
    return head_dim, value_dim, heads


def attention_macs(
    num_queries: int,
    num_keys: int,
    head_dim: int,
    *,
    value_dim: int | None = None,
    num_heads: int = 1,
    batch_size: int = 1,
    tile_size: int | None = None,
    causal: bool = False,
) -> int:
    """Multiply-adds of scaled dot-product attention's forward pass (no projections)::

        B * H * pairs * (Dh       scores  = q k^T:  (T, Dh) @ (Dh, S)
                         + Dv)    context = P v:    (T, S) @ (S, Dv)

    ``pairs = T * S`` for :func:`mha.scaled_dot_product_attention`, which computes the
    whole square even where a mask then blocks it. With ``tile_size`` and ``causal``,
    :func:`mha.flash_attention`'s count: only the pairs of the tiles it computes.

    Only matrix products are counted, as in :func:`decode_macs_with_cache`: not the
    scaling, the masking or the softmax (a few operations per pair, against ``Dh + Dv``
    multiply-adds per pair for the products).

    Parameters
    ----------
    num_queries, num_keys : int
        ``T`` and ``S`` (0 allowed).
    head_dim : int
        ``Dh``, the width of queries and keys.
    value_dim : int, optional
        ``Dv`` (default ``Dh``).
    num_heads, batch_size : int
        ``H`` query heads (grouped-query heads still compute ``H`` score matrices) and
        ``B``.
    tile_size : int, optional
        The tiled form's tile size; it changes the count only under ``causal``.
    causal : bool
        With ``tile_size``: skip the tiles above the diagonal (needs ``S >= T``).

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If an argument is not a positive integer (``T``, ``S``: non-negative), or
        ``causal`` is set with ``S < T`` and a ``tile_size``.
    """
    pairs = _score_pairs(num_queries, num_keys, tile_size, causal)
    head_dim, value_dim, heads = _attention_sizes(head_dim, value_dim, num_heads, batch_size)
    return heads * pairs * (head_dim + value_dim)


def attention_backward_macs(
    num_queries: int,
    num_keys: int,
    head_dim: int,
    *,
    value_dim: int | None = None,
    num_heads: int = 1,
    batch_size: int = 1,
    tile_size: int | None = None,
    causal: bool = False,
) -> int:
    """Multiply-adds of attention's backward pass (:mod:`mha.backward`), arguments as in
    :func:`attention_macs`::

        B * H * pairs * (Dv       dV = P^T dO:   (S, T) @ (T, Dv)
                         + Dv     dP = dO V^T:   (T, Dv) @ (Dv, S)
                         + Dh     dQ = dZ K:     (T, S) @ (S, Dh)
                         + Dh     dK = dZ^T Q:   (S, T) @ (T, Dh)
                         + Dh)    only tiled: the scores q k^T, recomputed

    Twice the forward's products for :func:`mha.backward.attention_backward`, which
    reads the weights the forward saved; ``2.5`` times for ``Dv = Dh`` for
    :func:`mha.backward.flash_attention_backward` (``tile_size`` given), which rebuilds
    each tile of weights from the log-sum-exp instead of storing them. The softmax's
    backward ``dZ = P * (dP - D)`` and ``D = rowsum(dO * O)`` are elementwise (about
    ``3 T S`` and ``T Dv`` operations) and, as everywhere in this module, not counted.

    Returns
    -------
    int
    """
    pairs = _score_pairs(num_queries, num_keys, tile_size, causal)
    head_dim, value_dim, heads = _attention_sizes(head_dim, value_dim, num_heads, batch_size)
    recomputed = 0 if tile_size is None else head_dim
    return heads * pairs * (2 * value_dim + 2 * head_dim + recomputed)


def attention_backward_bytes(
    num_queries: int,
    num_keys: int,
    *,
    num_heads: int = 1,
    batch_size: int = 1,
    bytes_per_value: int = 2,
    tiled: bool = False,
) -> int:
    """Bytes the backward of attention needs besides the tensors both forms keep: ``q``,
    ``k``, ``v``, the context (the output projection's backward keeps it anyway) and its
    gradient.

    * plain (:func:`mha.backward.attention_backward`): the weights, ``T * S`` per head,
      saved by the forward (or recomputed whole); ``B * H * T * S`` values.
    * tiled (:func:`mha.backward.flash_attention_backward`): one log-sum-exp per query,
      saved by the forward, and ``D = rowsum(dO * O)``, one per query, made by the
      backward; ``2 * B * H * T`` values. The ``(tile_size, tile_size)`` tiles it works
      on do not grow with the lengths and are left out.

    Parameters
    ----------
    num_queries, num_keys : int
        ``T`` and ``S`` (0 allowed).
    num_heads, batch_size : int
        ``H`` and ``B``.
    bytes_per_value : int
        2 for float16 / bfloat16 (the default), 4 for float32, 8 for float64 (kernels
        often keep the log-sum-exp in float32 whatever the weights are).
    tiled : bool
        The tiled form's count instead of the plain one's.

    Returns
    -------
    int
    """
    num_queries = check_non_negative_int(num_queries, "num_queries")
    num_keys = check_non_negative_int(num_keys, "num_keys")
    heads = check_positive_int(num_heads, "num_heads") * check_positive_int(
        batch_size, "batch_size"
    )
    bytes_per_value = check_positive_int(bytes_per_value, "bytes_per_value")
    if not isinstance(tiled, bool):
        raise ValueError(f"tiled must be True or False, got {tiled!r}")
    per_head = 2 * num_queries if tiled else num_queries * num_keys
    return heads * per_head * bytes_per_value

"""How much arithmetic the benchmarks count: FLOP formulas, and torch's count of what ran.

FLOPs of one forward (multiply + add = 2 FLOPs), from :func:`attention_flops`: ``Q K^T``
and ``weights V`` cost ``2 B H T S Dh`` each, and the four projections cost ``2 B T D^2``
(query, output) and ``2 B S D^2`` (key, value). Every attention row computes all six
products; softmax, scaling, masking and bias adds are not counted, so the rates err low.

:func:`counted_macs` counts what code really executes instead, with PyTorch's own
``FlopCounterMode``: the decoding table prints its counts, and the tests check the
formulas here and those of :mod:`mha.cost` against it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

R = TypeVar("R")


def gemm_flops(m: int, k: int, n: int) -> int:
    """FLOPs of one ``(m, k) @ (k, n)`` product: ``m n`` dot products of length ``k``."""
    return 2 * m * k * n


def attention_flops(
    batch: int,
    heads: int,
    target_len: int,
    source_len: int,
    head_dim: int,
    *,
    projections: bool = True,
) -> int:
    """FLOPs of one multi-head attention forward, counting matrix products only.

    Parameters
    ----------
    batch, heads, target_len, source_len, head_dim : int
        B, H, T, S and Dh; the model width is ``D = H Dh``.
    projections : bool
        Also count the four ``(., D) @ (D, D)`` projections (W_q W_k W_v W_o).

    Returns
    -------
    int
        ``2 B H T S Dh`` (Q K^T) + ``2 B H T S Dh`` (weights V), plus, with projections,
        ``2 B T D^2`` (W_q) + ``2 B S D^2`` (W_k) + ``2 B S D^2`` (W_v) + ``2 B T D^2`` (W_o).
    """
    B, H, T, S, Dh = batch, heads, target_len, source_len, head_dim
    scores = B * H * gemm_flops(T, Dh, S)  # (T, Dh) @ (Dh, S) per batch and head
    context = B * H * gemm_flops(T, S, Dh)  # (T, S) @ (S, Dh) per batch and head
    total = scores + context
    if projections:
        D = H * Dh
        total += gemm_flops(B * T, D, D) * 2  # W_q on the queries, W_o on the context
        total += gemm_flops(B * S, D, D) * 2  # W_k and W_v on the keys / values
    return total


def counted_macs(run: Callable[[], R]) -> tuple[int, R]:
    """Multiply-adds of the matrix products ``run()`` executes, as torch counts them, and
    what ``run()`` returned.

    SDPA runs in its math form, whose matmuls the counter sees (it does not see inside
    the fused CPU kernel); the arithmetic is the same. No autograd graph is recorded.

    Raises
    ------
    ValueError
        If torch counted an odd number of FLOPs: then not all of them are multiply-adds
        (2 FLOPs each), and halving the count would hide it.
    """
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = run()
    flops = counter.get_total_flops()
    if flops % 2:
        raise ValueError(
            f"run() made torch count {flops} FLOPs, an odd number: not all are "
            "multiply-adds (2 FLOPs each)"
        )
    return flops // 2, out  # FLOPs = 2 x multiply-adds

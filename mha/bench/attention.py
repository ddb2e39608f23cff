"""The attention rows: every implementation's self-attention forward, on the same input.

Every implementation runs the same self-attention forward (float32, no autograd) on the
same weights and input, side by side in one run, so the ratios are comparable even
though absolute times depend on the machine. Each row is warmed up, then timed
``--repeats`` times; the table shows the median.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from mha.attention import multi_head_attention
from mha.bench.config import (
    BASELINE,
    MATMUL,
    NUMPY,
    OURS_FAST,
    OURS_WEIGHTS,
    PER_HEAD,
    SDPA_REF,
    TARGETS,
    TORCH_FAST,
    TORCH_WEIGHTS,
    Config,
)
from mha.bench.timing import time_pair, time_rows
from mha.convert import module_to_torch, params_from_module
from mha.modules import MultiHeadAttention


def sdpa_reference(module: MultiHeadAttention, x: Tensor) -> Tensor:
    """The least code that computes the same thing: three projections, SDPA, W_o.

    Three ``F.linear`` calls rather than one on a fused (3D, D) weight: on the 2-core CPU
    this was written on, the fused version (matmul, then split) measured slower.
    """
    B, T, D = x.shape
    H, Dh = module.num_heads, module.head_dim
    q = F.linear(x, module.W_q.weight, module.W_q.bias)  # (B, T, D)
    k = F.linear(x, module.W_k.weight, module.W_k.bias)  # (B, T, D)
    v = F.linear(x, module.W_v.weight, module.W_v.bias)  # (B, T, D)
    q = q.view(B, T, H, Dh).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)
    k = k.view(B, T, H, Dh).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)
    v = v.view(B, T, H, Dh).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)
    context = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, Dh)
    merged = context.transpose(1, 2).reshape(B, T, D)  # (B, H, T, Dh) -> (B, T, D)
    return F.linear(merged, module.W_o.weight, module.W_o.bias)  # (B, T, D)


def per_head_loop(module: MultiHeadAttention, x: Tensor) -> Tensor:
    """One single-head attention per head on sliced weights, then concatenate: the
    'H separate attentions' picture, without batching the heads."""
    Dh = module.head_dim
    contexts = []
    for h in range(module.num_heads):
        rows = slice(h * Dh, (h + 1) * Dh)
        q = F.linear(x, module.W_q.weight[rows], module.W_q.bias[rows])  # (B, T, Dh)
        k = F.linear(x, module.W_k.weight[rows], module.W_k.bias[rows])  # (B, T, Dh)
        v = F.linear(x, module.W_v.weight[rows], module.W_v.bias[rows])  # (B, T, Dh)
        scores = (q * Dh**-0.5) @ k.transpose(1, 2)  # (B, T, Dh) @ (B, Dh, T) -> (B, T, T)
        contexts.append(torch.softmax(scores, dim=-1) @ v)  # (B, T, T) @ (B, T, Dh)
    merged = torch.cat(contexts, dim=-1)  # H x (B, T, Dh) -> (B, T, D)
    return module.W_o(merged)


def bench_rows(config: Config) -> dict[str, Callable[[], object]]:
    """Every row's forward on the same seeded weights and input."""
    torch.manual_seed(0)
    module = MultiHeadAttention(config.d_model, config.heads).eval()
    reference = module_to_torch(module).eval()
    x = torch.randn(config.batch, config.length, config.d_model)
    params = params_from_module(module)  # float32 NumPy copies of the same weights
    x_np = x.numpy()
    wide = torch.randn(config.d_model, 4 * config.d_model)  # the 4 projections side by side
    flat = x.view(-1, config.d_model)  # (B, T, D) -> (B T, D)
    return {
        OURS_WEIGHTS: lambda: module(x, x, x),
        OURS_FAST: lambda: module(x, x, x, need_weights=False),
        # average_attn_weights=False: per-head (B, H, T, S) weights, the same output as ours
        TORCH_WEIGHTS: lambda: reference(x, x, x, average_attn_weights=False),
        TORCH_FAST: lambda: reference(x, x, x, need_weights=False),
        SDPA_REF: lambda: sdpa_reference(module, x),
        PER_HEAD: lambda: per_head_loop(module, x),
        NUMPY: lambda: multi_head_attention(x_np, x_np, x_np, params, config.heads),
        MATMUL: lambda: flat @ wide,  # (B T, D) @ (D, 4D) -> (B T, 4D)
    }


def measure(config: Config) -> dict[str, list[float]]:
    """Seconds of every timed forward of every row, measured in this one run."""
    rows = bench_rows(config)
    with torch.no_grad():
        return time_rows(rows, config.repeats, config.warmup)


def measure_targets(config: Config) -> dict[str, list[float]]:
    """For each target row, its time over its baseline's, one ratio per pair of calls.

    The two rows of a target run alone, taking turns, ``3 * repeats`` pairs: in the
    round robin of :func:`measure` the other rows' large tensors come and go between
    them, and each call's time then varies by a third, far more than the few percent a
    target is about.
    """
    rows = bench_rows(config)
    with torch.no_grad():
        return {
            label: time_pair(rows[label], rows[BASELINE[label]], 3 * config.repeats,
                             config.warmup)  # fmt: skip
            for label, _ in TARGETS
        }

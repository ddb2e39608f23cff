"""Speed of multi-head attention on this machine: ``python -m mha.bench``.

Every implementation runs the same self-attention forward (float32, no autograd) on the
same weights and input, side by side in one run, so the ratios are comparable even
though absolute times depend on the machine. Each row is warmed up, then timed
``--repeats`` times; the table shows the median.

FLOPs of one forward (multiply + add = 2 FLOPs), self-attention, S = T:
four projections ``4 * 2 B T D^2`` plus two attention matmuls (``Q K^T`` and
``weights V``) ``2 * 2 B H T S Dh = 4 B T S D``. Softmax, masking and bias adds are
not counted. GFLOP/s is compared with a plain ``(B T, D) @ (D, 4D)`` matmul timed in the
same run (the four projections' FLOPs as one matmul): roughly the best rate this CPU
reaches on work of this shape, so "% matmul" says how much of it each version achieves.

This is a benchmark, not a test: it prints, it never fails on a slow machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mha.functional import multi_head_attention
from mha.modules import MultiHeadAttention

OURS_WEIGHTS = "mha MultiHeadAttention, weights"
OURS_FAST = "mha MultiHeadAttention, fast path"
TORCH_WEIGHTS = "nn.MultiheadAttention, weights"
TORCH_FAST = "nn.MultiheadAttention, no weights"
SDPA_REF = "projections + F.sdpa (reference)"
PER_HEAD = "per-head loop"
NUMPY = "NumPy multi_head_attention"
MATMUL = "plain matmul (B*T, D) @ (D, 4D)"

# Row label -> the row it is compared with (the one that does the same work).
BASELINE = {
    OURS_WEIGHTS: TORCH_WEIGHTS,
    TORCH_WEIGHTS: TORCH_WEIGHTS,
    PER_HEAD: TORCH_WEIGHTS,
    NUMPY: TORCH_WEIGHTS,
    OURS_FAST: SDPA_REF,
    TORCH_FAST: SDPA_REF,
    SDPA_REF: SDPA_REF,
}
ROW_LABELS = (OURS_WEIGHTS, OURS_FAST, TORCH_WEIGHTS, TORCH_FAST, SDPA_REF, PER_HEAD, NUMPY)
TARGETS = ((OURS_WEIGHTS, 1.25), (OURS_FAST, 1.05))


@dataclass(frozen=True)
class Config:
    batch: int
    length: int
    d_model: int
    heads: int
    repeats: int
    warmup: int
    threads: int | None = None

    @property
    def attention_flops(self) -> float:
        B, T, D = self.batch, self.length, self.d_model
        projections = 4 * 2 * B * T * D * D  # Q, K, V and output: (B T, D) @ (D, D) each
        attention = 2 * 2 * B * T * T * D  # Q K^T and weights V, summed over heads
        return float(projections + attention)

    @property
    def matmul_flops(self) -> float:
        return float(2 * self.batch * self.length * self.d_model * 4 * self.d_model)


def time_rows(rows: dict[str, Callable[[], object]], repeats: int, warmup: int) -> dict[str, float]:
    """Median wall time in seconds of each row's call.

    The rows take turns (round robin) rather than running one after another: on a
    shared machine, a burst of load then slows every row a little instead of one row a
    lot, which is what keeps the ratios meaningful.
    """
    for _ in range(warmup):
        for fn in rows.values():
            fn()
    times: dict[str, list[float]] = {label: [] for label in rows}
    for _ in range(repeats):
        for label, fn in rows.items():
            start = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) for label, t in times.items()}


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


def measure(config: Config) -> dict[str, float]:
    """Seconds per forward for every row, measured in this one run."""
    torch.manual_seed(0)
    module = MultiHeadAttention(config.d_model, config.heads).eval()
    reference = module.to_torch().eval()
    x = torch.randn(config.batch, config.length, config.d_model)
    params = module.to_params()  # float32 NumPy copies of the same weights
    x_np = x.numpy()
    wide = torch.randn(config.d_model, 4 * config.d_model)  # the 4 projections side by side
    flat = x.view(-1, config.d_model)  # (B, T, D) -> (B T, D)

    rows: dict[str, Callable[[], object]] = {
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
    with torch.no_grad():
        return time_rows(rows, config.repeats, config.warmup)


def format_table(config: Config, seconds: dict[str, float]) -> str:
    matmul_rate = config.matmul_flops / seconds[MATMUL] / 1e9
    lines = [
        f"multi-head attention forward: B={config.batch}, T=S={config.length}, "
        f"D={config.d_model}, H={config.heads}, float32, torch.no_grad, "
        f"{torch.get_num_threads()} torch threads, median of "
        f"{config.repeats} (after {config.warmup} warm-up)",
        f"FLOPs per forward: {config.attention_flops / 1e9:.2f} G "
        "(4 projections + Q K^T + weights V)",
        "",
        f"{'implementation':<36} {'ms':>9} {'ratio':>6}  {'baseline':<32} {'GFLOP/s':>8} "
        f"{'% matmul':>8}",
    ]
    for label in ROW_LABELS:
        baseline = BASELINE[label]
        rate = config.attention_flops / seconds[label] / 1e9
        lines.append(
            f"{label:<36} {seconds[label] * 1e3:>9.2f} {seconds[label] / seconds[baseline]:>6.2f}  "
            f"{baseline:<32} {rate:>8.1f} {100 * rate / matmul_rate:>7.0f}%"
        )
    lines.append(
        f"{MATMUL:<36} {seconds[MATMUL] * 1e3:>9.2f} {'':>6}  {'':<32} {matmul_rate:>8.1f} "
        f"{100:>7.0f}%"
    )
    lines.append("")
    for label, limit in TARGETS:
        ratio = seconds[label] / seconds[BASELINE[label]]
        verdict = "met" if ratio <= limit else "NOT met"
        lines.append(f"target: {label} <= {limit:.2f} x {BASELINE[label]}: {ratio:.2f} ({verdict})")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m mha.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8, help="B (default 8)")
    parser.add_argument("--length", type=int, default=512, help="T = S (default 512)")
    parser.add_argument("--d-model", type=int, default=768, help="D (default 768)")
    parser.add_argument("--heads", type=int, default=12, help="H (default 12)")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per row")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per row first")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's choice)"
    )
    parser.add_argument("--quick", action="store_true", help="B=2, T=128, D=256, H=4")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.length, args.d_model, args.heads = 2, 128, 256, 4
    for name in ("batch", "length", "d_model", "heads", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.d_model % args.heads:
        parser.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}")
    return Config(
        args.batch,
        args.length,
        args.d_model,
        args.heads,
        args.repeats,
        args.warmup,
        args.threads,
    )


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_args(argv)
    previous = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        print(format_table(config, measure(config)))
    finally:
        torch.set_num_threads(previous)


if __name__ == "__main__":
    main()

"""What one run of ``python -m mha.bench`` measures: the rows, the sizes and their defaults.

The attention table's rows are named here, each with the row it is compared with; the
other defaults are those of the command line's options (:func:`mha.bench.cli.parse_args`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mha.bench.flops import attention_flops, gemm_flops

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
TARGETS = ((OURS_WEIGHTS, 1.25), (OURS_FAST, 1.02))
CEILING_SIZES = (2048, 4096)
CEILING_REPEATS = 3
SDPA_LENGTHS = (256, 512, 1024, 2048)  # T = S of the SDPA kernel vs formula table

# Greedy decoding, with and without the KV cache (the model: mha.bench.decode).
DECODE_TOKENS = (16, 64, 256)
DECODE_BATCH = 16
DECODE_REPEATS = 3


@dataclass(frozen=True)
class Config:
    """The sizes, repeats and threads of one run, and the FLOPs each attention row does."""

    batch: int
    length: int
    d_model: int
    heads: int
    repeats: int
    warmup: int
    threads: int | None = None
    ceiling_sizes: tuple[int, ...] = CEILING_SIZES
    ceiling_repeats: int = CEILING_REPEATS
    sdpa_lengths: tuple[int, ...] = SDPA_LENGTHS
    decode_tokens: tuple[int, ...] = DECODE_TOKENS
    decode_batch: int = DECODE_BATCH
    decode_repeats: int = DECODE_REPEATS

    @property
    def attention_flops(self) -> float:
        """Self-attention (S = T) with its four projections, as every attention row runs."""
        B, T, H = self.batch, self.length, self.heads
        return float(attention_flops(B, H, T, T, self.d_model // H))

    @property
    def matmul_flops(self) -> float:
        return float(gemm_flops(self.batch * self.length, self.d_model, 4 * self.d_model))

    def row_flops(self, label: str) -> float:
        return self.matmul_flops if label == MATMUL else self.attention_flops

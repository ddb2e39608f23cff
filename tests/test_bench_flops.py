"""mha.bench.flops: the FLOP formulas by hand and against torch's own counter, and the
multiply-add counter itself."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mha import bench


def test_attention_flops_by_hand() -> None:
    # B=2, H=3, T=4, S=5, Dh=6, so D=18.
    # Q K^T: 2*2*3*4*5*6 = 1440; weights V: the same.
    assert bench.attention_flops(2, 3, 4, 5, 6, projections=False) == 2880
    # W_q, W_o: 2*(2*4)*18*18 = 5184 each; W_k, W_v: 2*(2*5)*18*18 = 6480 each.
    assert bench.attention_flops(2, 3, 4, 5, 6) == 2880 + 2 * 5184 + 2 * 6480
    # One of everything: two 1-term dot products and four 1x1 projections, 2 FLOPs each.
    assert bench.attention_flops(1, 1, 1, 1, 1) == 12
    assert bench.gemm_flops(2, 3, 4) == 48  # 2*4 dot products of length 3


def test_config_counts_self_attention_with_projections() -> None:
    config = bench.Config(batch=2, length=4, d_model=18, heads=3, repeats=1, warmup=0)
    # 2 * 2 B T T D (attention) + 4 * 2 B T D^2 (projections) = 2304 + 20736
    assert config.attention_flops == 23040
    assert config.matmul_flops == 2 * 8 * 18 * 72
    assert config.row_flops(bench.MATMUL) == config.matmul_flops
    assert config.row_flops(bench.PER_HEAD) == config.attention_flops


@pytest.mark.parametrize(
    "label", [bench.OURS_WEIGHTS, bench.TORCH_WEIGHTS, bench.SDPA_REF, bench.PER_HEAD, bench.MATMUL]
)
def test_flop_count_matches_torch_flop_counter(label, one_torch_thread) -> None:
    """Oracle: PyTorch's own counter over the row's real forward (SDPA in its math form,
    since the counter does not see inside the fused CPU kernel)."""
    config = bench.Config(batch=2, length=4, d_model=18, heads=3, repeats=1, warmup=0)
    forward = bench.bench_rows(config)[label]
    macs, _ = bench.counted_macs(forward)  # torch's count: 2 FLOPs per multiply-add
    assert 2 * macs == config.row_flops(label)


def test_counted_macs_counts_a_known_product_and_returns_its_result() -> None:
    a, b = torch.ones(2, 3), torch.ones(3, 4)
    macs, product = bench.counted_macs(lambda: a @ b)  # (2, 3) @ (3, 4) -> (2, 4)
    assert macs == 2 * 4 * 3  # 8 dot products of length 3
    assert torch.equal(product, torch.full((2, 4), 3.0))  # exact: sums of three ones


def test_counted_macs_refuses_an_odd_flop_count(monkeypatch) -> None:
    # Halving an odd count would hide a counted FLOP that is not half of a multiply-add.
    monkeypatch.setattr(FlopCounterMode, "get_total_flops", lambda self: 7)
    with pytest.raises(ValueError, match="7 FLOPs, an odd number"):
        bench.counted_macs(lambda: None)

"""mha.cost's cache arithmetic for multi-head, grouped-query and latent attention: the
published configurations' numbers checked by hand, and the per-token count checked
against what mha.mla's cache really holds."""

from __future__ import annotations

import numpy as np
import pytest

from mha.cost import (
    CACHE_TABLE_MODELS,
    DEEPSEEK_V2,
    DEEPSEEK_V3,
    LLAMA_2_7B,
    LLAMA_3_70B,
    PublishedMLAModel,
    cache_bytes_per_token,
    cached_values_per_token,
    kv_cache_bytes,
    kv_values_per_token,
    mla_values_per_token,
    sequence_cache_bytes,
)
from mha.mla import MLACache, mla_steps
from mha.mla_params import MLAParams

GiB, MiB, KiB = 2**30, 2**20, 2**10


def test_values_per_token_per_layer():
    assert cached_values_per_token(LLAMA_2_7B) == 2 * 32 * 128 == 8192  # K and V, 32 heads
    assert cached_values_per_token(LLAMA_3_70B) == 2 * 8 * 128 == 2048  # 8 KV heads
    # DeepSeek: the 512-wide latent and the 64-wide shared RoPE key, whatever the heads.
    assert cached_values_per_token(DEEPSEEK_V2) == cached_values_per_token(DEEPSEEK_V3) == 576
    assert kv_values_per_token(8, 128) == 2048 and mla_values_per_token(512, 64) == 576
    # The V2 paper's comparison: 576 = (9/2) d_h for d_h = 128, as GQA with 2.25 groups.
    assert 576 == 4.5 * 128 == kv_values_per_token(1, 128) * 2.25
    # Caching the rebuilt per-head keys (192 wide) and values (128) instead: 40960.
    assert DEEPSEEK_V3.expanded_values_per_token == 128 * (128 + 64 + 128) == 40960


def test_bytes_per_token_and_per_sequence_in_bfloat16():
    assert [cache_bytes_per_token(m) for m in CACHE_TABLE_MODELS] == [16 * KiB, 4 * KiB,
                                                                      1152, 1152]  # fmt: skip
    assert cache_bytes_per_token(DEEPSEEK_V3, bytes_per_value=1) == 576  # an 8-bit cache
    n = 32 * 1024
    # Llama 2 7B: 2 * 32 heads * 128 * 32 layers * 2^15 tokens * 2 bytes = 2^34 = 16 GiB.
    assert sequence_cache_bytes(LLAMA_2_7B, n) == 16 * GiB
    assert sequence_cache_bytes(LLAMA_3_70B, n) == 10 * GiB  # 80 layers * 4 KiB * 2^15
    # DeepSeek: 1152 bytes * 2^15 tokens = 36 MiB a layer; 60 and 61 layers.
    assert sequence_cache_bytes(DEEPSEEK_V2, n) == 60 * 36 * MiB == 2160 * MiB
    assert sequence_cache_bytes(DEEPSEEK_V3, n) == 61 * 36 * MiB
    assert sequence_cache_bytes(DEEPSEEK_V3, n, batch_size=3, bytes_per_value=4) == (
        6 * sequence_cache_bytes(DEEPSEEK_V3, n))  # fmt: skip
    # The existing formula for the KV models, window and all.
    for model in (LLAMA_2_7B, LLAMA_3_70B):
        assert sequence_cache_bytes(model, 1000, bytes_per_value=1) == model.kv_cache_bytes(
            1000, bytes_per_value=1)  # fmt: skip
    assert sequence_cache_bytes(DEEPSEEK_V2, 0) == 0


def test_published_configurations():
    assert (DEEPSEEK_V2.num_layers, DEEPSEEK_V2.d_model, DEEPSEEK_V2.num_heads) == (60, 5120, 128)
    assert (DEEPSEEK_V3.num_layers, DEEPSEEK_V3.d_model, DEEPSEEK_V3.num_heads) == (61, 7168, 128)
    for model in (DEEPSEEK_V2, DEEPSEEK_V3):
        assert (model.q_lora_rank, model.kv_lora_rank, model.qk_nope_head_dim,
                model.qk_rope_head_dim, model.v_head_dim) == (1536, 512, 128, 64, 128)
        assert "arXiv" in model.source
    assert (LLAMA_2_7B.num_layers, LLAMA_2_7B.num_kv_heads, LLAMA_2_7B.head_dim) == (32, 32, 128)
    assert (LLAMA_3_70B.num_layers, LLAMA_3_70B.num_kv_heads, LLAMA_3_70B.head_dim) == (80, 8, 128)
    assert kv_cache_bytes(80, 8, 128, 1) == sequence_cache_bytes(LLAMA_3_70B, 1)


def test_the_count_is_what_the_latent_cache_holds():
    """A tiny MLA layer's cache after n tokens holds exactly n * (Rkv + Dr) numbers."""
    tiny = PublishedMLAModel("tiny", num_layers=1, d_model=10, num_heads=3, q_lora_rank=None,
                             kv_lora_rank=5, qk_nope_head_dim=4, qk_rope_head_dim=6,
                             v_head_dim=3, source="this test")  # fmt: skip
    params = MLAParams.init(10, 3, kv_lora_rank=5, qk_nope_head_dim=4, qk_rope_head_dim=6,
                            v_head_dim=3, dtype=np.float32)  # fmt: skip
    cache = MLACache()
    mla_steps(np.zeros((1, 7, 10), np.float32), params, cache=cache)
    held = cache.latent.nbytes + cache.k_rope.nbytes
    assert held == sequence_cache_bytes(tiny, 7, bytes_per_value=4) == 7 * 11 * 4


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: cached_values_per_token("DeepSeek-V3"), "model must be"),
        (lambda: cache_bytes_per_token(DEEPSEEK_V3, bytes_per_value=0), "bytes_per_value"),
        (lambda: sequence_cache_bytes(DEEPSEEK_V3, -1), "num_tokens"),
        (lambda: sequence_cache_bytes(DEEPSEEK_V3, 1, batch_size=0), "batch_size"),
        (lambda: kv_values_per_token(0, 128), "num_kv_heads"),
        (lambda: mla_values_per_token(512, 0.5), "qk_rope_head_dim"),
        (lambda: PublishedMLAModel("x", 1, 8, 2, 0, 4, 2, 2, 2, "s"), "q_lora_rank"),
        (lambda: PublishedMLAModel("x", 1, 8, 2, None, 4, 2, 2, -2, "s"), "v_head_dim"),
    ],
)
def test_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()

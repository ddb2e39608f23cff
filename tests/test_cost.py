"""mha.cost: KV-cache bytes checked by hand, the published shapes checked for consistency,
and the multiply-add formulas checked against PyTorch's own FLOP counter
(``mha.bench.counted_macs``) running our torch module with and without a cache."""

from __future__ import annotations

import pytest
import torch

import mha
from mha.bench import counted_macs
from mha.cost import (
    PUBLISHED_MODELS,
    PublishedModel,
    decode_macs_with_cache,
    decode_macs_without_cache,
    kv_cache_bytes,
)
from mha.kv_cache_torch import KVCache
from mha.modules import MultiHeadAttention

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GiB = 2**30
MODELS = {model.name: model for model in PUBLISHED_MODELS}

# ------------------------------------------------------------------------- memory


def test_llama_2_7b_at_4096_tokens_in_fp16_is_two_gib():
    # 2 (K and V) * 32 layers * 32 heads * 128 dims * 4096 positions * 2 bytes
    # = 2^1 * 2^5 * 2^5 * 2^7 * 2^12 * 2^1 = 2^31
    assert kv_cache_bytes(32, 32, 128, 4096) == 2**31 == 2 * GiB
    assert MODELS["Llama 2 7B"].kv_cache_bytes(4096) == 2 * GiB


def test_gpt_3_at_its_2048_tokens_is_nine_gib():
    # 2 * 96 * 96 * 128 * 2048 * 2: 96 * 96 = 9 * 2^10, the rest 2^1 * 2^7 * 2^11 * 2^1
    assert MODELS["GPT-3 175B"].kv_cache_bytes(2048) == 9 * GiB


def test_grouped_query_attention_divides_the_cache_by_the_group_size():
    llama_70b = MODELS["Llama 2 70B"]
    as_multi_head = kv_cache_bytes(80, 64, 128, 4096)
    assert llama_70b.group_size == 8
    assert as_multi_head == 8 * llama_70b.kv_cache_bytes(4096) == 10 * GiB
    # Llama 3 8B: the same width and depth as Llama 2 7B, a quarter of the cache.
    assert MODELS["Llama 3 8B"].kv_cache_bytes(4096) * 4 == MODELS["Llama 2 7B"].kv_cache_bytes(
        4096
    )


def test_a_sliding_window_caps_the_cache():
    mistral = MODELS["Mistral 7B"]
    full = kv_cache_bytes(32, 8, 128, 4096)  # 2 * 32 * 8 * 128 * 4096 * 2 = 2^29
    assert full == GiB // 2
    for length in (4096, 8192, 32768, 10**6):
        assert mistral.kv_cache_bytes(length) == full
    assert mistral.kv_cache_bytes(1024) == full // 4  # below the window: grows with length
    assert kv_cache_bytes(32, 8, 128, 32768) == 8 * full  # the same model with no window


def test_cache_bytes_scale_with_batch_and_bytes_per_value():
    one = kv_cache_bytes(2, 3, 4, 5, bytes_per_value=1)
    assert one == 2 * 2 * 3 * 4 * 5
    assert kv_cache_bytes(2, 3, 4, 5, batch_size=7, bytes_per_value=4) == 28 * one
    assert kv_cache_bytes(2, 3, 4, 0) == 0  # nothing decoded yet


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_layers": 0}, "num_layers"),
        ({"num_kv_heads": 2.0}, "num_kv_heads"),
        ({"head_dim": True}, "head_dim"),
        ({"context_length": -1}, "context_length"),
        ({"batch_size": 0}, "batch_size"),
        ({"bytes_per_value": 0.5}, "bytes_per_value"),
        ({"window": 0}, "window"),
    ],
)
def test_cache_bytes_refuse_bad_arguments(kwargs, name):
    args = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 4, "context_length": 8} | kwargs
    with pytest.raises(ValueError, match=name):
        kv_cache_bytes(**args)


# ------------------------------------------------------------------ published models


@pytest.mark.parametrize("model", PUBLISHED_MODELS, ids=lambda m: m.name)
def test_published_model_is_self_consistent(model):
    # Every model listed splits its width evenly into heads (not true of every model
    # ever published, which is why head_dim is a field of its own).
    assert model.d_model == model.num_heads * model.head_dim
    assert model.num_heads % model.num_kv_heads == 0
    assert model.group_size * model.num_kv_heads == model.num_heads
    assert model.window is None or model.window > 0
    assert len(model.source) > 20  # a citation, not a placeholder


def test_published_models_are_distinct_and_exported():
    assert len(MODELS) == len(PUBLISHED_MODELS)
    assert mha.PUBLISHED_MODELS is PUBLISHED_MODELS
    assert mha.kv_cache_bytes is kv_cache_bytes


def test_published_model_refuses_kv_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="num_kv_heads=3 must divide num_heads=8"):
        PublishedModel("bad", 2, 64, 8, 3, 8, None, "made up for this test")
    with pytest.raises(ValueError, match="window"):
        PublishedModel("bad", 2, 64, 8, 2, 8, 0, "made up for this test")


# -------------------------------------------------------------------- multiply-adds


def test_macs_by_hand():
    # D=4, H=2 (Dh=2), Hkv=1 (Dkv=2), two earlier positions: S=3 keys.
    w_q = w_o = 1 * 4 * 4  # one position, (1, 4) @ (4, 4)
    w_k = w_v = 1 * 4 * 2  # one position, (1, 4) @ (4, 2)
    scores = values = 2 * 1 * 3 * 2  # per head (1, 2) @ (2, 3) and (1, 3) @ (3, 2)
    with_cache = w_q + w_k + w_v + scores + values + w_o
    assert decode_macs_with_cache(4, 2, 2, num_kv_heads=1) == with_cache == 72
    # No cache: all 3 positions projected, the full (3, 3) square of scores.
    w_q = w_o = 3 * 4 * 4
    w_k = w_v = 3 * 4 * 2
    scores = values = 2 * 3 * 3 * 2
    assert decode_macs_without_cache(4, 2, 2, num_kv_heads=1) == (
        w_q + w_k + w_v + scores + values + w_o
    )
    assert decode_macs_with_cache(4, 2, 2, num_kv_heads=1, batch_size=5) == 5 * 72


@pytest.mark.parametrize("num_kv_heads", [None, 4, 2, 1])
@pytest.mark.parametrize("position", [0, 1, 7, 30])
def test_recomputing_costs_exactly_t_times_the_cached_step(num_kv_heads, position):
    with_cache = decode_macs_with_cache(64, 4, position, num_kv_heads=num_kv_heads)
    without = decode_macs_without_cache(64, 4, position, num_kv_heads=num_kv_heads)
    assert without == (position + 1) * with_cache


def test_fewer_kv_heads_save_projection_work_only():
    mha_macs = decode_macs_with_cache(64, 8, 10)
    mqa_macs = decode_macs_with_cache(64, 8, 10, num_kv_heads=1)
    # W_k and W_v shrink from (64, 64) to (64, 8); attention reads the shared head 8 times.
    assert mha_macs - mqa_macs == 2 * 64 * (64 - 8)


def module_and_input(num_kv_heads, batch, length, d_model=16, num_heads=4):
    torch.manual_seed(0)
    module = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads).double().eval()
    x = torch.randn(batch, length, d_model, dtype=torch.float64)
    return module, x


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("position", [0, 1, 5, 12])
@pytest.mark.parametrize("batch", [1, 3])
def test_cached_step_matches_the_flop_counter(need_weights, num_kv_heads, position, batch):
    module, x = module_and_input(num_kv_heads, batch, position + 1)
    cache = KVCache()
    if position:  # the earlier positions, cached before counting starts
        earlier = x[:, :position]
        module(earlier, earlier, earlier, mask=torch.from_numpy(mha.causal_mask(position)),
               cache=cache)  # fmt: skip
    new = x[:, position:]  # (B, 1, D)
    mask = torch.from_numpy(mha.causal_mask(1, num_keys=position + 1))
    counted, _ = counted_macs(
        lambda: module(new, new, new, mask=mask, need_weights=need_weights, cache=cache)
    )
    assert cache.length == position + 1
    expected = decode_macs_with_cache(16, 4, position, num_kv_heads=num_kv_heads, batch_size=batch)
    assert counted == expected


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("position", [0, 1, 5, 12])
@pytest.mark.parametrize("batch", [1, 3])
def test_recomputed_step_matches_the_flop_counter(need_weights, num_kv_heads, position, batch):
    module, x = module_and_input(num_kv_heads, batch, position + 1)
    mask = torch.from_numpy(mha.causal_mask(position + 1))
    counted, _ = counted_macs(lambda: module(x, x, x, mask=mask, need_weights=need_weights))
    expected = decode_macs_without_cache(
        16, 4, position, num_kv_heads=num_kv_heads, batch_size=batch
    )
    assert counted == expected


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((12, 5, 0), {}, "not divisible by num_heads=5"),
        ((12, 4, 0), {"num_kv_heads": 3}, "num_kv_heads must divide num_heads"),
        ((12, 4, 0), {"num_kv_heads": 0}, "num_kv_heads"),
        ((12, 4, -1), {}, "position"),
        ((12, 4, 1.5), {}, "position"),
        ((0, 4, 1), {}, "d_model"),
        ((12, 4, 1), {"batch_size": 0}, "batch_size"),
    ],
)
@pytest.mark.parametrize("count", [decode_macs_with_cache, decode_macs_without_cache])
def test_macs_refuse_bad_arguments(count, args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        count(*args, **kwargs)

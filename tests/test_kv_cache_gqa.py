"""Decoding with a KV cache and grouped-query attention, in the specification and the
torch module: the cached computation equals the recomputed one, grouped heads equal
PyTorch's own ``enable_gqa``, and both sides agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numerics import assert_same_greedy_tokens

import mha
from mha import convert
from mha.kv_cache_torch import KVCache
from mha.modules import MultiHeadAttention

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CLOSE = {"rtol": 1e-12, "atol": 1e-12}


def module(d_model=12, num_heads=4, num_kv_heads=None, seed=0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads).double().eval()


def chunks(length: int, sizes: list[int]) -> list[slice]:
    out, start = [], 0
    for size in sizes:
        out.append(slice(start, min(start + size, length)))
        start += size
    assert start >= length
    return [s for s in out if s.start < length]


# ------------------------------------------------------------------ the torch module


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("sizes", [[1] * 7, [3, 1, 2, 1], [2, 5], [7]])
@pytest.mark.parametrize("need_weights", [True, False])
def test_cached_decoding_equals_one_causal_pass(num_kv_heads, sizes, need_weights):
    m = module(num_kv_heads=num_kv_heads)
    x = torch.randn(3, 7, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    full, full_w = m(x, x, x, mask=torch.from_numpy(mha.causal_mask(7)))
    cache, outs, weights = KVCache(), [], []
    for part in chunks(7, sizes):
        new = x[:, part]
        mask = torch.from_numpy(mha.causal_mask(new.shape[1], num_keys=part.stop))
        out, w = m(new, new, new, mask=mask, need_weights=need_weights, cache=cache)
        outs.append(out)
        weights.append(w)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **CLOSE)
    assert cache.k_heads.shape == (3, num_kv_heads, 7, 3)  # only the shared heads are stored
    if need_weights:
        for part, w in zip(chunks(7, sizes), weights, strict=True):
            torch.testing.assert_close(w, full_w[:, :, part, : part.stop], **CLOSE)


def test_cached_decoding_with_a_padded_batch():
    """Left-padded rows: the padding mask of the keys travels with the cache."""
    m = module()
    x = torch.randn(2, 6, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    keep = torch.tensor([[True] * 6, [False, False] + [True] * 4])  # (B, S)
    mask = torch.from_numpy(mha.causal_mask(6)) & keep[:, None, None, :]  # (B, 1, T, S)
    full, _ = m(x, x, x, mask=mask)
    cache, outs = KVCache(), []
    for t in range(6):
        step_mask = mask[:, :, t : t + 1, : t + 1]  # (B, 1, 1, t + 1)
        out, _ = m(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], mask=step_mask,
                   cache=cache)  # fmt: skip
        outs.append(out)
    got = torch.cat(outs, dim=1)
    torch.testing.assert_close(got[0], full[0], **CLOSE)
    torch.testing.assert_close(got[1, 2:], full[1, 2:], **CLOSE)  # pads have no keys
    assert torch.equal(got[1, :2], full[1, :2])  # nothing to attend to: b_o on both


def test_fixed_cache_projects_the_memory_once():
    m = module()
    memory = torch.randn(2, 5, 12, dtype=torch.float64)
    queries = torch.randn(2, 3, 12, dtype=torch.float64)
    full, _ = m(queries, memory, memory)
    cache = KVCache(fixed=True)
    calls = []
    handle = m.W_k.register_forward_hook(lambda *_: calls.append(1))
    outs = [m(queries[:, t : t + 1], memory, memory, cache=cache)[0] for t in range(3)]
    handle.remove()
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **CLOSE)
    assert len(calls) == 1 and cache.length == 5


@pytest.mark.parametrize("need_weights", [True, False])
def test_grouped_heads_equal_sdpa_enable_gqa(need_weights):
    m = module(d_model=16, num_heads=8, num_kv_heads=2)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    mask = torch.from_numpy(mha.causal_mask(5))
    out, _ = m(x, x, x, mask=mask, need_weights=need_weights)
    q = m.W_q(x).view(2, 5, 8, 2).transpose(1, 2)  # (B, H, T, Dh)
    k = m.W_k(x).view(2, 5, 2, 2).transpose(1, 2)  # (B, Hkv, S, Dh)
    v = m.W_v(x).view(2, 5, 2, 2).transpose(1, 2)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    expected = m.W_o(context.transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(out, expected, **CLOSE)


def test_as_many_kv_heads_as_heads_is_multi_head_attention():
    grouped = module(num_kv_heads=4)
    plain = module()
    assert grouped.W_k.weight.shape == plain.W_k.weight.shape == (12, 12)
    grouped.load_state_dict(plain.state_dict())
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    # exact: with one query head per key/value head nothing is repeated, and the module
    # takes the same code path as without grouping
    assert torch.equal(grouped(x, x, x)[0], plain(x, x, x)[0])


def test_one_kv_head_is_multi_query_attention():
    m = module(num_kv_heads=1)
    assert m.W_k.weight.shape == (3, 12) and m.W_v.weight.shape == (3, 12)
    x = torch.randn(1, 4, 12, dtype=torch.float64)
    _, weights = m(x, x, x)
    k = m.W_k(x)  # (1, 4, 3): one key head for all four query heads
    q = m.W_q(x).view(1, 4, 4, 3).transpose(1, 2)
    expected = torch.softmax(q @ k.transpose(1, 2)[:, None] / 3**0.5, dim=-1)
    torch.testing.assert_close(weights, expected, **CLOSE)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 3), (6, 4), (4, 0)])
def test_kv_heads_must_divide_heads(heads, kv_heads):
    with pytest.raises(ValueError, match="num_kv_heads"):
        MultiHeadAttention(12, heads, num_kv_heads=kv_heads)


@pytest.mark.parametrize("shape", [(1, 3, 1, 4), (2, 2, 1, 4), (1, 2, 1, 5)],
                         ids=["heads", "batch", "head_dim"])  # fmt: skip
@pytest.mark.parametrize("window", [None, 2])
def test_a_cache_refuses_heads_of_another_shape(shape, window):
    """Every dim but S is checked, the head size too (without it torch.cat raised its
    own RuntimeError, naming nothing); in both caches, growing or rolling."""
    for cache, zeros in ((KVCache(window=window), torch.zeros),
                         (mha.KVCache(window=window), np.zeros)):  # fmt: skip
        cache.append(zeros((1, 2, 3, 4)), zeros((1, 2, 3, 4)))
        with pytest.raises(ValueError, match=r"\(B, Hkv, S, Dh\) must agree except S"):
            cache.append(zeros(shape), zeros(shape))
        assert cache.length == 3
        cache.append(zeros((1, 2, 2, 4)), zeros((1, 2, 2, 4)))  # only S differs: taken


# ---------------------------------------------------------------- the specification


@pytest.mark.parametrize("kv_dim", [12, 6, 3])
def test_specification_equals_the_module_for_grouped_heads(kv_dim):
    params = mha.AttentionParams.init(12, seed=3, kv_dim=kv_dim)
    ours = convert.params_to_module(params, num_heads=4).eval()
    assert ours.num_kv_heads == kv_dim // 3
    x = np.random.default_rng(4).normal(size=(2, 5, 12))
    mask = mha.causal_mask(5)
    out, weights = mha.multi_head_attention(x, x, x, params, 4, mask=mask)
    with torch.no_grad():
        t_out, t_w = ours(*(torch.from_numpy(x),) * 3, mask=torch.from_numpy(mask))
    np.testing.assert_allclose(t_out.numpy(), out, **CLOSE)
    np.testing.assert_allclose(t_w.numpy(), weights, **CLOSE)
    back = convert.params_from_module(ours)
    assert back.kv_dim == kv_dim and np.array_equal(back.W_k, params.W_k)  # copied


@pytest.mark.parametrize("kv_dim", [12, 3])
def test_specification_cache_equals_one_causal_pass(kv_dim):
    params = mha.AttentionParams.init(12, seed=5, kv_dim=kv_dim)
    x = np.random.default_rng(6).normal(size=(2, 6, 12))
    full, full_w = mha.multi_head_attention(x, x, x, params, 4, mask=mha.causal_mask(6))
    cache = mha.KVCache()
    for part in chunks(6, [2, 1, 3]):
        new = x[:, part]
        mask = mha.causal_mask(new.shape[1], num_keys=part.stop)
        out, w = mha.multi_head_attention(new, new, new, params, 4, mask=mask, cache=cache)
        np.testing.assert_allclose(out, full[:, part], **CLOSE)
        np.testing.assert_allclose(w, full_w[:, :, part, : part.stop], **CLOSE)
    assert cache.k_heads.shape == (2, kv_dim // 3, 6, 3)


def test_specification_refuses_a_kv_width_that_does_not_group():
    params = mha.AttentionParams.init(12, kv_dim=9)  # 3 kv heads of 3 for 4 query heads
    x = np.zeros((1, 2, 12))
    with pytest.raises(ValueError, match="num_kv_heads dividing 4"):
        mha.multi_head_attention(x, x, x, params, 4)
    with pytest.raises(ValueError, match="grouped-query"):
        convert.params_to_torch(mha.AttentionParams.init(12, kv_dim=6), 4)


def test_causal_mask_for_the_last_queries_is_aligned_bottom_right():
    assert mha.causal_mask(2, num_keys=4).tolist() == [
        [True, True, True, False],
        [True, True, True, True],
    ]
    assert np.array_equal(mha.causal_mask(3, num_keys=3), mha.causal_mask(3))
    with pytest.raises(ValueError, match="num_keys=2 is smaller than size=3"):
        mha.causal_mask(3, num_keys=2)


# ------------------------------------------------- the Transformer and the translator


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_decodes_the_same_with_a_cache(norm_first):
    """Each position decoded through the cache equals one pass over the whole prefix,
    with padding in the source and the target (float64, 1e-12)."""
    from mha.transformer import Transformer

    torch.manual_seed(7)
    model = Transformer(11, 13, d_model=12, num_heads=4, num_encoder_layers=2,
                        num_decoder_layers=2, d_ff=24, max_len=10,
                        norm_first=norm_first).double().eval()  # fmt: skip
    src = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]])  # pad_id 0
    tgt = torch.tensor([[1, 5, 6, 7, 2], [1, 9, 2, 0, 0]])
    memory, _ = model.encode(src)
    full, _, _ = model.decode(tgt, memory, src)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, : t + 1], memory, src, cache=cache)[0] for t in range(5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **CLOSE)
    assert cache[0][0].length == 5 and cache[0][1].length == 4  # memory: once, S = 4


def test_translations_with_and_without_the_cache_are_identical():
    """The shipped translator, on every held-out and compositional sentence."""
    import mha.translator as tr

    translator = tr.load_pretrained()
    corpus = tr.generate_corpus(0, num_train=10000, num_heldout=1000, num_compositional=1000)
    sentences = [list(e.source) for e in corpus.heldout + corpus.compositional]
    src = translator.source_ids(sentences)
    vocab = translator.tgt_vocab
    # float32 logits of magnitude <= 8 (one ulp: 1e-6): the two paths differ by about
    # 1e-5; the closest choice of these 2000 sentences is won by more than 3.
    assert_same_greedy_tokens(translator.model, src, vocab.bos_id, vocab.eos_id, atol=1e-4)

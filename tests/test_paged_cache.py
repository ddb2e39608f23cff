"""The paged KV cache, in the specification and in torch: blocks taken as sequences grow,
freed and reused, read back in order, and attention equal to the contiguous cache's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mha
from mha import convert
from mha import paged_cache_torch as pt
from mha.kv_cache_torch import KVCache as TorchKVCache
from mha.paged_cache import PagedKVCache, memory_waste, paged_attention

pytestmark = pytest.mark.usefixtures("one_torch_thread")
# Two code paths (a loop over sequences against one padded batch; the contiguous cache
# against the paged one): float64 sums in other orders, magnitudes about 1.
CLOSE = {"rtol": 1e-12, "atol": 1e-12}


def heads(rng, length, num_kv_heads=2, head_dim=4):
    return rng.normal(size=(num_kv_heads, length, head_dim)), rng.normal(
        size=(num_kv_heads, length, head_dim)
    )


def test_blocks_are_taken_only_when_the_last_one_is_full():
    cache = PagedKVCache(num_blocks=6, block_size=3, num_kv_heads=2, head_dim=4)
    rng = np.random.default_rng(0)
    tables = []
    for _ in range(7):  # one position at a time
        cache.append(5, *heads(rng, 1))
        tables.append(list(cache.block_tables[5]))
    assert [len(t) for t in tables] == [1, 1, 1, 2, 2, 2, 3]
    assert cache.lengths[5] == 7 and cache.num_free_blocks == 3
    assert cache.slots(5).tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2], [2, 0]]


def test_freed_blocks_are_reused_lowest_first_and_the_pool_is_drawn():
    rng = np.random.default_rng(1)
    for cache in (PagedKVCache(5, 2, 2, 4), pt.PagedKVCache(5, 2, 2, 4)):
        wrap = (lambda a: a) if isinstance(cache, PagedKVCache) else torch.from_numpy
        for seq, length in ((0, 3), (1, 1), (2, 2)):
            cache.append(seq, *map(wrap, heads(rng, length)))
        assert cache.block_tables == {0: [0, 1], 1: [2], 2: [3]}
        assert cache.free(0) == [0, 1] and cache.num_free_blocks == 3
        cache.append(7, *map(wrap, heads(rng, 5)))  # takes 0, 1, then the never-used 4
        assert cache.block_tables == {1: [2], 2: [3], 7: [0, 1, 4]}
        expected = [[7, 7], [7, 7], [1, -1], [2, 2], [7, -1]]
        assert np.asarray(cache.occupancy()).tolist() == expected


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_interleaved_appends_frees_and_reuse_read_back_the_contiguous_cache(seed):
    """Random block size, sequences growing by random chunks in random order, some freed
    and replaced: every sequence reads back exactly what a contiguous cache holds."""
    rng = np.random.default_rng(seed)
    block_size = int(rng.integers(1, 6))
    paged = PagedKVCache(40, block_size, 2, 4)
    twin = pt.PagedKVCache(40, block_size, 2, 4)
    contiguous: dict[int, mha.KVCache] = {}
    next_id, reused = 0, 0
    for _ in range(25):
        if len(contiguous) < 3 or rng.random() < 0.2:  # a new request
            seq, next_id = next_id, next_id + 1
            contiguous[seq] = mha.KVCache()
        else:
            seq = int(rng.choice(list(contiguous)))
        k, v = heads(rng, int(rng.integers(1, 5)))
        contiguous[seq].append(k[None], v[None])  # (1, Hkv, S_new, Dh)
        got = paged.append(seq, k, v)
        twin.append(seq, torch.from_numpy(k), torch.from_numpy(v))
        assert np.array_equal(got[0], contiguous[seq].k_heads[0])  # copies: exact
        if rng.random() < 0.25:  # a request finishes
            freed = set(paged.free(seq))
            assert set(twin.free(seq)) == freed
            del contiguous[seq]
            before = set().union(*map(set, paged.block_tables.values()))
            contiguous[next_id], next_id = mha.KVCache(), next_id + 1
            k, v = heads(rng, block_size)
            paged.append(next_id - 1, k, v)
            twin.append(next_id - 1, torch.from_numpy(k), torch.from_numpy(v))
            contiguous[next_id - 1].append(k[None], v[None])
            reused += paged.block_tables[next_id - 1][0] in freed
            assert not before & set(paged.block_tables[next_id - 1])
    assert reused > 0
    assert paged.block_tables == twin.block_tables
    for seq, cache in contiguous.items():
        want_both = (cache.k_heads[0], cache.v_heads[0])
        for ours, theirs, want in zip(paged.gather(seq), twin.gather(seq), want_both, strict=True):
            assert np.array_equal(ours, want) and np.array_equal(theirs.numpy(), want)
    held = sum(len(t) for t in paged.block_tables.values())
    assert held + paged.num_free_blocks == 40
    occupancy = paged.occupancy()
    assert (occupancy >= 0).sum() == sum(paged.lengths.values())


@pytest.mark.parametrize("seed", [3, 4])
def test_paged_attention_equals_the_contiguous_cache(seed):
    """Several sequences of different lengths decoded through ``multi_head_attention_steps``
    with contiguous caches; the same heads through the paged caches (both layers) give
    the same context, weights and output. Grouped-query attention, random block size,
    a sequence freed and its blocks reused."""
    rng = np.random.default_rng(seed)
    block_size = int(rng.integers(1, 5))
    params = mha.AttentionParams.init(12, seed=seed, kv_dim=6)  # H = 4, Hkv = 2, Dh = 3
    paged, twin = PagedKVCache(30, block_size, 2, 3), pt.PagedKVCache(30, block_size, 2, 3)
    contiguous = {0: mha.KVCache(), 1: mha.KVCache(), 2: mha.KVCache()}
    first = {0: 5, 1: 1, 2: 3}  # prompts of different lengths, one call each
    for round_ in range(5):
        if round_ == 3:  # sequence 1 finishes; sequence 3 takes its blocks
            freed = paged.free(1)
            twin.free(1)
            del contiguous[1]
            contiguous[3], first[3] = mha.KVCache(), 2
        live = sorted(contiguous)
        q_rows, want = [], []
        for seq in live:  # a new request's prompt, else one new position
            new = rng.normal(size=(1, 1 if contiguous[seq].length else first[seq], 12))
            t, s = new.shape[1], contiguous[seq].length + new.shape[1]
            steps = mha.multi_head_attention_steps(
                new, new, new, params, 4, mha.causal_mask(t, num_keys=s), cache=contiguous[seq]
            )
            k_new, v_new = steps.k_heads[0, :, -t:], steps.v_heads[0, :, -t:]
            paged.append(seq, k_new, v_new)
            twin.append(seq, torch.from_numpy(k_new), torch.from_numpy(v_new))
            q_rows.append(steps.q_heads[:, :, -1:])  # the last query of each: (1, H, 1, Dh)
            want.append(steps)
        if round_ == 3:
            assert paged.block_tables[3][0] == min(freed)
        q = np.concatenate(q_rows)  # (N, H, 1, Dh)
        context, weights = paged_attention(q, paged, live)
        t_context, t_weights = pt.paged_attention(torch.from_numpy(q), twin, live)
        np.testing.assert_allclose(t_context.numpy(), context, **CLOSE)
        np.testing.assert_allclose(t_weights.numpy(), weights, **CLOSE)
        for i, steps in enumerate(want):
            s = steps.weights.shape[-1]
            np.testing.assert_allclose(context[i], steps.context[0, :, -1:], **CLOSE)
            np.testing.assert_allclose(weights[i, :, :, :s], steps.weights[0, :, -1:], **CLOSE)
            assert not weights[i, :, :, s:].any()  # past the sequence's end: exactly 0
            output = mha.merge_heads(context[i : i + 1]) @ params.W_o + params.b_o  # (1,1,D)
            np.testing.assert_allclose(output, steps.output[:, -1:], **CLOSE)


def test_several_queries_per_sequence_are_causal():
    """T > 1 (a prompt attended through the pool): query t sees positions up to its own."""
    rng = np.random.default_rng(5)
    cache = PagedKVCache(10, 2, 1, 4)
    k, v = heads(rng, 5, num_kv_heads=1)
    cache.append(0, k, v)
    cache.append(1, *heads(rng, 3, num_kv_heads=1))
    q = rng.normal(size=(2, 2, 3, 4))  # (N, H, T, Dh): H = 2 heads share the one kv head
    context, weights = paged_attention(q, cache, [0, 1])
    want, want_w = mha.scaled_dot_product_attention(
        q[0], k[[0, 0]], v[[0, 0]], mha.causal_mask(3, num_keys=5)
    )
    np.testing.assert_allclose(context[0], want, **CLOSE)
    np.testing.assert_allclose(weights[0], want_w, **CLOSE)
    assert weights.shape == (2, 2, 3, 5) and not weights[1, :, 0, 1:].any()


def test_torch_paged_attention_equals_the_module_with_its_cache():
    """The torch pool against :class:`mha.modules.MultiHeadAttention` decoding with its own
    contiguous KVCache: two sequences of different lengths, one step."""
    params = mha.AttentionParams.init(8, seed=6, kv_dim=4)  # H = 4, Hkv = 2, Dh = 2
    module = convert.params_to_module(params, num_heads=4).eval()
    gen = torch.Generator().manual_seed(6)
    pool = pt.PagedKVCache(8, 3, 2, 2)
    q_rows, outputs = [], []
    with torch.no_grad():
        for seq, length in ((0, 4), (1, 7)):
            x = torch.randn(1, length, 8, dtype=torch.float64, generator=gen)
            cache = TorchKVCache()
            prompt, mask = x[:, :-1], torch.from_numpy(mha.causal_mask(length - 1))
            module(prompt, prompt, prompt, mask, cache=cache)
            out, _ = module(x[:, -1:], x[:, -1:], x[:, -1:], cache=cache)
            pool.append(seq, cache.k_heads[0], cache.v_heads[0])
            q = module.W_q(x[:, -1:]).view(1, 1, 4, 2).transpose(1, 2)  # (1, H, 1, Dh)
            q_rows.append(q)
            outputs.append(out)
        context, _ = pt.paged_attention(torch.cat(q_rows), pool, [0, 1])  # (2, H, 1, Dh)
        merged = context.transpose(1, 2).reshape(2, 1, 8)  # (N, H, 1, Dh) -> (N, 1, D)
        torch.testing.assert_close(module.W_o(merged), torch.cat(outputs), **CLOSE)


def test_a_pooled_sequence_is_a_cache_for_multi_head_attention():
    """``pool.sequence(s)`` as ``cache=``: two sequences decoded in turn through one pool,
    in the specification and in the torch module, equal contiguous caches."""
    params = mha.AttentionParams.init(8, seed=8, kv_dim=4)  # H = 4, Hkv = 2, Dh = 2
    module = convert.params_to_module(params, num_heads=4).eval()
    x = np.random.default_rng(8).normal(size=(2, 6, 8))
    pool, twin = PagedKVCache(8, 3, 2, 2), pt.PagedKVCache(8, 3, 2, 2)
    plain = [mha.KVCache(), mha.KVCache()]
    for part in (slice(0, 2), slice(2, 3), slice(3, 4), slice(4, 6)):
        for seq in (0, 1):
            new = x[seq : seq + 1, part]  # (1, T, D)
            mask = mha.causal_mask(new.shape[1], num_keys=part.stop)
            want, _ = mha.multi_head_attention(new, new, new, params, 4, mask, cache=plain[seq])
            got, _ = mha.multi_head_attention(
                new, new, new, params, 4, mask, cache=pool.sequence(seq)
            )
            with torch.no_grad():
                t_new = torch.from_numpy(new)
                t_got, _ = module(
                    t_new, t_new, t_new, torch.from_numpy(mask), cache=twin.sequence(seq)
                )
            np.testing.assert_allclose(got, want, **CLOSE)
            np.testing.assert_allclose(t_got.numpy(), want, **CLOSE)
    assert pool.block_tables == twin.block_tables == {0: [0, 2], 1: [1, 3]}
    with pytest.raises(ValueError, match="batch of one"):
        pool.sequence(2).append(np.zeros((2, 2, 1, 2)), np.zeros((2, 2, 1, 2)))
    with pytest.raises(ValueError, match="batch of one"):
        twin.sequence(2).append(torch.zeros(2, 2, 1, 2), torch.zeros(2, 2, 1, 2))


def test_a_full_pool_refuses_before_writing():
    for cache in (PagedKVCache(2, 2, 1, 1), pt.PagedKVCache(2, 2, 1, 1)):
        zeros = np.zeros if isinstance(cache, PagedKVCache) else torch.zeros
        cache.append(0, zeros((1, 3, 1)), zeros((1, 3, 1)))
        with pytest.raises(ValueError, match="needs 1 new block.*only 0 of 2 are free"):
            cache.append(1, zeros((1, 1, 1)), zeros((1, 1, 1)))
        assert 1 not in cache.block_tables and cache.lengths == {0: 3}
        cache.append(0, zeros((1, 1, 1)), zeros((1, 1, 1)))  # fills the last block's slot


def test_memory_waste_contiguous_against_paged():
    waste = memory_waste([5, 100, 37, 128], block_size=16, max_length=128)
    assert waste.contiguous.tolist() == [123, 28, 91, 0]
    assert waste.paged.tolist() == [11, 12, 11, 0]  # 16, 112, 48 and 128 slots reserved
    assert waste.contiguous_fraction == 242 / 512  # exact: small integers
    assert waste.paged_fraction == 34 / (270 + 34)
    lengths = np.random.default_rng(7).integers(1, 2049, size=200)
    spread = memory_waste(lengths, 16, 2048)
    assert (
        spread.paged.max() < 16 and spread.paged_fraction < 0.02 < 0.3 < spread.contiguous_fraction
    )


BAD_CACHES = [
    (dict(num_blocks=0), "num_blocks"),
    (dict(block_size=1.5), "block_size"),
    (dict(num_kv_heads=True), "num_kv_heads"),
    (dict(head_dim=-2), "head_dim"),
]


@pytest.mark.parametrize(("kwargs", "name"), BAD_CACHES)
@pytest.mark.parametrize("layer", ["numpy", "torch"])
def test_bad_pool_arguments(layer, kwargs, name):
    cls = PagedKVCache if layer == "numpy" else pt.PagedKVCache
    with pytest.raises(ValueError, match=name):
        cls(**{"num_blocks": 4, "block_size": 2, "num_kv_heads": 2, "head_dim": 4, **kwargs})


@pytest.mark.parametrize("layer", ["numpy", "torch"])
def test_bad_sequence_and_head_arguments(layer):
    if layer == "numpy":
        cache, zeros, attend = PagedKVCache(4, 2, 2, 4), np.zeros, paged_attention
        with pytest.raises(ValueError, match="dtype"):
            PagedKVCache(4, 2, 2, 4, dtype=int)
    else:
        cache, zeros, attend = pt.PagedKVCache(4, 2, 2, 4), torch.zeros, pt.paged_attention
        with pytest.raises(ValueError, match="dtype"):
            pt.PagedKVCache(4, 2, 2, 4, dtype=torch.int64)
    cache.append(0, zeros((2, 3, 4)), zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="seq_id"):
        cache.append(-1, zeros((2, 1, 4)), zeros((2, 1, 4)))
    with pytest.raises(ValueError, match=r"k_heads has shape \(2, 1, 5\)"):
        cache.append(1, zeros((2, 1, 5)), zeros((2, 1, 5)))
    with pytest.raises(ValueError, match="v_heads has shape"):
        cache.append(1, zeros((2, 1, 4)), zeros((2, 2, 4)))
    with pytest.raises(ValueError, match="k_heads"):
        cache.append(1, zeros((1, 2, 1, 4)), zeros((1, 2, 1, 4)))
    for method in (cache.gather, cache.free, cache.slots):
        with pytest.raises(
            ValueError, match=r"seq_id=3 is not in the cache \(sequences held: \[0\]"
        ):
            method(3)
    with pytest.raises(ValueError, match="seq_ids names 2 sequences"):
        attend(zeros((1, 2, 1, 4)), cache, [0, 0])
    with pytest.raises(ValueError, match="Dh = 4"):
        attend(zeros((1, 2, 1, 3)), cache, [0])
    with pytest.raises(ValueError, match="T=4 queries"):
        attend(zeros((1, 2, 4, 4)), cache, [0])
    with pytest.raises(ValueError, match="num_kv_heads"):
        attend(zeros((1, 3, 1, 4)), cache, [0])  # 3 query heads over 2 kv heads
    with pytest.raises(ValueError, match="not in the cache"):
        attend(zeros((1, 2, 1, 4)), cache, [9])
    with pytest.raises(ValueError, match="PagedKVCache"):
        attend(zeros((1, 2, 1, 4)), mha.KVCache(), [0])


@pytest.mark.parametrize(
    ("lengths", "kwargs", "name"),
    [
        ([0, 3], {}, "lengths"),
        ([3, 9], {}, "lengths"),
        ([1.5], {}, "lengths"),
        ([], {}, "lengths"),
        ([3], {"block_size": 0}, "block_size"),
        ([3], {"max_length": -1}, "max_length"),
    ],
)
def test_bad_waste_arguments(lengths, kwargs, name):
    with pytest.raises(ValueError, match=name):
        memory_waste(lengths, **{"block_size": 4, "max_length": 8, **kwargs})

"""Bad inputs to the torch layers get a ValueError naming the argument (issue 32, 3):
a cache of the wrong kind or dtype, an input of another dtype than the weights, in
:class:`MultiHeadAttention`, the layers and the Transformer; never PyTorch's
RuntimeError from a matmul or a LayerNorm, nor an AttributeError."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mha
from mha.kv_cache_torch import KVCache
from mha.layers import DecoderLayer, EncoderLayer, FeedForward
from mha.modules import MultiHeadAttention
from mha.transformer import Transformer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

X = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def attention(dtype=torch.float64, **kwargs) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(8, 2, **kwargs).to(dtype).eval()


@pytest.mark.parametrize(
    "cache",
    [mha.KVCache(), mha.KVCache(window=3), {}, {"k_heads": None, "v_heads": None}],
    ids=["spec-cache", "spec-window-cache", "empty-dict", "dict"],
)
def test_a_cache_that_is_not_the_torch_one_is_refused_by_name(cache):
    with pytest.raises(ValueError, match=r"^cache must be a mha\.kv_cache_torch\.KVCache"):
        attention()(X, X, X, cache=cache)


@pytest.mark.parametrize("fixed", [False, True])
def test_a_cache_filled_in_another_dtype_is_refused_by_name(fixed):
    cache = KVCache(fixed=fixed)
    attention(torch.float32)(X.float(), X.float(), X.float(), cache=cache)
    step = X[:, -1:]  # one new position
    with pytest.raises(ValueError, match=r"^cache holds torch\.float32 .* torch\.float64"):
        attention()(step, X if fixed else step, X if fixed else step, cache=cache)
    assert cache.length == 3  # nothing was appended


def test_a_fixed_cache_of_another_batch_is_refused_by_name():
    cache = KVCache(fixed=True)
    attention()(X, X, X, cache=cache)
    one = X[:1]
    with pytest.raises(ValueError, match=r"^cache holds key heads of shape \(2, 2, 3, 4\)"):
        attention()(one, one, one, cache=cache)


@pytest.mark.parametrize("name", ["query", "key", "value"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_an_input_of_another_dtype_is_refused_by_name(name, need_weights):
    inputs = {"query": X, "key": X, "value": X}
    inputs[name] = X.float()
    wrong = rf"^{name} has dtype torch\.float32, but the layer's weights are torch\.float64"
    with pytest.raises(ValueError, match=wrong):
        attention()(*inputs.values(), need_weights=need_weights)
    inputs = {k: v.float() for k, v in inputs.items()} | {name: X}  # and the other way
    wrong = rf"^{name} has dtype torch\.float64, but the layer's weights are torch\.float32"
    with pytest.raises(ValueError, match=wrong):
        attention(torch.float32)(*inputs.values(), need_weights=need_weights)


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_layers_refuse_an_input_of_another_dtype_by_name(norm_first):
    """Pre-norm meets its input in a LayerNorm first, post-norm in a matmul: both
    raised PyTorch's RuntimeError before the layers checked it."""
    torch.manual_seed(0)
    encoder = EncoderLayer(8, 2, 16, norm_first=norm_first).double()
    decoder = DecoderLayer(8, 2, 16, norm_first=norm_first).double()
    with pytest.raises(ValueError, match=r"^x has dtype torch\.float32"):
        encoder(X.float())
    with pytest.raises(ValueError, match=r"^x has dtype torch\.float32"):
        decoder(X.float(), X)
    with pytest.raises(ValueError, match=r"^memory has dtype torch\.float32"):
        decoder(X, X.float())
    with pytest.raises(ValueError, match=r"^memory must be a torch\.Tensor, got ndarray"):
        decoder(X, X.numpy())
    with pytest.raises(ValueError, match=r"^cache must be a pair"):
        decoder(X, X, cache={})
    with pytest.raises(ValueError, match=r"^x has dtype torch\.float32"):
        FeedForward(8, 16).double()(X.float())
    # the same inputs in the layers' dtype go through
    assert encoder(X)[0].shape == decoder(X, X)[0].shape == X.shape


def test_the_transformer_refuses_a_memory_or_a_cache_that_is_not_its_own():
    torch.manual_seed(0)
    model = Transformer(10, 10, d_model=8, num_heads=2, d_ff=16).double().eval()
    src = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        memory, _ = model.encode(src)
        with pytest.raises(ValueError, match=r"^memory has dtype torch\.float32"):
            model.decode(src, memory.float(), src)
        with pytest.raises(ValueError, match=r"^memory must be a torch\.Tensor"):
            model.decode(src, memory.numpy(), src)
        for cache in ({}, [], [mha.KVCache()], [(KVCache(), {})], model.new_cache() * 2):
            with pytest.raises(ValueError, match=r"^cache must be the list model\.new_cache"):
                model.decode(src, memory, src, cache=cache)
        cache = model.new_cache()
        model.decode(src[:, :1], memory, src, cache=cache)  # float64 heads
        model.decode(src[:, :2], memory, src, cache=cache)
        # A prefix shorter than the cache: once silently empty logits, as for a prefix
        # exactly as long (no new position, allowed: tests/test_rope_alibi.py).
        with pytest.raises(ValueError, match=r"^tgt_in has 1 positions but the cache "
                           "already holds 2"):  # fmt: skip
            model.decode(src[:, :1], memory, src, cache=cache)
        assert model.decode(src[:, :2], memory, src, cache=cache)[0].shape == (1, 0, 10)
        small = Transformer(10, 10, d_model=8, num_heads=2, d_ff=16).eval()  # float32
        with pytest.raises(ValueError, match=r"^cache holds torch\.float64"):
            small.decode(src, small.encode(src)[0], src, cache=cache)


def test_the_numpy_specification_refuses_the_torch_cache_by_name():
    params = mha.AttentionParams.init(8, seed=0)
    x = np.zeros((1, 2, 8))
    with pytest.raises(ValueError, match=r"^cache must be a mha\.KVCache, got "
                       r"mha\.kv_cache_torch\.KVCache"):
        mha.multi_head_attention(x, x, x, params, 2, cache=KVCache())

"""Hugging Face ``transformers`` as an outside oracle for chapters 8, 9 and 10: its Llama
attention (grouped heads, RoPE, ``DynamicCache``), Mistral's sliding window (masks and
the rolling cache), BLOOM's ALiBi and DeepSeek-V3's multi-head latent attention (last
section) equal ``mha``'s in float64, weights copied across.

``transformers`` is a test-only dependency (pinned in requirements.txt, never imported
by ``mha`` or the chapters). Importing it costs seconds, paid once for this module;
nothing is downloaded (``HF_HUB_OFFLINE``), every model is a tiny random configuration
built here, and only the attention layers are loaded, not whole models.

Which side is which:

* Llama and Mistral against :class:`mha.modules.MultiHeadAttention` with
  ``rope_positions`` and ``num_kv_heads`` (chapter 9's RoPE, chapter 8's grouped heads),
  its :class:`mha.kv_cache_torch.KVCache` (rolling with a ``window``) and
  :func:`mha.sliding_window_mask`. Hugging Face rotates the two halves of a head,
  ``mha`` adjacent pairs: the rows of ``W_q`` and ``W_k`` are copied through
  :func:`mha.rope_permutation` (:func:`rope_rows`), both ways.
* BLOOM against the specification, :func:`mha.multi_head_attention` with
  ``score_bias=mha.alibi_bias(...)`` and :class:`mha.KVCache`. BLOOM biases key ``j`` by
  ``slope * j``, ``mha`` by ``-slope * (i - j)``: a shift by ``slope * i`` along each
  query's row, which the softmax removes.

Where Hugging Face computes in float32 even for float64 inputs, the test swaps that one
step for a float64 twin, named where it is used (otherwise agreement stops at ~1e-7,
which ``test_*_as_shipped_*`` record):

* ``LlamaRotaryEmbedding`` (Llama and Mistral) computes its frequencies and angles in
  float32: :func:`rotary_tables` computes the same cos/sin tables in float64, passed
  as ``position_embeddings``;
* eager attention's softmax is float32: Llama and Mistral run
  ``attn_implementation="sdpa"``;
* BLOOM (eager only) computes its slopes (``_get_alibi_slopes``) and its softmax in
  float32: the fixture ``bloom_float64`` swaps both (:func:`bloom_slopes_float64`,
  :class:`SoftmaxKeepsDtype`).
"""

from __future__ import annotations

import functools
import math
import os
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numerics import EPS64
from torch import nn

import mha
from mha.kv_cache_torch import KVCache
from mha.masks import causal_mask
from mha.mla import MLACache, multi_head_latent_attention
from mha.mla_params import MLAParams, mla_softmax_scale
from mha.mla_torch import MLACache as TorchCache
from mha.mla_torch import module_from_params
from mha.modules import MultiHeadAttention

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Both sides in float64, outputs up to ~10: rounding leaves them a few 1e-15 apart.
# 1e-12 is far above that and far below the ~1e-7 that a step left in float32 gives.
TOL = 1e-12
B, D, H, HKV, DH = 2, 32, 4, 2, 8  # Dh = 8: rope_permutation is not its own inverse
LENGTH = 9
SIZES = [4, 1, 1, 1, 2]  # a prefill of 4, three one-token steps, then a block of 2
BASE = 10000.0  # rope_theta: Hugging Face's default and mha.apply_rope's


@functools.cache
def hf() -> SimpleNamespace:
    """The pieces of ``transformers`` used here, imported on first use rather than at the
    top: every xdist worker and every ``pytest --chapter`` run imports each test module
    to collect it, and transformers takes seconds to import. This way only the process
    that runs these tests pays, once."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never download
    from transformers import (
        BloomConfig,
        DeepseekV3Config,
        DynamicCache,
        LlamaConfig,
        MistralConfig,
    )
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
    from transformers.models.bloom import modeling_bloom
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        DeepseekV3Attention,
        DeepseekV3RotaryEmbedding,
    )
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    from transformers.models.mistral.modeling_mistral import MistralAttention

    return SimpleNamespace(
        BloomConfig=BloomConfig,
        DeepseekV3Attention=DeepseekV3Attention,
        DeepseekV3Config=DeepseekV3Config,
        DeepseekV3RotaryEmbedding=DeepseekV3RotaryEmbedding,
        DynamicCache=DynamicCache,
        LlamaConfig=LlamaConfig,
        MistralConfig=MistralConfig,
        create_causal_mask=create_causal_mask,
        create_sliding_window_causal_mask=create_sliding_window_causal_mask,
        modeling_bloom=modeling_bloom,  # BloomAttention, and the float32 steps to swap
        LlamaAttention=LlamaAttention,
        LlamaRotaryEmbedding=LlamaRotaryEmbedding,
        MistralAttention=MistralAttention,
    )


def chunks(sizes: list[int]) -> list[slice]:
    """The positions each decoding call feeds: consecutive slices of these sizes."""
    stops = np.cumsum(sizes)
    return [slice(int(stop - size), int(stop)) for size, stop in zip(sizes, stops, strict=True)]


def randomize(module: torch.nn.Module, seed: int, scale: float = 0.3) -> None:
    """Seeded normal weights and biases (nonzero biases, sharper softmax than the
    default initialisations), whatever the library's own initialisation draws."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * scale)


def hidden(seed: int, length: int = LENGTH) -> torch.Tensor:
    """(B, L, D) float64 inputs."""
    return torch.randn(
        B, length, D, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
    )


def bool_mask(mask: np.ndarray) -> torch.Tensor:
    """An mha mask (NumPy, True = may attend) as a tensor for the torch module."""
    return torch.from_numpy(mask)


# ------------------------------------------------------------ Llama and Mistral: RoPE


def rotary_tables(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 twin of ``LlamaRotaryEmbedding.forward`` (which computes ``inv_freq`` and
    the angles in float32): its cos and sin tables, ``(1, T, Dh)`` each, for positions
    ``(T,)``; each frequency appears twice, once per half of the head."""
    inv_freq = BASE ** (-torch.arange(0, DH, 2, dtype=torch.float64) / DH)  # (Dh/2,)
    angles = positions.to(torch.float64)[:, None] * inv_freq  # (T, 1) * (Dh/2,) -> (T, Dh/2)
    both_halves = torch.cat([angles, angles], dim=-1)[None]  # (1, T, Dh)
    return both_halves.cos(), both_halves.sin()


def rope_rows(num_heads: int) -> torch.Tensor:
    """Row ``h*Dh + j`` of ``mha``'s ``W_q`` (or ``W_k``) is row ``h*Dh + perm[j]`` of
    Hugging Face's, ``perm = mha.rope_permutation(Dh)``: mha's adjacent pair ``(2i, 2i+1)``
    is Hugging Face's ``(i, i + Dh/2)``. Returns those rows, ``(num_heads * Dh,)``."""
    perm = torch.from_numpy(mha.rope_permutation(DH))  # (Dh,)
    return (torch.arange(num_heads)[:, None] * DH + perm).reshape(-1)  # (H, Dh) -> (H*Dh,)


def _projections(ours: MultiHeadAttention, theirs: torch.nn.Module):
    """Pairs (mha's linear, Hugging Face's linear, its rows in mha's order)."""
    everything = torch.arange(D)
    return (
        (ours.W_q, theirs.q_proj, rope_rows(H)),
        (ours.W_k, theirs.k_proj, rope_rows(HKV)),
        (ours.W_v, theirs.v_proj, everything[: HKV * DH]),  # values are not rotated
        (ours.W_o, theirs.o_proj, everything),  # nor is the output
    )


def llama_from_mha(ours: MultiHeadAttention, theirs: torch.nn.Module) -> None:
    """mha -> Hugging Face (Llama or Mistral attention): copy the weights into ``theirs``."""
    with torch.no_grad():
        for mine, their, rows in _projections(ours, theirs):
            their.weight[rows] = mine.weight  # Hugging Face's row rows[i] is mha's row i
            if their.bias is not None:
                their.bias[rows] = mine.bias


def mha_from_llama(theirs: torch.nn.Module, bias: bool) -> MultiHeadAttention:
    """Hugging Face (Llama or Mistral attention) -> a new float64 mha module."""
    ours = MultiHeadAttention(D, H, bias=bias, num_kv_heads=HKV).double().eval()
    with torch.no_grad():
        for mine, their, rows in _projections(ours, theirs):
            mine.weight.copy_(their.weight[rows])
            if bias:
                mine.bias.copy_(their.bias[rows])
    return ours


def llama_config(**extra) -> Any:
    return hf().LlamaConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=HKV,
                            num_hidden_layers=1, vocab_size=8, intermediate_size=8,
                            rope_theta=BASE, attn_implementation="sdpa", **extra)  # fmt: skip


def mistral_config(window: int) -> Any:
    return hf().MistralConfig(hidden_size=D, num_attention_heads=H, num_key_value_heads=HKV,
                              num_hidden_layers=1, vocab_size=8, intermediate_size=8,
                              rope_theta=BASE, sliding_window=window,
                              attn_implementation="sdpa")  # fmt: skip


@pytest.fixture(scope="module")
def llama_pair() -> tuple[Any, torch.nn.Module, MultiHeadAttention]:
    """Llama attention with biases (``attention_bias``), loaded from a seeded mha module."""
    config = llama_config(attention_bias=True)
    ours = MultiHeadAttention(D, H, bias=True, num_kv_heads=HKV).double().eval()
    randomize(ours, seed=1)
    theirs = hf().LlamaAttention(config, layer_idx=0).double().eval()
    llama_from_mha(ours, theirs)
    return config, theirs, ours


def hf_decode(attn, config, x, make_mask, sizes=SIZES):
    """Hugging Face's attention over ``x`` chunk by chunk with a fresh ``DynamicCache``
    built from the config, as the models build it; ``make_mask(config, chunk, cache)``
    makes each call's mask before the call, as the models' ``forward`` does. Returns the
    outputs, ``(B, L, D)``, and the cache."""
    cache, outs = hf().DynamicCache(config=config), []
    with torch.no_grad():
        for part in chunks(sizes):
            new = x[:, part]
            mask = make_mask(config, new, cache)
            positions = torch.arange(part.start, part.stop)
            out, _ = attn(new, rotary_tables(positions), mask, cache=cache)
            outs.append(out)
    return torch.cat(outs, dim=1), cache


def mha_decode(ours, x, window=None, sizes=SIZES):
    """mha's module over ``x`` chunk by chunk with its KVCache (rolling with a window)."""
    cache, outs = KVCache(window=window), []
    with torch.no_grad():
        for part in chunks(sizes):
            new = x[:, part]
            num_keys = cache.kept_length + new.shape[1]  # the keys the queries see
            if window is None:
                mask = mha.causal_mask(new.shape[1], num_keys=num_keys)
            else:
                mask = mha.sliding_window_mask(new.shape[1], window, num_keys=num_keys)
            positions = torch.arange(part.start, part.stop)
            out, _ = ours(new, new, new, mask=bool_mask(mask), cache=cache,
                          rope_positions=positions)  # fmt: skip
            outs.append(out)
    return torch.cat(outs, dim=1), cache


def causal(config, new, cache):
    """Llama's mask, as ``LlamaModel.forward`` makes it (None where SDPA's ``is_causal``
    does the job)."""
    return hf().create_causal_mask(config, new, None, cache)


def sliding(config, new, cache):
    """Mistral's mask, as ``MistralModel.forward`` makes it."""
    return hf().create_sliding_window_causal_mask(config, new, None, cache)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=0, atol=TOL)


def test_the_copies_are_exact_both_ways(llama_pair):
    """mha -> Hugging Face -> mha gives back every weight: copies, exact by construction."""
    _, theirs, ours = llama_pair
    back = mha_from_llama(theirs, bias=True)
    for name, value in ours.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name


def test_llama_gqa_rope_full_sequence(llama_pair):
    config, theirs, ours = llama_pair
    x = hidden(seed=2)
    positions = torch.arange(LENGTH)
    with torch.no_grad():
        mask = hf().create_causal_mask(config, x, None, None)  # None: SDPA's is_causal
        want, _ = theirs(x, rotary_tables(positions), mask)
        got, _ = ours(x, x, x, mask=bool_mask(mha.causal_mask(LENGTH)), rope_positions=positions)
    assert_close(got, want)


def test_llama_gqa_rope_decoding_with_dynamic_cache(llama_pair):
    """Prefill, one-token steps and a block: the outputs of every call, and the cache's
    keys (rotated before caching, on both sides) and values at the end."""
    config, theirs, ours = llama_pair
    x = hidden(seed=3)
    want, hf_cache = hf_decode(theirs, config, x, causal)
    got, cache = mha_decode(ours, x)
    assert_close(got, want)
    perm = torch.from_numpy(mha.rope_permutation(DH))
    layer = hf_cache.layers[0]
    assert layer.keys.shape == cache.k_heads.shape == (B, HKV, LENGTH, DH)  # Hkv heads only
    assert_close(cache.k_heads, layer.keys[..., perm])  # mha's pairs from HF's halves
    assert_close(cache.v_heads, layer.values)


def test_llama_rotary_as_shipped_is_float32(llama_pair):
    """Why :func:`rotary_tables` exists: ``LlamaRotaryEmbedding`` under float64 gives
    float64 tables holding float32 values, ~1e-7 from the float64 twin. If this fails
    because they agree, Hugging Face computes in float64 now: drop the twin."""
    config, _, _ = llama_pair
    positions = torch.arange(LENGTH)
    shipped = hf().LlamaRotaryEmbedding(config)(hidden(seed=4), positions[None])
    for got, want in zip(shipped, rotary_tables(positions), strict=True):
        assert got.dtype == torch.float64
        gap = float((got - want).abs().max())
        assert 1e-12 < gap < 1e-5, gap


# ------------------------------------------------------------- Mistral: the window


@pytest.fixture(scope="module")
def mistral_attention() -> torch.nn.Module:
    """One seeded Mistral attention (no biases); the window lives in the config only,
    so each test pairs it with the config of its window."""
    theirs = hf().MistralAttention(mistral_config(2), layer_idx=0).double().eval()
    randomize(theirs, seed=5)
    return theirs


def with_window(attn: torch.nn.Module, window: int) -> torch.nn.Module:
    attn.config = mistral_config(window)  # the layer reads config.sliding_window
    return attn


@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_mistral_full_sequence_mask_is_sliding_window_mask(window):
    config = mistral_config(window)
    mask = hf().create_sliding_window_causal_mask(config, hidden(seed=6), None, None,
                                                  allow_is_causal_skip=False)  # fmt: skip
    assert mask.shape == (B, 1, LENGTH, LENGTH)
    want = torch.from_numpy(mha.sliding_window_mask(LENGTH, window)).expand_as(mask)
    assert torch.equal(mask, want)  # masks: exact by construction


@pytest.mark.parametrize("window", [2, 3, 5])
def test_mistral_sliding_window_full_and_cached(mistral_attention, window):
    """Windows of 2 and more: the whole sequence at once, then decoding through
    Hugging Face's ``DynamicSlidingWindowLayer`` against mha's rolling KVCache; each
    call's mask (materialised) is mha's ``sliding_window_mask(T, w, num_keys=S)``."""
    theirs = with_window(mistral_attention, window)
    config = theirs.config
    ours = mha_from_llama(theirs, bias=False)
    x = hidden(seed=7)
    positions = torch.arange(LENGTH)
    with torch.no_grad():
        want, _ = theirs(x, rotary_tables(positions), sliding(config, x, None))
        band = bool_mask(mha.sliding_window_mask(LENGTH, window))
        got, _ = ours(x, x, x, mask=band, rope_positions=positions)
    assert_close(got, want)

    materialised = []  # each call's mask, never None: SDPA's is_causal not allowed

    def keep_and_make(config, new, cache):
        full = hf().create_sliding_window_causal_mask(config, new, None, cache,
                                                      allow_is_causal_skip=False)  # fmt: skip
        materialised.append(full)
        return sliding(config, new, cache)  # what the model passes

    want_cached, hf_cache = hf_decode(theirs, config, x, keep_and_make)
    got_cached, cache = mha_decode(ours, x, window=window)
    assert_close(got_cached, want_cached)
    assert_close(got_cached, got)  # and the cache changed nothing (rounding aside)
    kept = 0  # mha's kept_length before each call
    for part, full in zip(chunks(SIZES), materialised, strict=True):
        size = part.stop - part.start
        want_mask = mha.sliding_window_mask(size, window, num_keys=kept + size)
        assert torch.equal(full, torch.from_numpy(want_mask).expand_as(full))  # exact
        kept = min(part.stop, window - 1)
    assert hf_cache.layers[0].keys.shape[2] == window - 1 == cache.kept_length


def test_mistral_window_1_is_wrong_in_hugging_face(mistral_attention):
    """Window 1 (each position sees only itself). ``DynamicSlidingWindowLayer`` trims
    with ``[-w + 1:]``, which is ``[0:]`` for w = 1: it keeps every key, so one-token
    decoding attends to the whole prefix (and a block of several tokens crashes).
    Recorded here; the reference for window 1 is the book's own: mha's rolling cache
    equals mha's full-sequence ``sliding_window_mask(T, 1)``, and Hugging Face without
    a cache (whose mask is right, test above). If this test fails because Hugging Face
    got it right, move window 1 into the test above and update PITFALLS."""
    theirs = with_window(mistral_attention, 1)
    config = theirs.config
    ours = mha_from_llama(theirs, bias=False)
    x = hidden(seed=8, length=6)
    sizes = [3, 1, 1, 1]  # a prefill, then one token at a time
    steps = slice(3, 6)
    positions = torch.arange(6)
    with torch.no_grad():
        hf_full, _ = theirs(x, rotary_tables(positions), sliding(config, x, None))
        band = bool_mask(mha.sliding_window_mask(6, 1))
        reference, _ = ours(x, x, x, mask=band, rope_positions=positions)
    assert_close(reference, hf_full)  # without a cache Hugging Face is right

    hf_cached, hf_cache = hf_decode(theirs, config, x, sliding, sizes=sizes)
    rolling, cache = mha_decode(ours, x, window=1, sizes=sizes)
    every_key, _ = mha_decode(ours, x, window=None, sizes=sizes)
    assert_close(rolling, reference)  # the book's rolling cache: the true window of 1
    assert hf_cache.layers[0].keys.shape[2] == 6 and cache.kept_length == 0
    assert_close(hf_cached[:, steps], every_key[:, steps])  # HF: plain causal attention
    assert float((hf_cached[:, steps] - reference[:, steps]).abs().max()) > 0.1  # wrong

    hf_cache = hf().DynamicCache(config=config)
    with torch.no_grad():
        theirs(x[:, :3], rotary_tables(positions[:3]), sliding(config, x[:, :3], hf_cache),
               cache=hf_cache)  # fmt: skip
        block = x[:, 3:5]
        with pytest.raises(RuntimeError, match="must match"):  # 5 keys, a (2, 2) mask
            theirs(block, rotary_tables(positions[3:5]), sliding(config, block, hf_cache),
                   cache=hf_cache)  # fmt: skip


# ------------------------------------------------------------------- BLOOM: ALiBi

BLOOM_H = 12  # 12 heads: the slopes 2^(-k/2) of BLOOM's rule are not exact in float32
BLOOM_D = BLOOM_H * 4


def bloom_slopes_float64(num_heads: int, device=None) -> torch.Tensor:
    """Float64 twin of ``modeling_bloom._get_alibi_slopes`` (float32 there): the same
    rule, ``base^k`` with ``base = 2^(-8/p)`` for the largest power of two ``p <= H``,
    then odd powers of ``2^(-4/p)`` for the remaining heads."""
    power = 1 << (num_heads.bit_length() - 1)
    k = torch.arange(1, power + 1, dtype=torch.float64)
    slopes = (2.0 ** (-8.0 / power)) ** k  # (p,)
    odd = 2 * torch.arange(num_heads - power, dtype=torch.float64) + 1  # (H - p,) 1, 3, ...
    return torch.cat([slopes, (2.0 ** (-4.0 / power)) ** odd]).to(device)  # (H,)


class SoftmaxKeepsDtype:
    """``modeling_bloom``'s ``F`` (torch.nn.functional) with one change, the float64 twin
    of its softmax: ``F.softmax(x, dim, dtype=torch.float32)`` there runs in ``x``'s
    dtype here."""

    def __getattr__(self, name: str):
        return getattr(F, name)

    @staticmethod
    def softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return F.softmax(x, dim=dim)


@pytest.fixture
def bloom_float64(monkeypatch):
    """BLOOM's two float32 steps replaced by their float64 twins (undone afterwards)."""
    monkeypatch.setattr(hf().modeling_bloom, "_get_alibi_slopes", bloom_slopes_float64)
    monkeypatch.setattr(hf().modeling_bloom, "F", SoftmaxKeepsDtype())


@pytest.fixture(scope="module")
def bloom_pair() -> tuple[Any, torch.nn.Module, mha.AttentionParams]:
    """A seeded BLOOM attention and the same weights as mha's AttentionParams."""
    # Eager: BLOOM has no other attention implementation (a config without one gets
    # no mask from create_causal_mask at all).
    config = hf().BloomConfig(hidden_size=BLOOM_D, n_head=BLOOM_H, n_layer=1, vocab_size=8,
                              attn_implementation="eager")  # fmt: skip
    theirs = hf().modeling_bloom.BloomAttention(config, layer_idx=0).double().eval()
    randomize(theirs, seed=9)
    return config, theirs, params_from_bloom(theirs)


def params_from_bloom(theirs: torch.nn.Module) -> mha.AttentionParams:
    """Hugging Face -> mha. BLOOM fuses the three projections, ``(3D, D)`` rows ordered
    (head, role, Dh): query, key and value of head 0, then of head 1, ..."""
    dh = BLOOM_D // BLOOM_H
    fused = theirs.query_key_value.weight.detach().numpy()  # (3D, D) = (out, in)
    fused = fused.reshape(BLOOM_H, 3, dh, BLOOM_D)  # (H, role, Dh, D)
    bias = theirs.query_key_value.bias.detach().numpy().reshape(BLOOM_H, 3, dh)
    roles = {}
    for i, role in enumerate("qkv"):
        roles[f"W_{role}"] = fused[:, i].reshape(BLOOM_D, BLOOM_D).T  # (out, in) -> (in, out)
        roles[f"b_{role}"] = bias[:, i].reshape(BLOOM_D)
    return mha.AttentionParams(**roles, W_o=theirs.dense.weight.detach().numpy().T,
                               b_o=theirs.dense.bias.detach().numpy())  # fmt: skip


def bloom_decode(theirs, config, x, sizes):
    """BLOOM's attention chunk by chunk with a DynamicCache, its ALiBi tensor and causal
    mask built as ``BloomModel.forward`` builds them (over all keys so far)."""
    cache, outs = hf().DynamicCache(config=config), []
    with torch.no_grad():
        for part in chunks(sizes):
            new = x[:, part]
            mask = hf().create_causal_mask(config, new, None, cache)  # additive, eager
            seen = torch.ones(B, part.stop, dtype=torch.long)  # no padding
            alibi = hf().modeling_bloom.build_alibi_tensor(seen, BLOOM_H, torch.float64)
            out, _ = theirs(new, torch.zeros_like(new), alibi, mask, layer_past=cache)
            outs.append(out)  # residual 0: the attention alone
    return torch.cat(outs, dim=1).numpy()


def mha_alibi_decode(params, x, sizes):
    cache, outs = mha.KVCache(), []
    for part in chunks(sizes):
        new, size = x[:, part], part.stop - part.start
        out, _ = mha.multi_head_attention(
            new, new, new, params, BLOOM_H, mha.causal_mask(size, num_keys=part.stop),
            cache=cache, score_bias=mha.alibi_bias(BLOOM_H, size, num_keys=part.stop),
        )  # fmt: skip
        outs.append(out)
    return np.concatenate(outs, axis=1)


def bloom_hidden() -> torch.Tensor:
    """(B, 7, D) float64 inputs for BLOOM's width."""
    return torch.randn(B, 7, BLOOM_D, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(10))  # fmt: skip


def test_bloom_slopes_are_mha_alibi_slopes():
    """BLOOM's rule in float64 gives mha's slopes for every H up to 16 (two ways of
    rounding a power of two: a few ulps); the float32 slopes BLOOM ships, only to
    float32 precision. If the last assert fails, BLOOM's slopes are float64 now: drop
    the twin."""
    for num_heads in range(1, 17):
        np.testing.assert_allclose(bloom_slopes_float64(num_heads).numpy(),
                                   mha.alibi_slopes(num_heads), rtol=8 * EPS64, atol=0)  # fmt: skip
    shipped = hf().modeling_bloom._get_alibi_slopes(BLOOM_H, "cpu")
    assert shipped.dtype == torch.float32
    gap = np.abs(shipped.double().numpy() / mha.alibi_slopes(BLOOM_H) - 1)
    assert 1e-12 < gap.max() < 1e-6, gap.max()


@pytest.mark.usefixtures("bloom_float64")
def test_bloom_alibi_full_and_cached(bloom_pair):
    """With both twins: the whole sequence at once and a prefill, one-token steps and a
    block through BLOOM's cache equal mha's ALiBi attention and its KVCache."""
    config, theirs, params = bloom_pair
    x = bloom_hidden()
    for sizes in ([7], [3, 1, 1, 2]):
        want = bloom_decode(theirs, config, x, sizes)
        got = mha_alibi_decode(params, x.numpy(), sizes)
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


def test_bloom_as_shipped_agrees_to_float32_only(bloom_pair):
    """Why the twins exist: as shipped (float32 slopes and softmax) BLOOM agrees to
    ~1e-7, not to 1e-12. If this fails because they agree, drop the twins."""
    config, theirs, params = bloom_pair
    x = bloom_hidden()
    gap = np.abs(bloom_decode(theirs, config, x, [7]) - mha_alibi_decode(params, x.numpy(), [7]))
    assert 1e-12 < gap.max() < 1e-5, gap.max()


# --- DeepSeek-V3: multi-head latent attention (chapter 10) --------------------------
#
# Hugging Face's DeepSeek-V3 attention as the outside oracle of mha's multi-head latent
# attention: tiny random configurations in float64, weights copied both ways, outputs
# equal to 1e-12 with and without its cache, plain and absorbed.
#
# ``transformers`` (5.25) keeps three steps in float32 even for float64 inputs; each is
# replaced by a float64 twin here, named where it is done:
#
# 1. ``DeepseekV3RMSNorm`` casts to float32 and back: :class:`Float64RMSNorm` evaluates
#    its formula in float64 (``test_the_float32_steps_are_why_the_twins_exist`` records
#    the ~1e-7 disagreement as shipped);
# 2. ``DeepseekV3RotaryEmbedding`` computes frequencies and angles in float32: the
#    attention takes ``position_embeddings`` as an argument, and :func:`rotary_tables`
#    passes float64 ones built from the same formula;
# 3. eager attention runs its softmax in float32: the configuration asks for
#    ``attn_implementation="sdpa"``, whose softmax stays in float64.
#
# Hugging Face fuses the paper's matrices (``kv_a_proj_with_mqa = [W_dkv | W_kr]``;
# ``q_b_proj`` and ``kv_b_proj`` interleave the two parts of each head):
# :func:`params_from_hf` and :func:`load_into_hf` split and join them.

# Both sides in float64 over sums of ~10 terms: a few 1e-16 (6e-16 seen here).
DS_CLOSE = {"rtol": 1e-12, "atol": 1e-12}
DS_H, DS_D, DS_RQ, DS_RKV, DS_DN, DS_DR, DS_DV = (
    3,
    10,
    6,
    5,
    4,
    6,
    3,
)  # every width different, to catch a swap
DS_B, DS_T = 2, 5
DS_BASE = 10000.0


def ds_config(q_lora_rank, interleave, rope_parameters=None) -> Any:
    return hf().DeepseekV3Config(
        vocab_size=8, hidden_size=DS_D, num_attention_heads=DS_H, num_key_value_heads=DS_H,
        q_lora_rank=q_lora_rank, kv_lora_rank=DS_RKV, qk_nope_head_dim=DS_DN,
        qk_rope_head_dim=DS_DR, v_head_dim=DS_DV, rope_interleave=interleave,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": DS_BASE},
        num_hidden_layers=1, intermediate_size=8, moe_intermediate_size=4,
        n_routed_experts=4, n_group=1, topk_group=1, num_experts_per_tok=1,
        attn_implementation="sdpa",  # twin 3: SDPA's softmax stays in float64
    )  # fmt: skip


class Float64RMSNorm(nn.Module):
    """Twin 1: ``DeepseekV3RMSNorm``'s formula, ``weight * x / sqrt(mean(x^2) + eps)``,
    without its cast to float32."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def ds_attention(q_lora_rank, interleave, seed=0, rope_parameters=None) -> Any:
    """A float64 DeepSeek-V3 attention layer with random weights (its norm weights too:
    Hugging Face starts them at 1) and its float32 RMSNorms replaced by their twins."""
    torch.manual_seed(seed)
    attn = hf().DeepseekV3Attention(ds_config(q_lora_rank, interleave, rope_parameters), 0)
    attn = attn.double().eval()
    with torch.no_grad():
        for norm in (attn.q_a_layernorm, attn.kv_a_layernorm):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
    attn.shipped_norms = (attn.q_a_layernorm, attn.kv_a_layernorm)  # for the record test
    if attn.q_a_layernorm is not None:
        attn.q_a_layernorm = Float64RMSNorm(attn.q_a_layernorm)  # twin 1
    attn.kv_a_layernorm = Float64RMSNorm(attn.kv_a_layernorm)  # twin 1
    return attn


def ds_rotary_tables(positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin 2: the ``(cos, sin)`` that ``DeepseekV3RotaryEmbedding`` returns, ``(DS_B, DS_T, Dr)``
    with the angles repeated over the two halves, computed in float64."""
    inv_freq = 1.0 / DS_BASE ** (torch.arange(0, DS_DR, 2, dtype=torch.float64) / DS_DR)  # (Dr/2,)
    angles = torch.from_numpy(positions).double()[:, None] * inv_freq  # (DS_T, Dr/2)
    table = torch.cat([angles, angles], dim=-1)[None].expand(DS_B, -1, -1)  # (DS_B, DS_T, Dr)
    return table.cos(), table.sin()


def _split_heads(weight: np.ndarray, first: int, second: int) -> tuple[np.ndarray, np.ndarray]:
    """``(H*(a+b), in)``, each head's rows ``[a | b]`` -> ``(in, H*a)`` and ``(in, H*b)``
    (``H`` = ``DS_H``)."""
    per_head = weight.reshape(DS_H, first + second, -1)
    return (per_head[:, :first].reshape(DS_H * first, -1).T,
            per_head[:, first:].reshape(DS_H * second, -1).T)  # fmt: skip


def _join_heads(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_split_heads`."""
    per_head = np.concatenate([a.T.reshape(DS_H, -1, a.shape[0]),
                               b.T.reshape(DS_H, -1, b.shape[0])], axis=1)  # fmt: skip
    return per_head.reshape(-1, a.shape[0])


def params_from_hf(attn: Any, **settings) -> MLAParams:
    """The paper's matrices out of Hugging Face's fused ones, ``(D_in, D_out)``."""
    w = {name: p.detach().numpy() for name, p in attn.named_parameters()}
    query = "q_proj.weight" if attn.q_lora_rank is None else "q_b_proj.weight"
    w_uq, w_qr = _split_heads(w[query], DS_DN, DS_DR)
    w_uk, w_uv = _split_heads(w["kv_b_proj.weight"], DS_DN, DS_DV)
    kv_a = w["kv_a_proj_with_mqa.weight"]  # (Rkv + Dr, DS_D): [latent | RoPE key]
    return MLAParams(
        num_heads=DS_H, qk_nope_head_dim=DS_DN, qk_rope_head_dim=DS_DR, v_head_dim=DS_DV,
        W_dq=w["q_a_proj.weight"].T if attn.q_lora_rank else None,
        q_norm=w["q_a_layernorm.weight"] if attn.q_lora_rank else None,
        W_uq=w_uq, W_qr=w_qr, W_dkv=kv_a[:DS_RKV].T, kv_norm=w["kv_a_layernorm.weight"],
        W_kr=kv_a[DS_RKV:].T, W_uk=w_uk, W_uv=w_uv, W_o=w["o_proj.weight"].T,
        rope_base=DS_BASE, eps=attn.config.rms_norm_eps,
        rope_layout="interleaved" if attn.config.rope_interleave else "rotate_half",
        **settings,
    )  # fmt: skip


def load_into_hf(attn: Any, p: MLAParams) -> None:
    """Copy ``p`` into Hugging Face's fused matrices (the other direction)."""
    fused = {
        "kv_a_proj_with_mqa.weight": np.concatenate([p.W_dkv, p.W_kr], axis=1).T,
        "kv_a_layernorm.weight": p.kv_norm,
        "kv_b_proj.weight": _join_heads(p.W_uk, p.W_uv),
        "o_proj.weight": p.W_o.T,
    }
    if p.q_lora_rank is None:
        fused["q_proj.weight"] = _join_heads(p.W_uq, p.W_qr)
    else:
        fused |= {"q_a_proj.weight": p.W_dq.T, "q_a_layernorm.weight": p.q_norm,
                  "q_b_proj.weight": _join_heads(p.W_uq, p.W_qr)}  # fmt: skip
    parameters = dict(attn.named_parameters())
    assert sorted(parameters) == sorted(fused)  # every weight, once
    with torch.no_grad():
        for name, array in fused.items():
            parameters[name].copy_(torch.from_numpy(np.ascontiguousarray(array)))


def ds_forward(attn, x: np.ndarray, start: int, cache=None) -> np.ndarray:
    """Hugging Face's attention over ds_tokens ``start .. start + DS_T - 1`` of ``x``'s length,
    after ``start`` cached ones, with our float64 rotary tables and a causal mask."""
    length = x.shape[1]
    mask = torch.from_numpy(causal_mask(length, num_keys=start + length))  # (DS_T, S), True = see
    with torch.no_grad():
        out, _ = attn(torch.from_numpy(x), position_embeddings=ds_rotary_tables(
            np.arange(start, start + length)), attention_mask=mask.expand(DS_B, 1, -1, -1),
            cache=cache)  # fmt: skip
    return out.numpy()


def ds_tokens(seed=1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(DS_B, DS_T, DS_D))


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("q_lora_rank", [None, DS_RQ])
def test_mla_equals_hugging_face(q_lora_rank, interleave):
    """Hugging Face's weights into mha (plain, absorbed, the torch module), then mha's
    own seeded weights into Hugging Face: equal both ways."""
    attn, x = ds_attention(q_lora_rank, interleave), ds_tokens()
    want = ds_forward(attn, x, 0)
    p = params_from_hf(attn)
    for absorbed in (False, True):
        np.testing.assert_allclose(multi_head_latent_attention(x, p, absorbed=absorbed)[0],
                                   want, **DS_CLOSE)  # fmt: skip
        got, _ = module_from_params(p)(torch.from_numpy(x), absorbed=absorbed)
        np.testing.assert_allclose(got.detach().numpy(), want, **DS_CLOSE)
    ours = MLAParams.init(DS_D, DS_H, kv_lora_rank=DS_RKV, qk_nope_head_dim=DS_DN,
                          qk_rope_head_dim=DS_DR, v_head_dim=DS_DV, q_lora_rank=q_lora_rank, seed=3,
                          rope_layout=p.rope_layout)  # fmt: skip
    load_into_hf(attn, ours)
    np.testing.assert_allclose(ds_forward(attn, x, 0), multi_head_latent_attention(x, ours)[0],
                               **DS_CLOSE)  # fmt: skip


@pytest.mark.parametrize("interleave", [True, False])
def test_mla_cache_equals_hugging_face_cache_over_decode_steps(interleave):
    """A prompt of two ds_tokens, then three decode steps, through Hugging Face's
    DynamicCache and mha's latent caches (NumPy plain, NumPy absorbed, torch)."""
    attn, x = ds_attention(DS_RQ, interleave, seed=1), ds_tokens(seed=2)
    p = params_from_hf(attn)
    module = module_from_params(p)
    hf_cache, plain, absorbed, torch_cache = (
        hf().DynamicCache(),
        MLACache(),
        MLACache(),
        TorchCache(),
    )
    full = ds_forward(attn, x, 0)  # no cache: the whole sequence at once
    start = 0
    for size in (2, 1, 1, 1):
        new = x[:, start : start + size]
        want = ds_forward(attn, new, start, cache=hf_cache)
        np.testing.assert_allclose(want, full[:, start : start + size], **DS_CLOSE)
        np.testing.assert_allclose(multi_head_latent_attention(new, p, cache=plain)[0], want,
                                   **DS_CLOSE)  # fmt: skip
        np.testing.assert_allclose(
            multi_head_latent_attention(new, p, cache=absorbed, absorbed=True)[0], want, **DS_CLOSE
        )
        got, _ = module(torch.from_numpy(new), cache=torch_cache, absorbed=True)
        np.testing.assert_allclose(got.detach().numpy(), want, **DS_CLOSE)
        start += size
    # Hugging Face caches the same two things, as one-head "keys" and "values".
    layer = hf_cache.layers[0]
    assert tuple(layer.keys.shape) == (DS_B, 1, DS_T, DS_RKV) and tuple(layer.values.shape) == (
        DS_B,
        1,
        DS_T,
        DS_DR,
    )
    np.testing.assert_allclose(layer.keys[:, 0].numpy(), plain.latent, **DS_CLOSE)
    # Its interleaved RoPE turns adjacent pairs like ours but writes the turned pairs
    # back as two halves (evens, then odds); rotate_half keeps the order.
    order = np.r_[0:DS_DR:2, 1:DS_DR:2] if interleave else np.arange(DS_DR)
    np.testing.assert_allclose(layer.values[:, 0].numpy(), plain.k_rope[..., order], **DS_CLOSE)


def test_yarn_softmax_scale_equals_hugging_faces():
    """DeepSeek-V3's YaRN settings (factor 40, mscale_all_dim 1): Hugging Face's
    attention scale is mla_softmax_scale's, and with it the outputs agree."""
    yarn = {"rope_type": "yarn", "rope_theta": DS_BASE, "factor": 40.0, "mscale": 1.0,
            "mscale_all_dim": 1.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
            "beta_slow": 1.0}  # fmt: skip
    attn, x = ds_attention(DS_RQ, True, rope_parameters=yarn), ds_tokens()
    scale = mla_softmax_scale(DS_DN, DS_DR, yarn_factor=40.0, mscale_all_dim=1.0)
    assert math.isclose(attn.scaling, scale, rel_tol=1e-15)
    assert not math.isclose(scale, 1 / math.sqrt(DS_DN + DS_DR))  # YaRN changed it
    p = params_from_hf(attn, softmax_scale=scale)
    np.testing.assert_allclose(multi_head_latent_attention(x, p, absorbed=True)[0],
                               ds_forward(attn, x, 0), **DS_CLOSE)  # fmt: skip


def test_the_float32_steps_are_why_the_twins_exist():
    """As shipped, Hugging Face's RMSNorm and rotary tables are float32: with them, the
    agreement stops near 1e-7. If this starts failing, Hugging Face computes in float64
    now and the twins can go."""
    attn, x = ds_attention(DS_RQ, True), ds_tokens()
    want = multi_head_latent_attention(x, params_from_hf(attn))[0]
    attn.q_a_layernorm, attn.kv_a_layernorm = attn.shipped_norms
    error = np.max(np.abs(ds_forward(attn, x, 0) - want))
    assert 1e-10 < error < 1e-5, error
    cos, _ = hf().DeepseekV3RotaryEmbedding(attn.config)(torch.from_numpy(x),
                                                    torch.arange(DS_T)[None])  # fmt: skip
    table_error = (cos[0] - ds_rotary_tables(np.arange(DS_T))[0][0]).abs().max().item()
    assert 1e-10 < table_error < 1e-6, table_error

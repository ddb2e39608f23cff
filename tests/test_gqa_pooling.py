"""mha.gqa_pooling.mean_pool_kv_heads: multi-head attention turned into grouped-query
attention by averaging the key and value heads of each group (Ainslie et al., 2023)."""

from __future__ import annotations

import copy

import pytest
import torch

import mha
from mha.gqa_pooling import mean_pool_all_kv_heads, mean_pool_kv_heads, relative_output_change
from mha.modules import MultiHeadAttention
from mha.transformer import Transformer
from mha.translator import CHECKPOINT, Translator, generate_corpus, load_pretrained, read_metadata

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CLOSE = {"rtol": 1e-12, "atol": 1e-12}


def module(d_model=16, num_heads=4, num_kv_heads=None, bias=True, seed=0):
    torch.manual_seed(seed)
    m = MultiHeadAttention(d_model, num_heads, bias=bias, num_kv_heads=num_kv_heads)
    with torch.no_grad():  # non-zero biases, so that pooling them is tested too
        for linear in (m.W_q, m.W_k, m.W_v, m.W_o):
            if linear.bias is not None:
                linear.bias.normal_()
    return m.double().eval()


def inputs(batch=2, length=5, d_model=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, d_model, dtype=torch.float64, generator=g)
    return x, torch.from_numpy(mha.causal_mask(length))


def head_rows(linear, head, head_dim):
    """Head ``head``'s rows of a projection's weight and bias (PyTorch's (out, in))."""
    rows = slice(head * head_dim, (head + 1) * head_dim)
    return linear.weight[rows], (None if linear.bias is None else linear.bias[rows])


@pytest.mark.parametrize("need_weights", [True, False])
def test_as_many_kv_heads_is_an_exact_copy(need_weights):
    m = module()
    same = mean_pool_kv_heads(m, 4)
    assert same is not m and same.num_kv_heads == 4
    for name, tensor in m.state_dict().items():
        assert torch.equal(same.state_dict()[name], tensor), name
    x, mask = inputs()
    got, _ = same(x, x, x, mask=mask, need_weights=need_weights)
    want, _ = m(x, x, x, mask=mask, need_weights=need_weights)
    assert torch.equal(got, want)  # the same weights through the same code path


def test_one_kv_head_is_the_mean_of_all_heads():
    m = module()
    mqa = mean_pool_kv_heads(m, 1)
    assert mqa.W_k.weight.shape == mqa.W_v.weight.shape == (4, 16)  # one head of Dh = 4
    for name in ("W_k", "W_v"):
        heads = [head_rows(getattr(m, name), h, 4) for h in range(4)]
        weight = sum(w for w, _ in heads) / 4
        bias = sum(b for _, b in heads) / 4
        torch.testing.assert_close(getattr(mqa, name).weight, weight, **CLOSE)
        torch.testing.assert_close(getattr(mqa, name).bias, bias, **CLOSE)
    # copied unchanged
    assert torch.equal(mqa.W_q.weight, m.W_q.weight) and torch.equal(mqa.W_o.bias, m.W_o.bias)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_pooled_module_equals_multi_head_attention_with_the_pooled_heads_repeated(
    need_weights, num_kv_heads
):
    """Oracle without grouping: a multi-head module whose query heads each get a copy of
    their group's averaged key/value head computes what the grouped module computes."""
    m = module(num_heads=4)
    grouped = mean_pool_kv_heads(m, num_kv_heads)
    group = 4 // num_kv_heads
    spread = copy.deepcopy(m)
    with torch.no_grad():
        for name in ("W_k", "W_v"):
            for h in range(4):
                w, b = head_rows(getattr(grouped, name), h // group, 4)
                rows = slice(h * 4, (h + 1) * 4)
                getattr(spread, name).weight[rows] = w
                getattr(spread, name).bias[rows] = b
    x, mask = inputs()
    got, got_w = grouped(x, x, x, mask=mask, need_weights=need_weights)
    want, want_w = spread(x, x, x, mask=mask, need_weights=need_weights)
    torch.testing.assert_close(got, want, **CLOSE)
    if need_weights:
        torch.testing.assert_close(got_w, want_w, **CLOSE)


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_groups_with_identical_heads_lose_nothing(num_kv_heads):
    """Where every head of a group already had the same key and value weights, the
    mean is that head: the output does not move."""
    m = module(d_model=24, num_heads=8)
    group = 8 // num_kv_heads
    with torch.no_grad():
        for name in ("W_k", "W_v"):
            linear = getattr(m, name)
            for h in range(8):
                first = (h // group) * group  # the group's first head
                linear.weight[h * 3 : (h + 1) * 3] = linear.weight[first * 3 : (first + 1) * 3]
                linear.bias[h * 3 : (h + 1) * 3] = linear.bias[first * 3 : (first + 1) * 3]
    grouped = mean_pool_kv_heads(m, num_kv_heads)
    x, mask = inputs(d_model=24)
    for need_weights in (True, False):
        torch.testing.assert_close(
            grouped(x, x, x, mask=mask, need_weights=need_weights)[0],
            m(x, x, x, mask=mask, need_weights=need_weights)[0],
            **CLOSE,
        )
    assert relative_output_change(m, grouped, x, mask=mask) < 1e-14


def test_pooling_in_two_steps_equals_pooling_at_once():
    m = module(d_model=32, num_heads=8)
    at_once = mean_pool_kv_heads(m, 2)
    in_steps = mean_pool_kv_heads(mean_pool_kv_heads(m, 4), 2)
    for name in ("W_k", "W_v"):
        torch.testing.assert_close(
            getattr(in_steps, name).weight, getattr(at_once, name).weight, **CLOSE
        )
        torch.testing.assert_close(
            getattr(in_steps, name).bias, getattr(at_once, name).bias, **CLOSE
        )


def test_relative_output_change_is_the_norm_ratio():
    m = module()
    mqa = mean_pool_kv_heads(m, 1)
    x, mask = inputs()
    with torch.no_grad():
        before = m(x, x, x, mask=mask)[0]
        after = mqa(x, x, x, mask=mask)[0]
    expected = float(torch.sqrt(((after - before) ** 2).sum() / (before**2).sum()))
    change = relative_output_change(m, mqa, x, mask=mask)
    assert change == pytest.approx(expected, rel=1e-12)
    assert change > 0.01  # random heads differ: their mean is a real approximation
    # exact: pooling 4 heads into 4 copies them, and the copy runs the same computation
    assert relative_output_change(m, mean_pool_kv_heads(m, 4), x, mask=mask) == 0.0
    # Cross-attention: key (and by default value) from another sequence.
    memory, _ = inputs(length=7, seed=3)
    cross = relative_output_change(m, mqa, x, memory)
    with torch.no_grad():
        before, after = m(x, memory, memory)[0], mqa(x, memory, memory)[0]
    assert cross == pytest.approx(
        float(torch.linalg.vector_norm(after - before) / torch.linalg.vector_norm(before)),
        rel=1e-12,
    )


def test_the_copy_keeps_dtype_bias_dropout_and_mode():
    m = MultiHeadAttention(8, 4, dropout=0.25, bias=False).train()
    grouped = mean_pool_kv_heads(m, 2)
    assert grouped.training and grouped.dropout == 0.25 and not grouped.bias
    assert grouped.W_k.weight.dtype == torch.float32
    assert mean_pool_kv_heads(module(), 2).W_v.weight.dtype == torch.float64
    assert mean_pool_kv_heads(module(), 2).training is False


def test_bad_arguments_are_named():
    m = module()  # 4 heads
    for bad in (3, 8, 0, 2.0, True):
        with pytest.raises(ValueError, match="num_kv_heads"):
            mean_pool_kv_heads(m, bad)
    with pytest.raises(ValueError, match="num_kv_heads=2 must divide the module's 1"):
        mean_pool_kv_heads(module(num_kv_heads=1), 2)
    with pytest.raises(ValueError, match="MultiHeadAttention"):
        mean_pool_kv_heads(torch.nn.MultiheadAttention(16, 4), 2)
    with pytest.raises(ValueError, match="contains no MultiHeadAttention"):
        mean_pool_all_kv_heads(torch.nn.Linear(4, 4), 1)


# ------------------------------------------------------------- a whole Transformer


def small_transformer():
    torch.manual_seed(0)
    return Transformer(11, 13, d_model=16, num_heads=4, num_encoder_layers=2,
                       num_decoder_layers=2, d_ff=32).double().eval()  # fmt: skip


def test_every_attention_of_a_transformer_is_pooled_in_a_copy():
    model = small_transformer()
    grouped = mean_pool_all_kv_heads(model, 1)
    attentions = [m for m in grouped.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attentions) == 2 + 2 * 2  # encoder self; decoder self and cross
    assert all(a.num_kv_heads == 1 for a in attentions)
    assert all(m.num_kv_heads == 4 for m in model.modules() if isinstance(m, MultiHeadAttention))
    src = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]])
    tgt = torch.tensor([[1, 5, 6], [1, 7, 0]])
    same = mean_pool_all_kv_heads(model, 4)
    assert torch.equal(same(src, tgt), model(src, tgt))  # copied weights, same code path
    assert not torch.allclose(grouped(src, tgt), model(src, tgt))
    # The grouped copy decodes with a cache just as well: the cache holds its one kv head.
    memory, _ = grouped.encode(src)
    cache = grouped.new_cache()
    steps = [grouped.decode(tgt[:, : t + 1], memory, src, cache=cache)[0] for t in range(3)]
    torch.testing.assert_close(
        torch.cat(steps, dim=1), grouped.decode(tgt, memory, src)[0], **CLOSE
    )
    assert cache[0][0].k_heads.shape == (2, 1, 3, 4)  # (B, Hkv, S, Dh)


@pytest.mark.slow
def test_the_shipped_translator_with_as_many_kv_heads_translates_the_same():
    translator = load_pretrained()
    heads = translator.model.num_heads
    same = Translator(
        mean_pool_all_kv_heads(translator.model, heads), translator.src_vocab, translator.tgt_vocab
    )
    settings = read_metadata(CHECKPOINT)["extra"]["train_config"]
    corpus = generate_corpus(
        settings["seed"], num_train=settings["num_train"],
        num_heldout=settings["num_heldout"], num_compositional=settings["num_compositional"],
    )  # fmt: skip
    sentences = [list(e.source) for e in corpus.heldout[:200]]
    assert same.translate(sentences) == translator.translate(sentences)

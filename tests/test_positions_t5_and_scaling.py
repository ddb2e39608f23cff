"""T5's learned bias as a fifth position scheme, and a RoPE model read past its
training length: scaled frequencies (``rope_scaling=``) and a sliding window with
attention sinks (``window=``, ``num_sinks=``), evaluation only.

Oracles: the specification's ``mha.t5_relative_bias`` of the model's own table, the
NoPE model with the same seed (a zero table), the full decoder pass against the cached
one, finite differences (``gradcheck``) for the table's gradient, RoPE's angles
(``(s p) (theta / s) = p theta``), ``W_q`` scaled by ``f^2`` for the attention factor,
and which predictions a changed token may reach through a window.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

import mha
from mha.modules import MultiHeadAttention
from mha.rope_scaling_torch import ScaledRope, rope_default, rope_linear, rope_yarn
from mha.transformer import POSITION_SCHEMES, T5_MAX_DISTANCE, T5_NUM_BUCKETS, Transformer
from mha.translator.lm_model import CausalLM

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CLOSE = {"rtol": 1e-12, "atol": 1e-12}
TOKENS = torch.tensor([[1, 5, 9, 7, 4, 6, 8, 11, 3, 12] * 4])  # (1, 40): past the exact buckets


def make_lm(scheme: str, num_layers: int = 2, seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    return CausalLM(30, d_model=16, num_heads=4, num_layers=num_layers, d_ff=32,
                    position_scheme=scheme, max_len=64).double().eval()  # fmt: skip


def make_transformer(seed: int = 7) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(11, 13, d_model=12, num_heads=3, num_encoder_layers=2,
                       num_decoder_layers=2, d_ff=24, position_scheme="t5").double().eval()


def record_self_attention(layers, name: str = "score_bias") -> list:
    """The ``name`` keyword each layer's self-attention receives, in call order."""
    seen: list = []
    for layer in layers:
        layer.self_attn.register_forward_pre_hook(
            lambda _m, _a, kw: seen.append(kw.get(name)), with_kwargs=True
        )
    return seen


# ================================================================ the "t5" scheme


def test_t5_is_a_scheme_with_t5s_defaults_and_one_table_per_stack():
    assert "t5" in POSITION_SCHEMES and (T5_NUM_BUCKETS, T5_MAX_DISTANCE) == (32, 128)
    lm = make_lm("t5")
    assert lm.relative_bias_causal.shape == (32, 4) and lm.relative_bias_bidirectional is None
    assert [n for n, _ in lm.named_parameters() if "relative" in n] == ["relative_bias_causal"]
    model = make_transformer()
    assert model.relative_bias_causal.shape == model.relative_bias_bidirectional.shape == (32, 3)
    # as Hugging Face initialises T5's table: N(0, d_model**-0.5), not zeros
    std = make_lm("t5", seed=1).relative_bias_causal.std().item()
    assert 0.5 * 16**-0.5 < std < 1.5 * 16**-0.5
    for scheme in ("none", "rope", "alibi"):
        assert make_lm(scheme).relative_bias_causal is None


def test_t5_leaves_the_other_weights_as_every_scheme_has_them():
    """The table is built last: the same seed gives every other weight the values it
    gives under NoPE; and with a zero table the model is NoPE (a zero bias)."""
    t5, nope = make_lm("t5"), make_lm("none")
    state = t5.state_dict()
    assert state.pop("relative_bias_causal").shape == (32, 4)
    assert state.keys() == nope.state_dict().keys()
    assert all(torch.equal(v, nope.state_dict()[k]) for k, v in state.items())  # copies
    with torch.no_grad():
        assert (t5(TOKENS) - nope(TOKENS)).abs().max() > 1e-3
        t5.relative_bias_causal.zero_()
        torch.testing.assert_close(t5(TOKENS), nope(TOKENS), **CLOSE)


def test_the_lm_adds_the_specifications_causal_bias_of_its_table_in_every_layer():
    model = make_lm("t5")
    seen = record_self_attention(model.layers)
    model(TOKENS)
    table = model.relative_bias_causal.detach().numpy()
    expected = mha.t5_relative_bias(table, 40, bidirectional=False, max_distance=128)
    assert len(seen) == 2 and seen[0] is seen[1]  # one bias, shared by the layers
    np.testing.assert_allclose(seen[0].detach().numpy(), expected, **CLOSE)
    assert len(np.unique(expected[0])) > 17  # log buckets reached, beyond the 16 exact ones


def test_the_encoder_adds_the_bidirectional_bias_and_the_decoder_the_causal_one():
    """Both with a cache: the decoder's new positions are the last of all."""
    model = make_transformer()
    src = torch.arange(1, 31)[None] % 10 + 1  # (1, 30)
    tgt = torch.arange(1, 26)[None] % 12 + 1  # (1, 25)
    encoder_seen = record_self_attention(model.encoder_layers)
    decoder_seen = record_self_attention(model.decoder_layers)
    memory, _ = model.encode(src)
    cache = model.new_cache()
    model.decode(tgt[:, :20], memory, src, cache=cache)
    model.decode(tgt, memory, src, cache=cache)  # positions 20..24 of 25
    encoder = model.relative_bias_bidirectional.detach().numpy()
    decoder = model.relative_bias_causal.detach().numpy()
    np.testing.assert_allclose(encoder_seen[0].detach().numpy(),
                               mha.t5_relative_bias(encoder, 30), **CLOSE)  # fmt: skip
    np.testing.assert_allclose(decoder_seen[0].detach().numpy(),
                               mha.t5_relative_bias(decoder, 20, bidirectional=False), **CLOSE)
    np.testing.assert_allclose(decoder_seen[2].detach().numpy(),
                               mha.t5_relative_bias(decoder, 5, 25, bidirectional=False), **CLOSE)


def test_cached_decoding_with_t5_equals_the_full_pass_past_the_exact_buckets():
    model = make_transformer()
    src = torch.tensor([[3, 4, 5, 6, 7, 8, 0, 0]])  # padded
    tgt = torch.arange(1, 41)[None] % 12 + 1  # (1, 40)
    memory, _ = model.encode(src)
    full, _, _ = model.decode(tgt, memory, src)
    cache, steps = model.new_cache(), []
    for end in (1, 2, 17, 18, 33, 40):  # single steps and blocks
        steps.append(model.decode(tgt[:, :end], memory, src, cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **CLOSE)


def test_the_tables_gradient_is_the_finite_difference_one():
    """Through the fused attention (a float attn_mask) and the bucket lookup."""
    torch.manual_seed(0)
    model = CausalLM(20, d_model=8, num_heads=2, num_layers=2, d_ff=16,
                     position_scheme="t5").double()  # fmt: skip
    tokens = torch.tensor([[1, 5, 9, 7, 4, 6, 8, 11, 3, 12, 2, 19] * 2])  # (1, 24)

    def loss(table):
        logits = functional_call(model, {"relative_bias_causal": table}, (tokens,))
        return F.cross_entropy(logits[0, :-1], tokens[0, 1:])

    table = model.relative_bias_causal.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(loss, (table,), eps=1e-6, atol=1e-8)
    (grad,) = torch.autograd.grad(loss(table), table)
    used = np.unique(mha.t5_relative_position_bucket(-np.arange(24), bidirectional=False))
    assert (grad[used].abs().sum(dim=1) > 0).all()  # every bucket in use learns...
    unused = np.setdiff1d(np.arange(32), used)
    assert len(unused) > 0 and not grad[unused].any()  # ...and no other (exact zeros)


def test_a_transformer_and_a_causal_lm_with_t5_train_a_step():
    torch.manual_seed(0)
    model = Transformer(11, 13, d_model=12, num_heads=3, d_ff=24, position_scheme="t5")
    lm = CausalLM(30, d_model=16, num_heads=4, num_layers=2, d_ff=32, position_scheme="t5")
    src, tgt = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]]), torch.tensor([[1, 5, 6, 7, 2]] * 2)
    for net, run in ((model, lambda: model(src, tgt[:, :-1])), (lm, lambda: lm(TOKENS))):
        net.train()
        before = {n: p.detach().clone() for n, p in net.named_parameters() if "relative" in n}
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
        logits = run()
        target = tgt[:, 1:] if net is model else TOKENS[:, 1:]
        loss = F.cross_entropy(logits[:, : target.shape[1]].flatten(0, 1), target.flatten())
        loss.backward()
        optimizer.step()
        assert before and all(
            (p.detach() - before[n]).abs().max() > 1e-4
            for n, p in net.named_parameters() if n in before
        )  # fmt: skip


# ============================================ RoPE past its length, without training


def test_scaled_rope_with_the_trained_frequencies_is_the_plain_model():
    """rope_default's frequencies are computed by the same function apply_rope uses,
    and a factor of 1 multiplies nothing: the same computation, exact."""
    model = make_lm("rope")
    with torch.no_grad():
        plain = model(TOKENS)
        assert torch.equal(model(TOKENS, rope_scaling=rope_default(4)), plain)
        assert (model(TOKENS, rope_scaling=rope_linear(4, 2.0)) - plain).abs().max() > 1e-3


def test_every_layer_gets_the_scaling():
    model = make_lm("rope")
    seen = record_self_attention(model.layers, "rope_scaling")
    scaled = rope_yarn(4, 4.0, 16)
    model(TOKENS, rope_scaling=scaled)
    assert len(seen) == 2 and all(s is scaled for s in seen)


@pytest.mark.parametrize("factor", [2.0, 4.0, 3.0])
def test_position_interpolation_at_s_times_p_is_rope_at_p(factor):
    """Linear interpolation divides every frequency by s: queries and keys at positions
    s*p turn as RoPE's at p, so attention gives the same output. For a power of two
    both sides compute the same angles (exact); for s = 3 they agree to rounding."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 2).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    mask = mha.masks_torch.causal_mask(7)
    p = torch.arange(3, 10)
    for need_weights in (True, False):
        plain, _ = attention(x, x, x, mask, rope_positions=p, need_weights=need_weights)
        interpolated, _ = attention(x, x, x, mask, need_weights=need_weights,
                                    rope_positions=(factor * p).long(),
                                    rope_scaling=rope_linear(8, factor))  # fmt: skip
        if factor in (2.0, 4.0):
            assert torch.equal(interpolated, plain)
        else:
            torch.testing.assert_close(interpolated, plain, **CLOSE)
        unscaled, _ = attention(x, x, x, mask, rope_positions=(factor * p).long())
        assert (unscaled - plain).abs().max() > 1e-3


def test_the_attention_factor_multiplies_the_scores_by_its_square():
    """YaRN's factor f on queries and keys is f^2 on the scores: the model with
    (trained frequencies, f) is the model whose W_q and b_q are multiplied by f^2."""
    model, sharper = make_lm("rope"), make_lm("rope")
    f = 1.3
    with torch.no_grad():
        for layer in sharper.layers:
            layer.self_attn.W_q.weight.mul_(f**2)
            layer.self_attn.W_q.bias.mul_(f**2)
        scaled = model(TOKENS, rope_scaling=ScaledRope(rope_default(4).inv_freq, f))
        torch.testing.assert_close(scaled, sharper(TOKENS), **CLOSE)
        assert (scaled - model(TOKENS)).abs().max() > 1e-3


def test_rope_scaling_errors():
    tokens = TOKENS[:, :5]
    with pytest.raises(ValueError, match="rope_scaling needs position_scheme 'rope', got 'alibi'"):
        make_lm("alibi")(tokens, rope_scaling=rope_linear(4, 2.0))
    model = make_lm("rope")
    with pytest.raises(ValueError, match=r"attention_factor must be a finite number > 0, got 0"):
        model(tokens, rope_scaling=(rope_default(4).inv_freq, 0.0))
    with pytest.raises(ValueError, match=r"inv_freq must have shape \(Dh/2,\) = \(2,\)"):
        model(tokens, rope_scaling=rope_linear(8, 2.0))
    with pytest.raises(ValueError, match="must be a pair .* got Tensor"):
        model(tokens, rope_scaling=rope_default(4).inv_freq)
    attention = MultiHeadAttention(8, 2).double()
    x = torch.zeros(1, 3, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="given with rope_positions, got ScaledRope and no rope"):
        attention(x, x, x, rope_scaling=rope_default(4))


# ========================================= a sliding window with attention sinks


@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5", "none"])
def test_a_window_that_covers_everything_is_full_attention(scheme):
    model = make_lm(scheme)
    with torch.no_grad():
        full = model(TOKENS)
        for window, sinks in ((40, 0), (40, 4), (100, 0)):
            # the same mask, built another way: the same computation, exact
            assert torch.equal(model(TOKENS, window=window, num_sinks=sinks), full)
        narrow = model(TOKENS, window=8)
        with_sinks = model(TOKENS, window=8, num_sinks=4)
    torch.testing.assert_close(narrow[:, :8], full[:, :8], **CLOSE)  # none has more keys
    assert (narrow[:, 8:] - full[:, 8:]).abs().amax(dim=-1).min() > 1e-6  # every later one
    assert (with_sinks[:, 12:] - narrow[:, 12:]).abs().amax(dim=-1).min() > 1e-6


@pytest.mark.parametrize("scheme", ["rope", "t5"])
def test_one_layer_sees_its_window_and_its_sinks_only(scheme):
    """One layer, window 3, sinks 2: a token at position 6 reaches the predictions at
    6, 7, 8 and none after; a sink (position 1) reaches every one."""
    model = make_lm(scheme, num_layers=1)
    changed_far, changed_sink = TOKENS.clone(), TOKENS.clone()
    changed_far[0, 6] = changed_sink[0, 1] = 25
    with torch.no_grad():
        base, far, sink = (model(t, window=3, num_sinks=2)
                           for t in (TOKENS, changed_far, changed_sink))  # fmt: skip
    gap_far = (far - base).abs().amax(dim=-1)[0]  # (T,)
    gap_sink = (sink - base).abs().amax(dim=-1)[0]
    # a blocked key weighs exactly 0 (exp(-inf)): exact zeros where it cannot reach
    assert torch.equal(gap_far[:6], torch.zeros(6)) and torch.equal(gap_far[9:], torch.zeros(31))
    assert (gap_far[6:9] > 1e-6).all() and (gap_sink[1:] > 1e-6).all()


def test_window_errors():
    model = make_lm("alibi")
    with pytest.raises(ValueError, match=r"num_sinks=2 needs a window"):
        model(TOKENS, num_sinks=2)
    with pytest.raises(ValueError, match="window"):
        model(TOKENS, window=0)
    with pytest.raises(ValueError, match="num_sinks"):
        model(TOKENS, window=4, num_sinks=-1)

"""EncoderLayer / DecoderLayer / FeedForward == PyTorch's layers with copied weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mha import convert
from mha.layers import DecoderLayer, EncoderLayer, FeedForward
from mha.masks import (
    causal_mask,
    padding_mask,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


TOL = {torch.float64: 1e-10, torch.float32: 1e-5}
D, H, D_FF = 16, 4, 24
EPS = 1e-6  # not PyTorch's default 1e-5, so a forgotten eps shows up


def randomise(layer: nn.Module, seed: int) -> nn.Module:
    """Random weights everywhere: LayerNorm starts at (1, 0) and biases at 0 in torch,
    which would hide a norm or bias that was not copied."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in layer.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
            if name.startswith("norm") and name.endswith("weight"):
                param.add_(1.0)  # LayerNorm gains around 1
    return layer


def masks_for(kind: str, lengths: list[int], T: int) -> tuple[torch.Tensor | None, dict]:
    """Our bool mask (True = may attend) and torch's keyword masks (True = blocked)."""
    if kind == "none":
        return None, {"mask": None, "padding": None}
    padding = padding_mask(lengths=np.array(lengths), max_len=T)  # (B, 1, 1, T)
    kpm = torch.from_numpy(to_torch_key_padding_mask(padding))  # (B, T)
    if kind == "padding":
        return torch.from_numpy(padding), {"mask": None, "padding": kpm}
    causal = causal_mask(T)  # (T, T)
    ours = torch.from_numpy(padding & causal)  # (B, 1, T, T)
    return ours, {"mask": torch.from_numpy(to_torch_attn_mask(causal)), "padding": kpm}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal+padding"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("seed", [0, 1])
def test_encoder_layer_matches_torch(seed: int, norm_first: bool, mask_kind: str, dtype) -> None:
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(
        D, H, D_FF, dropout=0.1, batch_first=True, norm_first=norm_first, layer_norm_eps=EPS
    )
    layer = randomise(layer, seed).to(dtype).eval()
    ours = convert.encoder_layer_from_torch(layer)
    assert not ours.training and ours.norm_first is norm_first
    assert ours.norm1.eps == ours.norm2.eps == EPS
    assert ours.self_attn.dropout == 0.1

    B, T = 3, 6
    x = torch.randn(B, T, D, dtype=dtype)
    mask, torch_masks = masks_for(mask_kind, [6, 4, 1], T)
    # With autograd on, torch takes its plain (not fused "fast path") implementation.
    expected = layer(x, src_mask=torch_masks["mask"], src_key_padding_mask=torch_masks["padding"])
    got, no_weights = ours(x, mask)
    got_slow, weights = ours(x, mask, need_weights=True)
    tol = TOL[dtype]
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    torch.testing.assert_close(got_slow, expected, rtol=tol, atol=tol)
    assert no_weights is None and weights.shape == (B, H, T, T)
    if mask is not None:
        assert torch.all(weights.masked_select(~mask.expand_as(weights)) == 0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal+padding"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("seed", [0, 1])
def test_decoder_layer_matches_torch(seed: int, norm_first: bool, mask_kind: str, dtype) -> None:
    torch.manual_seed(seed)
    layer = nn.TransformerDecoderLayer(
        D, H, D_FF, dropout=0.1, batch_first=True, norm_first=norm_first, layer_norm_eps=EPS
    )
    layer = randomise(layer, seed).to(dtype).eval()
    ours = convert.decoder_layer_from_torch(layer)
    assert not ours.training and ours.norm_first is norm_first
    assert ours.norm1.eps == ours.norm2.eps == ours.norm3.eps == EPS

    B, T, S = 3, 5, 7  # cross-attention with S != T
    x = torch.randn(B, T, D, dtype=dtype)
    memory = torch.randn(B, S, D, dtype=dtype)
    self_mask, torch_self = masks_for(mask_kind, [5, 3, 1], T)
    if mask_kind == "none":
        cross_mask, memory_kpm = None, None
    else:
        cross_padding = padding_mask(lengths=np.array([7, 2, 5]), max_len=S)  # (B, 1, 1, S)
        cross_mask = torch.from_numpy(cross_padding)
        memory_kpm = torch.from_numpy(to_torch_key_padding_mask(cross_padding))
    expected = layer(
        x,
        memory,
        tgt_mask=torch_self["mask"],
        tgt_key_padding_mask=torch_self["padding"],
        memory_key_padding_mask=memory_kpm,
    )
    got, none_self, none_cross = ours(x, memory, self_mask, cross_mask)
    got_slow, self_weights, cross_weights = ours(
        x, memory, self_mask, cross_mask, need_weights=True
    )
    tol = TOL[dtype]
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    torch.testing.assert_close(got_slow, expected, rtol=tol, atol=tol)
    assert none_self is None and none_cross is None
    assert self_weights.shape == (B, H, T, T) and cross_weights.shape == (B, H, T, S)
    if cross_mask is not None:
        blocked = ~cross_mask.expand_as(cross_weights)
        assert torch.all(cross_weights.masked_select(blocked) == 0)


class FixedDropout(nn.Module):
    """A deterministic stand-in for ``nn.Dropout``: zeroes a fixed pattern of entries
    (one per seed and input shape) and scales the rest by 1 / (1 - p). Each dropout of a
    layer gets its own seed, so a dropout moved, removed or swapped changes the output."""

    def __init__(self, p: float, seed: int) -> None:
        super().__init__()
        self.p, self.seed = p, seed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        generator = torch.Generator().manual_seed(self.seed)
        keep = torch.rand(x.shape, generator=generator) >= self.p
        return x * keep.to(x.dtype) / (1 - self.p)


# Which dropout is which: ours -> PyTorch's name for the same place in the layer.
DROPOUT_ROLES = {"dropout1": "dropout1", "dropout2": "dropout2", "dropout3": "dropout3",
                 "feed_forward.dropout": "dropout"}  # fmt: skip


def replace_dropouts(layer: nn.Module, names: list[str]) -> None:
    """Swap every nn.Dropout of ``layer`` (all must be listed in ``names``) for a
    FixedDropout whose seed is the name's index, and switch attention dropout off (it
    is random inside the fused kernels)."""
    found = {name for name, m in layer.named_modules() if isinstance(m, nn.Dropout)}
    assert found == {n for n in names if n in found} and found, found
    for name in found:
        parent_name, _, attr = name.rpartition(".")
        parent = layer.get_submodule(parent_name)
        setattr(parent, attr, FixedDropout(getattr(parent, attr).p, seed=names.index(name)))
    for attention in ("self_attn", "cross_attn", "multihead_attn"):
        if hasattr(layer, attention):
            getattr(layer, attention).dropout = 0.0
    assert not any(isinstance(m, nn.Dropout) for m in layer.modules())


@pytest.mark.parametrize("mask_kind", ["none", "causal+padding"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_encoder_layer_dropouts_sit_where_torch_has_them(norm_first, mask_kind) -> None:
    """Training mode: every other layer test runs in eval mode, where dropout is the
    identity and its position cannot matter."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        D, H, D_FF, dropout=0.3, batch_first=True, norm_first=norm_first, layer_norm_eps=EPS
    )
    layer = randomise(layer, 0).double().train()
    ours = convert.encoder_layer_from_torch(layer)
    assert ours.training
    replace_dropouts(ours, list(DROPOUT_ROLES))
    replace_dropouts(layer, list(DROPOUT_ROLES.values()))
    x = torch.randn(3, 6, D, dtype=torch.float64)
    mask, torch_masks = masks_for(mask_kind, [6, 4, 1], 6)
    expected = layer(x, src_mask=torch_masks["mask"], src_key_padding_mask=torch_masks["padding"])
    for need_weights in (False, True):
        got, _ = ours(x, mask, need_weights=need_weights)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    layer.eval()  # and the stand-ins did change something
    no_dropout = layer(x, src_mask=torch_masks["mask"], src_key_padding_mask=torch_masks["padding"])
    assert not torch.allclose(no_dropout, expected)


@pytest.mark.parametrize("mask_kind", ["none", "causal+padding"])
@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_decoder_layer_dropouts_sit_where_torch_has_them(norm_first, mask_kind) -> None:
    torch.manual_seed(1)
    layer = nn.TransformerDecoderLayer(
        D, H, D_FF, dropout=0.3, batch_first=True, norm_first=norm_first, layer_norm_eps=EPS
    )
    layer = randomise(layer, 1).double().train()
    ours = convert.decoder_layer_from_torch(layer)
    replace_dropouts(ours, list(DROPOUT_ROLES))
    replace_dropouts(layer, list(DROPOUT_ROLES.values()))
    x = torch.randn(3, 5, D, dtype=torch.float64)
    memory = torch.randn(3, 7, D, dtype=torch.float64)
    self_mask, torch_self = masks_for(mask_kind, [5, 3, 1], 5)
    expected = layer(
        x, memory, tgt_mask=torch_self["mask"], tgt_key_padding_mask=torch_self["padding"]
    )
    for need_weights in (False, True):
        got, _, _ = ours(x, memory, self_mask, need_weights=need_weights)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_post_norm_and_pre_norm_differ() -> None:
    """Guards against norm_first being ignored (both would then match one torch layer)."""
    torch.manual_seed(0)
    post = EncoderLayer(D, H, D_FF).double().eval()
    pre = EncoderLayer(D, H, D_FF, norm_first=True).double().eval()
    pre.load_state_dict(post.state_dict())
    x = torch.randn(2, 4, D, dtype=torch.float64)
    assert not torch.allclose(post(x)[0], pre(x)[0])
    # Post-norm output is normalised (LayerNorm with weight 1, bias 0 at init).
    torch.testing.assert_close(post(x)[0].mean(-1), torch.zeros(2, 4, dtype=torch.float64))


def test_layers_without_bias_convert() -> None:
    torch.manual_seed(0)
    encoder = nn.TransformerEncoderLayer(D, H, D_FF, batch_first=True, bias=False).eval()
    decoder = nn.TransformerDecoderLayer(D, H, D_FF, batch_first=True, bias=False).eval()
    x, memory = torch.randn(2, 3, D), torch.randn(2, 4, D)
    ours_encoder = convert.encoder_layer_from_torch(encoder)
    ours_decoder = convert.decoder_layer_from_torch(decoder)
    assert ours_encoder.norm1.bias is None and ours_decoder.cross_attn.W_o.bias is None
    torch.testing.assert_close(ours_encoder(x)[0], encoder(x))
    torch.testing.assert_close(ours_decoder(x, memory)[0], decoder(x, memory))


def test_feed_forward_is_relu_between_two_linears() -> None:
    torch.manual_seed(0)
    ffn = FeedForward(D, D_FF).double()
    x = torch.randn(2, 3, D, dtype=torch.float64)
    W_1, b_1 = ffn.linear1.weight.T, ffn.linear1.bias  # (D, d_ff), (d_ff,)
    W_2, b_2 = ffn.linear2.weight.T, ffn.linear2.bias  # (d_ff, D), (D,)
    expected = torch.clamp(x @ W_1 + b_1, min=0) @ W_2 + b_2  # (B, T, D)
    torch.testing.assert_close(ffn(x), expected, rtol=1e-12, atol=1e-12)


def test_training_mode_and_dropout_are_carried_over() -> None:
    layer = nn.TransformerDecoderLayer(D, H, D_FF, dropout=0.25, batch_first=True)
    ours = convert.decoder_layer_from_torch(layer)  # torch layers start in training mode
    assert ours.training
    assert ours.dropout1.p == ours.feed_forward.dropout.p == ours.cross_attn.dropout == 0.25


@pytest.mark.parametrize(
    "build,match",
    [
        (lambda: FeedForward(D, True), r"d_ff must be a positive integer, got True"),
        (lambda: FeedForward(D, 24.0), r"d_ff must be a positive integer, got 24\.0"),
        (lambda: FeedForward(16.0, D_FF), r"d_model must be a positive integer, got 16\.0"),
        (lambda: EncoderLayer(D, H, True), r"d_ff must be a positive integer, got True"),
        (lambda: EncoderLayer(D, 4.0, D_FF), r"num_heads must be a positive integer, got 4\.0"),
        (lambda: DecoderLayer(D, H, 24.0), r"d_ff must be a positive integer, got 24\.0"),
        (lambda: DecoderLayer(D, True, D_FF), r"num_heads must be a positive integer, got True"),
    ],
)
def test_integer_arguments_must_be_integers(build, match) -> None:
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize(
    ("copy", "torch_cls"),
    [
        (convert.encoder_layer_from_torch, nn.TransformerEncoderLayer),
        (convert.decoder_layer_from_torch, nn.TransformerDecoderLayer),
    ],
)
def test_from_torch_rejects_what_it_cannot_copy(copy, torch_cls) -> None:
    with pytest.raises(ValueError, match="relu"):
        copy(torch_cls(D, H, D_FF, activation="gelu", batch_first=True))
    with pytest.raises(ValueError, match="batch_first"):
        copy(torch_cls(D, H, D_FF))
    with pytest.raises(ValueError, match=torch_cls.__name__):
        copy(nn.Linear(D, D))

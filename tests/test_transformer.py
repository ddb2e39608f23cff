"""The encoder-decoder Transformer: shapes, masks, attention maps, wiring vs PyTorch."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from torch import nn

from mha import convert
from mha.layers import DecoderLayer, EncoderLayer
from mha.masks import causal_mask, combine_masks, padding_mask
from mha.masks_torch import causal_mask as torch_causal_mask
from mha.masks_torch import source_mask, target_mask
from mha.modules import MultiHeadAttention
from mha.positional import sinusoidal_positional_encoding
from mha.transformer import AttentionMaps, Transformer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


PAD = 0
SRC_V, TGT_V = 11, 13


def make_model(**kwargs) -> Transformer:
    torch.manual_seed(kwargs.pop("seed", 0))
    options = {"num_encoder_layers": 2, "num_decoder_layers": 2} | kwargs
    return Transformer(SRC_V, TGT_V, **options).double().eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Source (B=3, S=6) and decoder input (B=3, T=5), padded at the end with PAD."""
    src = torch.tensor([[3, 4, 5, 6, 7, 8], [2, 9, 4, PAD, PAD, PAD], [5, PAD, PAD, PAD, PAD, PAD]])
    tgt_in = torch.tensor([[1, 4, 5, 6, 7], [1, 12, 3, PAD, PAD], [1, 2, PAD, PAD, PAD]])
    return src, tgt_in


@pytest.mark.parametrize("norm_first", [False, True])
def test_shapes_and_attention_maps(norm_first: bool) -> None:
    model = make_model(norm_first=norm_first)
    src, tgt_in = batch()
    logits = model(src, tgt_in)
    assert logits.shape == (3, 5, TGT_V)
    logits_again, maps = model(src, tgt_in, need_weights=True)
    torch.testing.assert_close(logits_again, logits, rtol=1e-10, atol=1e-10)
    assert isinstance(maps, AttentionMaps)
    H = model.num_heads
    expected = {"encoder": (3, H, 6, 6), "decoder_self": (3, H, 5, 5), "cross": (3, H, 5, 6)}
    for field, shape in expected.items():
        weights = getattr(maps, field)
        assert len(weights) == 2, field
        for w in weights:
            assert w.shape == shape, field
            # every query row has at least one real token to attend to: rows sum to 1
            torch.testing.assert_close(w.sum(-1), torch.ones(shape[:-1], dtype=w.dtype))
    src_real = (src != PAD)[:, None, None, :]  # (B, 1, 1, S)
    for w in maps.encoder + maps.cross:
        assert torch.all(w.masked_select(~src_real.expand_as(w)) == 0)  # padding gets 0
    future = ~torch.ones(5, 5, dtype=torch.bool).tril()  # (T, T) above the diagonal
    tgt_pad = (tgt_in == PAD)[:, None, None, :]  # (B, 1, 1, T)
    for w in maps.decoder_self:
        assert torch.all(w.masked_select((future | tgt_pad).expand_as(w)) == 0)


def test_encode_decode_without_weights_return_empty_lists() -> None:
    model = make_model()
    src, tgt_in = batch()
    memory, enc_weights = model.encode(src)
    logits, self_weights, cross_weights = model.decode(tgt_in, memory, src)
    assert memory.shape == (3, 6, model.d_model) and logits.shape == (3, 5, TGT_V)
    assert enc_weights == self_weights == cross_weights == []
    torch.testing.assert_close(logits, model(src, tgt_in))


def test_options_after_the_tensors_are_keyword_only() -> None:
    """``encode``, ``decode`` and ``forward`` take their tensors by position and every
    option by keyword; need_weights defaults to False in the model and its layers, and
    to True only in MultiHeadAttention, as in torch.nn.MultiheadAttention."""
    model = make_model()
    src, tgt_in = batch()
    memory, _ = model.encode(src)
    for call in (lambda: model.encode(src, True), lambda: model(src, tgt_in, True),
                 lambda: model.decode(tgt_in, memory, src, True)):  # fmt: skip
        with pytest.raises(TypeError, match="positional argument"):
            call()
    defaults = {
        fn: inspect.signature(fn).parameters["need_weights"].default
        for fn in (Transformer.encode, Transformer.decode, Transformer.forward,
                   EncoderLayer.forward, DecoderLayer.forward,
                   MultiHeadAttention.forward, nn.MultiheadAttention.forward)
    }  # fmt: skip
    assert list(defaults.values()) == [False] * 5 + [True, True]


@pytest.mark.parametrize("norm_first", [False, True])
def test_padded_source_tokens_are_irrelevant(norm_first: bool) -> None:
    """A padded sentence gives the same logits as the same sentence without padding."""
    model = make_model(norm_first=norm_first)
    src, tgt_in = batch()
    padded_logits = model(src, tgt_in)
    for row, length in enumerate((6, 3, 1)):
        alone = model(src[row : row + 1, :length], tgt_in[row : row + 1])
        torch.testing.assert_close(padded_logits[row : row + 1], alone, rtol=1e-10, atol=1e-10)


def test_padding_changes_nothing_even_with_other_pad_content() -> None:
    """Another pad id: the positions marked as padding may hold any token."""
    torch.manual_seed(0)
    model = Transformer(SRC_V, TGT_V, pad_id=10).double().eval()
    src = torch.tensor([[3, 4, 10, 10], [5, 6, 7, 10]])
    tgt_in = torch.tensor([[1, 4, 5], [1, 2, 3]])
    alone = model(src[:1, :2], tgt_in[:1])
    torch.testing.assert_close(model(src, tgt_in)[:1], alone, rtol=1e-10, atol=1e-10)
    # With pad_id=0 the 10s are real tokens, and the logits change.
    model.pad_id = 0
    assert not torch.allclose(model(src, tgt_in)[:1], alone)


@pytest.mark.parametrize("norm_first", [False, True])
def test_causal_later_targets_do_not_change_earlier_logits(norm_first: bool) -> None:
    model = make_model(norm_first=norm_first)
    src, tgt_in = batch()
    logits = model(src, tgt_in)
    generator = torch.Generator().manual_seed(1)
    for t in range(tgt_in.shape[1] - 1):
        changed = tgt_in.clone()
        changed[:, t + 1 :] = torch.randint(
            1, TGT_V, changed[:, t + 1 :].shape, generator=generator
        )
        new_logits = model(src, changed)
        torch.testing.assert_close(new_logits[:, : t + 1], logits[:, : t + 1], rtol=0, atol=1e-12)
        assert not torch.allclose(new_logits[:, t + 1 :], logits[:, t + 1 :])


def test_masks_match_the_numpy_helpers() -> None:
    src, tgt_in = batch()
    np.testing.assert_array_equal(
        source_mask(src, PAD).numpy(), padding_mask(tokens=src.numpy(), pad_id=PAD)
    )
    expected = combine_masks(causal_mask(5), padding_mask(tokens=tgt_in.numpy(), pad_id=PAD))
    assert target_mask(tgt_in, PAD).shape == (3, 1, 5, 5)
    np.testing.assert_array_equal(target_mask(tgt_in, PAD).numpy(), expected)
    for size, num_keys in ((1, 1), (4, 4), (3, 7), (1, 5)):  # masks: exact by construction
        np.testing.assert_array_equal(torch_causal_mask(size, num_keys).numpy(),
                                      causal_mask(size, num_keys))  # fmt: skip
    assert torch_causal_mask(4).dtype == torch.bool
    with pytest.raises(ValueError, match="num_keys"):
        torch_causal_mask(5, 3)


def test_embeddings_scaled_and_positions_added() -> None:
    """Zero layers: encode() is exactly embedding * sqrt(D) + positional encoding."""
    torch.manual_seed(0)
    d_model = 64
    model = Transformer(500, 7, d_model=d_model, num_encoder_layers=0).double().eval()
    std = model.src_embedding.weight.std().item()
    assert abs(std - d_model**-0.5) < 0.05 * d_model**-0.5  # N(0, 1/D), not N(0, 1)
    src, _ = batch()
    memory, _ = model.encode(src)
    pe = model.positional_encoding[: src.shape[1]]  # (S, D), checked in the next test
    expected = model.src_embedding(src) * math.sqrt(d_model) + pe  # (B, S, D) + (S, D)
    torch.testing.assert_close(memory, expected, rtol=1e-12, atol=1e-12)


def test_positional_encoding_is_a_buffer_not_a_parameter() -> None:
    model = Transformer(SRC_V, TGT_V, d_model=8, max_len=10)
    assert model.positional_encoding.shape == (10, 8)
    assert model.positional_encoding.dtype == torch.float32
    np.testing.assert_allclose(
        model.positional_encoding.numpy(), sinusoidal_positional_encoding(10, 8), rtol=1e-6
    )
    assert "positional_encoding" not in dict(model.named_parameters())
    assert "positional_encoding" not in model.state_dict()  # recomputed, not checkpointed
    assert model.double().positional_encoding.dtype == torch.float64


def test_parameter_count_does_not_depend_on_num_heads() -> None:
    counts = {
        h: sum(p.numel() for p in Transformer(SRC_V, TGT_V, d_model=32, num_heads=h).parameters())
        for h in (1, 2, 4, 8)
    }
    assert len(set(counts.values())) == 1


@pytest.mark.parametrize("norm_first", [False, True])
def test_wiring_matches_a_stack_of_torch_layers(norm_first: bool) -> None:
    """Load PyTorch layers into our model (EncoderLayer/DecoderLayer.from_torch) and run
    the same stacks with PyTorch: masks reach the right places, final norms as expected."""
    model = make_model(norm_first=norm_first)
    d_model, heads, d_ff = model.d_model, model.num_heads, 64
    torch.manual_seed(1)
    options = {"dropout": 0.0, "batch_first": True, "norm_first": norm_first}
    enc = [nn.TransformerEncoderLayer(d_model, heads, d_ff, **options) for _ in range(2)]
    dec = [nn.TransformerDecoderLayer(d_model, heads, d_ff, **options) for _ in range(2)]
    enc = [layer.double().eval() for layer in enc]
    dec = [layer.double().eval() for layer in dec]
    for i in range(2):
        model.encoder_layers[i] = convert.encoder_layer_from_torch(enc[i])
        model.decoder_layers[i] = convert.decoder_layer_from_torch(dec[i])
    src, tgt_in = batch()
    final = model.encoder_norm if norm_first else nn.Identity()
    final_dec = model.decoder_norm if norm_first else nn.Identity()
    src_pad, tgt_pad = src == PAD, tgt_in == PAD  # torch: True = blocked
    future = ~torch.from_numpy(causal_mask(tgt_in.shape[1]))

    x = model.src_embedding(src) * math.sqrt(d_model) + model.positional_encoding[:6]
    for layer in enc:
        x = layer(x, src_key_padding_mask=src_pad)
    memory = final(x)
    y = model.tgt_embedding(tgt_in) * math.sqrt(d_model) + model.positional_encoding[:5]
    for layer in dec:
        y = layer(
            y,
            memory,
            tgt_mask=future,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )
    expected = model.output(final_dec(y))
    torch.testing.assert_close(model(src, tgt_in), expected, rtol=1e-10, atol=1e-10)


def randomise(module: nn.Module, seed: int) -> nn.Module:
    """Random parameters, LayerNorm gains around 1: default norms (1, 0) and zero biases
    would hide a norm or bias that was not copied."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.3)
            if "norm" in name and name.endswith("weight"):
                param.add_(1.0)
    return module


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_matches_torch_nn_transformer_with_copied_weights(norm_first: bool) -> None:
    """Against PyTorch's own stacks: nn.Transformer with nn.TransformerEncoder /
    nn.TransformerDecoder, final LayerNorms for pre-norm only (the post-norm layers end in
    one already; nn.Transformer's default would add a second). Every weight, final norms
    included, comes from the PyTorch side, so a final norm that is missing or misplaced
    in ours shows up (the other wiring test reuses our own final norms)."""
    d_model, heads, d_ff, eps, layers = 16, 2, 24, 1e-6, 2
    torch.manual_seed(2)
    model = Transformer(
        SRC_V, TGT_V, d_model=d_model, num_heads=heads, num_encoder_layers=layers,
        num_decoder_layers=layers, d_ff=d_ff, norm_first=norm_first, layer_norm_eps=eps,
    ).double().eval()  # fmt: skip
    options = {"dropout": 0.0, "batch_first": True, "norm_first": norm_first,
               "layer_norm_eps": eps, "dtype": torch.float64}  # fmt: skip

    def final_norm() -> nn.LayerNorm | None:
        return nn.LayerNorm(d_model, eps=eps, dtype=torch.float64) if norm_first else None

    encoder = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(d_model, heads, d_ff, **options), layers,
        norm=final_norm(), enable_nested_tensor=False,
    )  # fmt: skip
    decoder = nn.TransformerDecoder(
        nn.TransformerDecoderLayer(d_model, heads, d_ff, **options), layers, norm=final_norm()
    )
    reference = nn.Transformer(
        d_model, heads, custom_encoder=encoder, custom_decoder=decoder, batch_first=True
    )
    reference = randomise(reference, seed=3).eval()
    with torch.no_grad():
        for ours, theirs in zip(model.encoder_layers, encoder.layers, strict=True):
            ours.load_state_dict(convert.encoder_layer_from_torch(theirs).state_dict())
        for ours, theirs in zip(model.decoder_layers, decoder.layers, strict=True):
            ours.load_state_dict(convert.decoder_layer_from_torch(theirs).state_dict())
        if norm_first:
            model.encoder_norm.load_state_dict(encoder.norm.state_dict())
            model.decoder_norm.load_state_dict(decoder.norm.state_dict())

    def count(module: nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    own = count(model.src_embedding) + count(model.tgt_embedding) + count(model.output)
    assert count(model) == count(reference) + own  # every other weight was copied

    src, tgt_in = batch()
    S, T = src.shape[1], tgt_in.shape[1]
    src_x = model.src_embedding(src) * math.sqrt(d_model) + model.positional_encoding[:S]
    tgt_x = model.tgt_embedding(tgt_in) * math.sqrt(d_model) + model.positional_encoding[:T]
    src_pad, tgt_pad = src == PAD, tgt_in == PAD  # torch: True = blocked
    hidden = reference(
        src_x, tgt_x,
        tgt_mask=~torch.from_numpy(causal_mask(T)),
        src_key_padding_mask=src_pad,
        tgt_key_padding_mask=tgt_pad,
        memory_key_padding_mask=src_pad,
    )  # fmt: skip
    torch.testing.assert_close(model(src, tgt_in), model.output(hidden), rtol=1e-10, atol=1e-10)


def test_trains_one_step_without_nan() -> None:
    model = Transformer(SRC_V, TGT_V, dropout=0.1)
    src, tgt_in = batch()
    logits = model(src, tgt_in)
    loss = nn.functional.cross_entropy(logits.transpose(1, 2), tgt_in, ignore_index=PAD)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ----------------------------------------------------------------------- bad input


def test_bad_inputs_raise_value_errors() -> None:
    model = make_model()
    src, tgt_in = batch()
    with pytest.raises(ValueError, match=r"src must be a \(B, L\) tensor .* shape \(6,\)"):
        model(src[0], tgt_in)
    with pytest.raises(ValueError, match="src must hold integer token ids, got dtype torch.float"):
        model(src.float(), tgt_in)
    with pytest.raises(ValueError, match=r"same batch size.*tgt_in \(2, 5\), src \(3, 6\)"):
        model(src, tgt_in[:2])
    long_src = torch.ones(1, 65, dtype=torch.long)
    with pytest.raises(ValueError, match=r"src has length 65 > max_len=64 \(shape \(1, 65\)\)"):
        model.encode(long_src)
    assert model.encode(long_src[:, :64])[0].shape == (1, 64, 32)  # exactly max_len: taken
    memory, _ = model.encode(src)
    with pytest.raises(ValueError, match=r"memory must have shape .* \(3, 6, 32\).* \(3, 5, 32\)"):
        model.decode(tgt_in, memory[:, :5], src)
    with pytest.raises(ValueError, match="d_model=30 is not divisible by num_heads=4"):
        Transformer(SRC_V, TGT_V, d_model=30, num_heads=4)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"src_vocab_size": 11.0}, r"src_vocab_size must be a positive integer, got 11\.0"),
        ({"tgt_vocab_size": True}, r"tgt_vocab_size must be a positive integer, got True"),
        ({"d_model": 32.0}, r"d_model must be a positive integer, got 32\.0"),
        ({"num_heads": 2.0}, r"num_heads must be a positive integer, got 2\.0"),
        ({"num_heads": True}, r"num_heads must be a positive integer, got True"),
        ({"num_encoder_layers": True}, r"num_encoder_layers must be a non-negative integer"),
        ({"num_decoder_layers": 2.0}, r"num_decoder_layers must be a non-negative integer"),
        ({"num_decoder_layers": -1}, r"num_decoder_layers must be a non-negative integer"),
        ({"d_ff": 64.0}, r"d_ff must be a positive integer, got 64\.0"),
        ({"max_len": True}, r"max_len must be a positive integer, got True"),
        ({"pad_id": 0.0}, r"pad_id must be a non-negative integer, got 0\.0"),
        ({"pad_id": False}, r"pad_id must be a non-negative integer, got False"),
    ],
)
def test_integer_arguments_must_be_integers(kwargs, match) -> None:
    """A bool is not a count (True would silently mean 1), a float not a size."""
    arguments = {"src_vocab_size": SRC_V, "tgt_vocab_size": TGT_V} | kwargs
    with pytest.raises(ValueError, match=match):
        Transformer(**arguments)

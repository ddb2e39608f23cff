"""Greedy decoding, the translator's error messages, and pickle-free checkpoints.

Exact comparisons here are of ids, strings, configuration values and weights copied
through a checkpoint, or of one computation repeated on such copies; tokens that two
code paths choose are compared only with the logit margin that makes it safe.
"""

from __future__ import annotations

import inspect
import json
import pickle

import numpy as np
import pytest
import torch

from mha.layers import DecoderLayer, EncoderLayer
from mha.transformer import Transformer
from mha.translator import (
    CHECKPOINT,
    Translator,
    Vocab,
    exact_match,
    generate_corpus,
    greedy_decode,
    greedy_margins,
    load_checkpoint,
    load_pretrained,
    model_config,
    read_metadata,
    save_checkpoint,
)
from mha.translator.grammar import FIXED_PHRASES

BOS, EOS = Vocab.bos_id, Vocab.eos_id


@pytest.fixture(scope="module")
def translator() -> Translator:
    return load_pretrained()


def _constant_model(token: int, vocab_size: int = 6) -> Transformer:
    """A model whose every next-token prediction is ``token`` (zero weights, one bias)."""
    torch.manual_seed(0)
    model = Transformer(5, vocab_size, d_model=8, num_heads=2, d_ff=16, max_len=12)
    with torch.no_grad():
        model.output.weight.zero_()
        model.output.bias.fill_(-5.0)
        model.output.bias[token] = 5.0
    return model


def test_greedy_margins_are_finite_up_to_and_including_the_end_token():
    """The step that chooses </s> is a choice like any other: its margin counts; only
    the steps after it, where nothing is chosen, are inf. Hand-made logits, so the
    expectation does not come from greedy_margins itself."""
    ids = torch.tensor([[4, EOS, 0, 0], [EOS, 0, 0, 0], [5, 4, 5, 4]])  # (B, L)
    margins = torch.tensor([[1.5, 0.25, 9.0, 9.0], [0.5, 7.0, 7.0, 7.0],
                            [2.0, 0.75, 3.0, 0.125]])  # fmt: skip
    logits = torch.zeros(3, 4, 6)  # (B, L, V): the chosen token leads by the margin
    logits.scatter_(2, ids[..., None], margins[..., None])
    inf = float("inf")
    expected = [[1.5, 0.25, inf, inf], [0.5, inf, inf, inf], [2.0, 0.75, 3.0, 0.125]]
    assert greedy_margins(ids, logits, EOS).tolist() == expected  # exact: one subtraction of 0


def test_greedy_decode_stops_at_end_token():
    src = torch.tensor([[3, 4, 0], [3, 3, 4]])  # (B, S), first row padded
    out = greedy_decode(_constant_model(EOS), src, BOS, EOS)
    assert out.tolist() == [[EOS], [EOS]]  # one step: every row emitted </s>


def test_greedy_decode_stops_at_length_limit():
    src = torch.tensor([[3, 4]])
    model = _constant_model(4)  # never emits </s>
    assert greedy_decode(model, src, BOS, EOS, max_new_tokens=5).tolist() == [[4] * 5]
    # Default limit: as long as the positional table allows after <s>.
    assert greedy_decode(model, src, BOS, EOS).shape == (1, model.max_len - 1)
    with pytest.raises(ValueError, match=r"max_new_tokens must be in \[1, 11\], got 12"):
        greedy_decode(model, src, BOS, EOS, max_new_tokens=12)


def _modes(model: torch.nn.Module) -> list[bool]:
    """``training`` of the model and of every submodule, in ``modules()`` order."""
    return [m.training for m in model.modules()]


@pytest.mark.parametrize("training", [True, False, "mixed"])
def test_greedy_decode_restores_the_training_mode(
    monkeypatch: pytest.MonkeyPatch, training: bool | str
) -> None:
    """Decoding runs in eval mode (no dropout), then leaves the model and every submodule
    in the mode it found them: a training loop that decodes a few examples between steps
    must not go on training with dropout switched off, nor a frozen part switched on."""
    model = _constant_model(4).train(training is not False)  # never emits </s>
    if training == "mixed":
        model.encoder_layers.eval()  # frozen while the rest trains
    before = _modes(model)
    during: list[list[bool]] = []
    decode = model.decode

    def spy(*args: object, **kwargs: object) -> tuple:
        during.append(_modes(model))
        return decode(*args, **kwargs)

    monkeypatch.setattr(model, "decode", spy)
    greedy_decode(model, torch.tensor([[3, 4]]), BOS, EOS, max_new_tokens=3)
    assert len(during) == 3 and not any(any(modes) for modes in during), "decoded in training"
    after = _modes(model)
    changed = sum(a != b for a, b in zip(after, before, strict=True))
    assert changed == 0, f"{changed} of {len(after)} modules left in another mode"


def test_attention_maps_leave_the_training_mode_as_it_was(translator):
    model = translator.model
    model.train()
    model.decoder_layers.eval()
    before = _modes(model)
    try:
        translator.attention("the black cats sleep", "los gatos negros duermen")
        assert _modes(model) == before
    finally:
        model.eval()


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_decode_with_the_cache_decodes_only_the_newest_position(
    monkeypatch: pytest.MonkeyPatch, use_cache: bool
) -> None:
    """With the KV cache every step runs the decoder on the newest position only, with one
    cache object that holds all the earlier ones; without it, on the whole prefix. Before
    this test only the benchmark's multiply-add count noticed a cache ignored, or a new
    one built each step (same tokens, T times the work)."""
    model = _constant_model(4)  # never emits </s>: every step runs
    src = torch.tensor([[3, 4, 0], [3, 3, 4]])  # (B, S)
    calls: list[tuple[int, object, list[int] | None, int]] = []  # prefix, cache, cached, logits
    decode = model.decode
    signature = inspect.signature(decode)

    def spy(*args: object, **kwargs: object) -> tuple:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        cache = bound.arguments["cache"]
        cached = None if cache is None else [c.length for c, _ in cache]  # per layer
        logits, self_weights, cross_weights = decode(*args, **kwargs)
        prefix = bound.arguments["tgt_in"].shape[1]
        calls.append((prefix, cache, cached, logits.shape[1]))
        return logits, self_weights, cross_weights

    monkeypatch.setattr(model, "decode", spy)
    greedy_decode(model, src, BOS, EOS, max_new_tokens=4, use_cache=use_cache)
    prefixes, caches, cached, positions = map(list, zip(*calls, strict=True))
    assert prefixes == [1, 2, 3, 4]  # decode always takes the whole prefix (for its mask)
    if use_cache:
        assert caches[0] is not None, "use_cache=True decoded without a cache"
        assert all(c is caches[0] for c in caches), "a new cache at some step"
        assert cached == [[0], [1], [2], [3]], "the cache does not hold the earlier positions"
        assert positions == [1, 1, 1, 1], "the decoder re-ran positions already cached"
    else:
        assert caches == [None] * 4
        assert positions == [1, 2, 3, 4]


def test_greedy_decode_pads_rows_after_their_end_token(translator):
    # A short and a long sentence in one batch: the short one's row must end in padding.
    src = translator.source_ids(["hello", "the black cats see my old wolves"])
    ids = greedy_decode(translator.model, src, BOS, EOS)
    short = ids[0].tolist()
    end = short.index(EOS)
    assert end == 1 and set(short[end + 1 :]) == {Vocab.pad_id}


def test_shipped_model_translates_the_seed_example(translator):
    assert translator.translate("You are welcome.") == "de nada"
    assert translator.translate("the black cats sleep") == "los gatos negros duermen"


@pytest.mark.parametrize(("english", "spanish"), FIXED_PHRASES)
def test_shipped_model_knows_every_fixed_phrase(translator, english, spanish):
    assert translator.translate(english) == spanish


def test_batch_equals_one_by_one(translator):
    """A padded batch is translated as each sentence alone. The two paths' logits differ
    in their last bits, so the same tokens are asserted with the margin that makes that
    safe: float32 logits of magnitude <= 8 (one ulp: 1e-6) are about 2e-6 apart, within
    ``atol``, and every choice is won by more than ``2 * atol`` (here by more than 4)."""
    sentences = ["hello", "the black cats sleep", "a girl sees the old wolves", "thank you"]
    atol = 1e-4
    model = translator.model
    ids, logits = greedy_decode(
        model, translator.source_ids(sentences), BOS, EOS, return_logits=True
    )
    closest = float(greedy_margins(ids, logits, EOS).min())
    assert closest > 2 * atol, f"near-tie: a choice won by only {closest:.3g}"
    for k, sentence in enumerate(sentences):
        _, alone = greedy_decode(
            model, translator.source_ids([sentence]), BOS, EOS, return_logits=True
        )
        steps = alone.shape[1]  # up to its end token; the batch row pads after it
        torch.testing.assert_close(logits[k, :steps], alone[0], rtol=0, atol=atol)
    batch = translator.translate(sentences)
    assert batch == [translator.translate(s) for s in sentences]


def test_shipped_checkpoint_scores(translator):
    meta = read_metadata(CHECKPOINT)
    config = meta["extra"]["train_config"]
    corpus = generate_corpus(
        config["seed"],
        num_train=config["num_train"],
        num_heldout=config["num_heldout"],
        num_compositional=config["num_compositional"],
    )
    heldout = exact_match(translator, corpus.heldout)
    assert heldout == pytest.approx(meta["extra"]["scores"]["heldout"], abs=1e-9)
    assert heldout >= 0.99


def test_shipped_checkpoint_is_small():
    assert CHECKPOINT.stat().st_size < 300_000


def test_checkpoint_loads_without_pickle(tmp_path, monkeypatch, translator):
    path = tmp_path / "model.npz"
    save_checkpoint(path, translator, extra={"note": "test"})

    def refuse(*args, **kwargs):
        raise AssertionError("a checkpoint must not be unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    with np.load(path, allow_pickle=False) as data:  # would raise on an object array
        assert all(data[k].dtype != object for k in data.files)
    loaded = load_checkpoint(path)
    for (name, a), (_, b) in zip(
        translator.model.state_dict().items(), loaded.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name  # copies: exact
    assert loaded.src_vocab == translator.src_vocab and loaded.tgt_vocab == translator.tgt_vocab
    assert read_metadata(path)["extra"] == {"note": "test"}
    sentence = "my happy goats find a fast bear"
    assert loaded.translate(sentence) == translator.translate(sentence)


# Every constructor argument of Transformer, each different from its default.
NON_DEFAULT_CONFIG = {
    "src_vocab_size": 7,
    "tgt_vocab_size": 9,
    "d_model": 12,
    "num_heads": 3,
    "num_encoder_layers": 2,
    "num_decoder_layers": 3,
    "d_ff": 20,
    "dropout": 0.25,
    "max_len": 17,
    "pad_id": 3,
    "norm_first": True,
    "layer_norm_eps": 1e-6,
    "position_scheme": "rope",
}


def test_every_constructor_argument_round_trips(tmp_path):
    """The checkpoint stores the model's own configuration, not one rebuilt from its
    submodules (which forgot layer_norm_eps: a 1e-6 model came back with 1e-5)."""
    signature = inspect.signature(Transformer).parameters
    assert set(NON_DEFAULT_CONFIG) == set(signature)  # a new argument must be added here
    for name, value in NON_DEFAULT_CONFIG.items():
        default = signature[name].default
        assert default is inspect.Parameter.empty or value != default, name
    torch.manual_seed(0)
    model = Transformer(**NON_DEFAULT_CONFIG)
    src_vocab = Vocab(["a", "b", "c", "d"])
    tgt_vocab = Vocab(["u", "v", "w", "x", "y", "z"])
    path = tmp_path / "model.npz"
    save_checkpoint(path, Translator(model, src_vocab, tgt_vocab))
    loaded = load_checkpoint(path).model

    norms = [m for m in loaded.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 2 * 2 + 3 * 3 + 2  # per layer, plus the two final norms
    assert [n.eps for n in norms] == [1e-6] * len(norms)
    layers = [m for m in loaded.modules() if isinstance(m, EncoderLayer | DecoderLayer)]
    assert len(layers) == 5 and all(layer.norm_first for layer in layers)
    assert all(layer.dropout1.p == 0.25 for layer in layers)
    assert loaded.pad_id == 3 and loaded.max_len == 17 and loaded.num_heads == 3
    assert loaded.position_scheme == "rope" and loaded.positional_encoding is None
    assert model.config == NON_DEFAULT_CONFIG and model_config(model) == NON_DEFAULT_CONFIG
    assert read_metadata(path)["model"] == NON_DEFAULT_CONFIG
    assert model_config(loaded) == NON_DEFAULT_CONFIG
    for name, value in NON_DEFAULT_CONFIG.items():
        assert type(loaded.config[name]) is type(value), name
    for (name, a), (_, b) in zip(
        model.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name  # copies: exact
    src = torch.tensor([[4, 5, 6, 3]])
    tgt_in = torch.tensor([[1, 4, 5]])
    # The same computation on copied weights: exact.
    torch.testing.assert_close(loaded(src, tgt_in), model.eval()(src, tgt_in), rtol=0, atol=0)


def test_config_is_a_copy_of_the_constructor_arguments():
    model = Transformer(5, 6, d_model=8, num_heads=2, layer_norm_eps=1e-6)
    assert model.config == {
        "src_vocab_size": 5, "tgt_vocab_size": 6, "d_model": 8, "num_heads": 2,
        "num_encoder_layers": 1, "num_decoder_layers": 1, "d_ff": 64, "dropout": 0.0,
        "max_len": 64, "pad_id": 0, "norm_first": False, "layer_norm_eps": 1e-6,
        "position_scheme": "sinusoidal",
    }  # fmt: skip
    returned = model_config(model)
    returned["d_model"] = 1000
    assert model.config["d_model"] == 8  # callers cannot change the model's record


def test_shipped_checkpoint_stores_the_full_config():
    meta = read_metadata(CHECKPOINT)
    assert set(meta["model"]) == set(inspect.signature(Transformer).parameters)
    assert meta["model"]["layer_norm_eps"] == 1e-5  # a stored argument, read back: exact
    assert model_config(load_pretrained().model) == meta["model"]


def test_checkpoint_with_an_incomplete_or_foreign_config_is_refused(tmp_path, translator):
    """Nothing is filled in with a default: a config must name every argument."""
    path = tmp_path / "old.npz"
    save_checkpoint(path, translator)
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["__meta__"]))
    del meta["model"]["layer_norm_eps"]
    arrays["__meta__"] = np.array(json.dumps(meta))
    np.savez_compressed(path, **arrays)
    with pytest.raises(ValueError, match=r"missing \['layer_norm_eps'\]"):
        load_checkpoint(path)
    meta["model"]["layer_norm_eps"] = 1e-5
    meta["model"]["colour"] = "blue"
    arrays["__meta__"] = np.array(json.dumps(meta))
    np.savez_compressed(path, **arrays)
    with pytest.raises(ValueError, match=r"unknown argument\(s\) \['colour'\]"):
        load_checkpoint(path)


def rewritten_checkpoint(path, change):
    """A copy of the shipped checkpoint whose metadata ``change(meta)`` edited."""
    with np.load(CHECKPOINT, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["__meta__"]))
    change(meta)
    arrays["__meta__"] = np.array(json.dumps(meta))
    np.savez_compressed(path, **arrays)
    return path


def test_a_checkpoint_from_before_the_position_scheme_option_loads_as_sinusoidal(
    tmp_path, translator
):
    """Checkpoints written before the option existed have no such entry; they all used
    the sinusoidal table, and load with it: the same model, the same outputs. One
    written while the option was called ``positions`` loads under the new name."""
    src = torch.tensor([[4, 5, 6, 7, 3]])
    tgt_in = torch.tensor([[1, 8, 9, 10]])

    def without(meta):
        assert meta["model"].pop("position_scheme") == "sinusoidal"

    def old_name(meta):
        meta["model"]["positions"] = meta["model"].pop("position_scheme")

    for name, change in (("before", without), ("old_name", old_name)):
        old = load_checkpoint(rewritten_checkpoint(tmp_path / f"{name}.npz", change))
        assert old.model.config == translator.model.config, name
        assert old.model.config["position_scheme"] == "sinusoidal"
        with torch.no_grad():  # the same weights and the same computation: exact
            assert torch.equal(old.model(src, tgt_in), translator.model(src, tgt_in))


def test_not_a_checkpoint_is_refused(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, weights=np.zeros(3))
    with pytest.raises(ValueError, match="not a translator checkpoint"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    ("sentences", "message"),
    [
        ("the cat sleeps on the sofa", r"unknown word\(s\) \['on', 'sofa'\]"),
        ("", "sentence 0 is empty"),
        ("  ?! ", "sentence 0 is empty"),
        (["hello", ""], "sentence 1 is empty"),
        ([], "empty list"),
        (["the", "black", "cat", "sleeps"], "looks like one sentence split into words"),
        (" ".join(["the cat sleeps and"] * 9), "more than the model's max_len=32"),
    ],
)
def test_bad_input_gets_a_clear_message(translator, sentences, message):
    with pytest.raises(ValueError, match=message):
        translator.translate(sentences)


def test_a_list_of_one_word_phrases_is_still_a_batch(translator):
    assert translator.translate(["hello", "please"]) == ["hola", "por favor"]


def test_attention_maps_have_one_panel_per_head(translator):
    src, tgt, maps = translator.attention("the black cats sleep")
    assert tgt == ["<s>", "los", "gatos", "negros", "duermen"]
    S, T, H = len(src), len(tgt), translator.model.num_heads
    n_enc, n_dec = len(translator.model.encoder_layers), len(translator.model.decoder_layers)
    assert [tuple(w.shape) for w in maps.encoder] == [(1, H, S, S)] * n_enc
    assert [tuple(w.shape) for w in maps.decoder_self] == [(1, H, T, T)] * n_dec
    assert [tuple(w.shape) for w in maps.cross] == [(1, H, T, S)] * n_dec
    for w in (*maps.encoder, *maps.decoder_self, *maps.cross):
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))


def test_closest_deciding_margin_looks_only_at_the_choices_that_decide(translator):
    """For each sentence alone: the margins of the steps up to and including the first
    one where the translation leaves the reference (all of them if it never does)."""
    from mha.translator import Example, closest_deciding_margin

    right = ["the black cats sleep", "thank you", "a girl sees the old wolves"]
    examples = [Example(tuple(s.split()), tuple(translator.translate(s).split()), "test")
                for s in right]  # fmt: skip
    wrong = Example(examples[0].source, ("los", "perros", "negros", "duermen"), "test")
    expected = []
    for e, stop in [*((e, None) for e in examples), (wrong, 2)]:  # "perros": step 1
        ids, logits = greedy_decode(translator.model, translator.source_ids([list(e.source)]),
                                    BOS, EOS, return_logits=True)  # fmt: skip
        margins = greedy_margins(ids, logits, EOS)[0]
        expected.append(float(margins[:stop].min()))
    got = [closest_deciding_margin(translator, [e]) for e in [*examples, wrong]]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # A batch gives the smallest of its sentences' margins.
    np.testing.assert_allclose(
        closest_deciding_margin(translator, [*examples, wrong], batch_size=2), min(got),
        rtol=1e-5,
    )
    with pytest.raises(ValueError, match="empty"):
        closest_deciding_margin(translator, [])

"""The translator exported to ONNX (tools/onnx_export.py) computes what the torch model does.

The shipped checkpoint is exported once (through the tool's command line) and run with
onnxruntime, in float32 like the model: its memory, logits and every attention map equal
the torch model's on held-out sentences within 1e-4 (absolute; the logits are of size
~10, the weights at most 1, and the two runtimes agreed to ~3e-6 here), at lengths and
batch sizes other than the ones it was traced with. Greedy decoding with the two graphs
chooses the same tokens as :func:`mha.translator.greedy_decode`, which is safe because
every choice's margin is larger than twice that bound. Silencing a head through the
graph's head mask changes the outputs exactly as chapter 7's way of silencing it
(zeroing its columns of ``W_o.weight``) changes the torch model's.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from mha.transformer import Transformer
from mha.translator import (
    CHECKPOINT,
    Translator,
    generate_corpus,
    greedy_decode,
    greedy_margins,
    load_pretrained,
    read_metadata,
)
from tools import onnx_export
from tools.onnx_export import DECODER_FILE, ENCODER_FILE, METADATA_FILE, DecoderGraph, EncoderGraph

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ATOL = 1e-4  # float32 graphs against the float32 torch model
NUM_SENTENCES = 24
# Chapter 7's names of the attentions, and the graph input that masks each one's heads.
MASK_OF = {"encoder_layers.{}.self_attn": "head_mask",
           "decoder_layers.{}.self_attn": "self_head_mask",
           "decoder_layers.{}.cross_attn": "cross_head_mask"}  # fmt: skip


@pytest.fixture(scope="module")
def translator() -> Translator:
    return load_pretrained()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "site"  # not there yet: the tool creates it
    with torch.no_grad():  # which the tool undoes: see _export_graph
        assert onnx_export.main([str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def sessions(exported) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1  # as the page runs it
    return tuple(
        ort.InferenceSession(exported / name, options, providers=["CPUExecutionProvider"])
        for name in (ENCODER_FILE, DECODER_FILE)
    )


@pytest.fixture(scope="module")
def heldout(translator) -> torch.Tensor:
    """``(B, S)`` source ids of held-out sentences (never trained on), 3 to 7 words,
    padded: a batch unlike the traced example (2 x 5)."""
    config = read_metadata(CHECKPOINT)["extra"]["train_config"]
    corpus = generate_corpus(config["seed"], num_train=config["num_train"],
                             num_heldout=config["num_heldout"],
                             num_compositional=config["num_compositional"])  # fmt: skip
    return translator.source_ids([example.source for example in corpus.heldout[:NUM_SENTENCES]])


def _masks(model: Transformer, silenced: tuple[str, int] | None = None) -> dict[str, np.ndarray]:
    """All-ones head masks, but for one (attention, head), given by chapter 7's name."""
    masks = {"head_mask": np.ones((len(model.encoder_layers), model.num_heads), np.float32)}
    for name in ("self_head_mask", "cross_head_mask"):
        masks[name] = np.ones((len(model.decoder_layers), model.num_heads), np.float32)
    if silenced is not None:
        attention, head = silenced
        for pattern, name in MASK_OF.items():
            for layer in range(len(masks[name])):
                if attention == pattern.format(layer):
                    masks[name][layer, head] = 0.0
    return masks


def _silence(model: Transformer, attention: str, head: int) -> Transformer:
    """Chapter 7's `silence`: a copy whose head's columns of ``W_o.weight`` are zero."""
    quiet = copy.deepcopy(model)
    head_dim = model.d_model // model.num_heads
    with torch.no_grad():
        quiet.get_submodule(attention).W_o.weight[:, head * head_dim:(head + 1) * head_dim] = 0.0
    return quiet


def _onnx_encode(sessions, src, masks):
    memory, *weights = sessions[0].run(None, {"src": src.numpy(), "head_mask": masks["head_mask"]})
    return memory, weights


def _onnx_decode(sessions, tgt_in, memory, src, masks):
    inputs = {"tgt_in": tgt_in.numpy(), "memory": memory, "src": src.numpy(),
              "self_head_mask": masks["self_head_mask"],
              "cross_head_mask": masks["cross_head_mask"]}  # fmt: skip
    logits, *weights = sessions[1].run(None, inputs)
    half = len(weights) // 2
    return logits, weights[:half], weights[half:]


def _onnx_greedy(sessions, src, masks, bos_id, eos_id, pad_id, max_new_tokens):
    """What a page does: encode once, then run the decoder on the whole prefix, take
    the last position's argmax; finished rows only pad. Returns ``(B, L)`` ids and the
    ``(B, L, V)`` logits each step chose from, as ``greedy_decode(return_logits=True)``."""
    memory, _ = _onnx_encode(sessions, src, masks)
    out = torch.full((src.shape[0], 1), bos_id)  # (B, 1)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    steps = []
    for _ in range(max_new_tokens):
        logits, _, _ = _onnx_decode(sessions, out, memory, src, masks)  # (B, t, V)
        last = torch.from_numpy(logits[:, -1])  # (B, V)
        steps.append(last)
        nxt = last.argmax(dim=-1).masked_fill(done, pad_id)  # (B,)
        out = torch.cat([out, nxt[:, None]], dim=1)  # (B, t) -> (B, t + 1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
    return out[:, 1:], torch.stack(steps, dim=1)  # L x (B, V) -> (B, L, V)


def _close(actual, expected) -> None:
    np.testing.assert_allclose(actual, np.asarray(expected), rtol=0, atol=ATOL)


def _flat(parts) -> list:
    """(memory, [maps], logits, [maps], [maps]) -> one list of arrays."""
    return [x for part in parts for x in (part if isinstance(part, list) else [part])]


def _torch_and_onnx(translator, sessions, src, silenced=None):
    """Encoder and decoder outputs of the torch model (with ``silenced`` as chapter 7
    silences a head) and of the graphs (with the head mask), teacher-forced on the
    torch model's own greedy translation (padded after each row's end token)."""
    tgt = translator.tgt_vocab
    model = translator.model if silenced is None else _silence(translator.model, *silenced)
    ids = greedy_decode(model, src, tgt.bos_id, tgt.eos_id)  # (B, L)
    tgt_in = torch.cat([torch.full((len(ids), 1), tgt.bos_id), ids[:, :-1]], dim=1)  # (B, L)
    with torch.no_grad():
        memory, enc_weights = model.encode(src, need_weights=True)
        logits, self_weights, cross_weights = model.decode(tgt_in, memory, src,
                                                           need_weights=True)  # fmt: skip
    masks = _masks(model, silenced)
    onnx_memory, onnx_enc = _onnx_encode(sessions, src, masks)
    # The torch memory, so that the decoder's comparison measures the decoder alone.
    onnx_logits, onnx_self, onnx_cross = _onnx_decode(sessions, tgt_in, memory.numpy(), src,
                                                      masks)  # fmt: skip
    expected = (memory, enc_weights, logits, self_weights, cross_weights)
    actual = (onnx_memory, onnx_enc, onnx_logits, onnx_self, onnx_cross)
    return expected, actual


def test_graphs_compute_the_models_outputs_and_every_attention_map(translator, sessions, heldout):
    (memory, enc, logits, dec_self, cross), actual = _torch_and_onnx(translator, sessions, heldout)
    onnx_memory, onnx_enc, onnx_logits, onnx_self, onnx_cross = actual
    assert logits.shape[1] != 4 and heldout.shape[1] != 5  # not the traced lengths
    _close(onnx_memory, memory)
    _close(onnx_logits, logits)
    # One map per layer, each in its place: the weights of the layer named.
    assert len(onnx_enc) == len(enc) and len(onnx_self) == len(dec_self) == len(onnx_cross)
    for onnx_maps, maps in ((onnx_enc, enc), (onnx_self, dec_self), (onnx_cross, cross)):
        for onnx_map, torch_map in zip(onnx_maps, maps, strict=True):
            assert onnx_map.shape == torch_map.shape
            _close(onnx_map, torch_map)


def test_rows_with_nothing_to_attend_get_zero_weights_as_in_torch(translator, sessions):
    """The branch the tracer froze is the one that handles such rows: an all-padding
    source and target row give zero weights, not NaN, in both."""
    pad = translator.model.pad_id
    src = torch.tensor([[5, 6, 7], [pad, pad, pad]])  # (2, 3)
    tgt_in = torch.tensor([[1, 4, 5], [pad, pad, pad]])  # (2, 3)
    with torch.no_grad():
        memory, enc = translator.model.encode(src, need_weights=True)
        logits, dec_self, cross = translator.model.decode(tgt_in, memory, src, need_weights=True)
    masks = _masks(translator.model)
    onnx_memory, onnx_enc = _onnx_encode(sessions, src, masks)
    onnx_logits, onnx_self, onnx_cross = _onnx_decode(sessions, tgt_in, memory.numpy(), src, masks)
    for onnx_map, torch_map in ((onnx_enc[0], enc[0]), (onnx_self[0], dec_self[0]),
                                (onnx_cross[0], cross[0])):  # fmt: skip
        assert not torch_map[1].any()  # exact: the torch model's rule, zeros
        _close(onnx_map, torch_map)
    _close(onnx_memory, memory)
    _close(onnx_logits, logits)


SILENCED = [None, *((pattern.format(0), head) for pattern in MASK_OF for head in range(2))]


@pytest.mark.parametrize("silenced", SILENCED,
                         ids=lambda s: "all heads" if s is None else f"{s[0]} head {s[1]}")
def test_greedy_translations_equal_greedy_decode(translator, sessions, heldout, silenced):
    """Token for token, on 24 held-out sentences, with every head heard and with each
    head silenced (head mask in the graphs, chapter 7's zeroed columns in torch)."""
    tgt = translator.tgt_vocab
    model = translator.model if silenced is None else _silence(translator.model, *silenced)
    ids, logits = greedy_decode(model, heldout, tgt.bos_id, tgt.eos_id, return_logits=True)
    onnx_ids, onnx_logits = _onnx_greedy(sessions, heldout, _masks(model, silenced), tgt.bos_id,
                                         tgt.eos_id, model.pad_id, model.max_len - 1)  # fmt: skip
    # Safe: every choice leads its runner-up by more than twice the logits' tolerance.
    assert greedy_margins(ids, logits, tgt.eos_id).min() > 2 * ATOL
    assert onnx_ids.tolist() == ids.tolist()
    _close(onnx_logits, logits)


@pytest.mark.parametrize("attention", [pattern.format(0) for pattern in MASK_OF])
def test_silencing_a_head_changes_the_outputs_as_in_chapter_7(translator, sessions, heldout,
                                                              attention):  # fmt: skip
    heard, _ = _torch_and_onnx(translator, sessions, heldout)
    for head in range(translator.model.num_heads):
        expected, actual = _torch_and_onnx(translator, sessions, heldout, (attention, head))
        for onnx_array, torch_array in zip(_flat(actual), _flat(expected), strict=True):
            _close(onnx_array, torch_array)
        # Not vacuous: the head matters to the logits far beyond the tolerance (or to the
        # translation's length, when the shapes differ).
        logits, heard_logits = expected[2], heard[2]
        if logits.shape == heard_logits.shape:
            assert (logits - heard_logits).abs().max() > 100 * ATOL


def test_head_masks_scale_heads_not_weights(translator):
    """In torch too: an all-ones mask changes no bit, and a silenced head still
    attends (its weights are returned unchanged; only its output is dropped)."""
    model = translator.model
    src = torch.tensor([[5, 6, 7, 8]])  # (1, 4)
    ones = torch.ones(len(model.encoder_layers), model.num_heads)
    with torch.no_grad():
        memory, weights = model.encode(src, need_weights=True)
        graph = EncoderGraph(model)
        memory_ones, weights_ones = graph(src, ones)
        memory_silent, weights_silent = graph(src, torch.tensor([[1.0, 0.0]]))
    assert torch.equal(memory_ones, memory)  # exact: a product with 1.0
    assert torch.equal(weights_silent, weights[0])  # exact: the same computation
    assert not torch.equal(memory_silent, memory)
    assert not model.encoder_layers[0].self_attn.W_o._forward_pre_hooks  # hooks removed


def test_metadata_names_what_the_graphs_take_and_give(translator, sessions, exported):
    meta = json.loads((exported / METADATA_FILE).read_text())
    assert meta["src_vocab"] == translator.src_vocab.tokens
    assert meta["tgt_vocab"] == translator.tgt_vocab.tokens
    assert (meta["pad_id"], meta["bos_id"], meta["eos_id"]) == (0, 1, 2)
    for session, part in zip(sessions, ("encoder", "decoder"), strict=True):
        assert [i.name for i in session.get_inputs()] == meta[f"{part}_inputs"]
        assert [o.name for o in session.get_outputs()] == meta[f"{part}_outputs"]
    assert sessions[0].get_inputs()[0].shape == ["batch", "source_length"]
    # The grammar's words by role name every English word of the vocabulary once.
    grammar = meta["grammar"]
    words = [*grammar["singular_determiners"], *grammar["plural_determiners"], "an", "and",
             *grammar["adjectives"], *(w for part in ("nouns", "intransitive_verbs",
                                                      "transitive_verbs")
                                       for pair in grammar[part] for w in pair),
             *(w for phrase in grammar["phrases"] for w in phrase.split())]  # fmt: skip
    assert set(words) == set(translator.src_vocab.tokens[3:])
    assert sessions[1].get_inputs()[0].shape == ["batch", "target_length"]


def test_files_are_small_float32_and_valid(exported):
    """What the page downloads: ~190 kB for ~32k float32 weights (plus the graph)."""
    sizes = {}
    for name in (ENCODER_FILE, DECODER_FILE):
        path = exported / name
        sizes[name] = path.stat().st_size
        model = onnx.load(path)
        onnx.checker.check_model(model, full_check=True)
        assert {init.data_type for init in model.graph.initializer} == {onnx.TensorProto.FLOAT}
        assert model.opset_import[0].version == onnx_export.OPSET
    assert sum(sizes.values()) < 256_000, sizes


def test_bad_arguments_are_refused_by_name(translator, tmp_path):
    with pytest.raises(ValueError, match="translator"):
        onnx_export.export(translator.model, tmp_path)
    for opset in (16, 21, True, "20"):
        with pytest.raises(ValueError, match="opset"):
            onnx_export.export(translator, tmp_path, opset=opset)
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ValueError, match="out_dir"):
        onnx_export.export(translator, a_file)
    assert not list(tmp_path.glob("*.onnx"))  # refused before anything was written


@pytest.mark.parametrize("args, named", [(["--checkpoint", "missing.npz"], "--checkpoint"),
                                         (["--opset", "5"], "--opset"),
                                         (["--opset", "21"], "--opset")])
def test_the_command_line_refuses_bad_arguments_in_a_sentence(tmp_path, capsys, args, named):
    """argparse's usage line and one sentence naming the argument (exit status 2), not
    a traceback."""
    with pytest.raises(SystemExit) as exit_:
        onnx_export.main([str(tmp_path), *args])
    assert exit_.value.code == 2
    message = capsys.readouterr().err
    assert "usage: python -m tools.onnx_export" in message
    assert f"error: {named} " in message and "Traceback" not in message
    assert not list(tmp_path.glob("*.onnx"))


def test_bad_graph_inputs_are_refused_by_name(translator, tmp_path):
    with pytest.raises(ValueError, match="position_scheme"):
        DecoderGraph(Transformer(5, 6, position_scheme="rope"))
    graph, src = EncoderGraph(translator.model), torch.tensor([[5, 6]])
    with pytest.raises(ValueError, match=r"head_mask must have shape .* \(1, 2\), got \(2, 2\)"):
        graph(src, torch.ones(2, 2))
    with pytest.raises(ValueError, match="head_mask must be a float tensor"):
        graph(src, torch.ones(1, 2, dtype=torch.long))
    assert not list(tmp_path.glob("*.onnx"))  # refused before anything was written


def test_graphs_refuse_a_head_mask_of_another_shape(sessions):
    inputs = {"src": np.array([[5, 6]]), "head_mask": np.ones((2, 2), np.float32)}
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument, match="head_mask"):
        sessions[0].run(None, inputs)

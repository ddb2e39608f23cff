"""Export the tiny translator of chapter 7 to ONNX, for a page that runs it in the browser.

``python -m tools.onnx_export OUT_DIR [--checkpoint PATH] [--opset N]`` writes three
files into ``OUT_DIR`` (created if missing):

``translator_encoder.onnx``
    inputs ``src`` ``(B, S)`` int64 source ids (padded with ``pad_id``) and
    ``head_mask`` ``(Le, H)`` float32; outputs ``memory`` ``(B, S, D)`` and, per
    encoder layer ``i``, ``encoder_self_attention_i`` ``(B, H, S, S)``.
``translator_decoder.onnx``
    inputs ``tgt_in`` ``(B, T)`` int64 (``<s>`` and the prefix written so far),
    ``memory`` ``(B, S, D)``, ``src`` ``(B, S)`` (for the padding mask),
    ``self_head_mask`` and ``cross_head_mask`` ``(Ld, H)`` float32; outputs ``logits``
    ``(B, T, V)`` and, per decoder layer ``i``, ``decoder_self_attention_i``
    ``(B, H, T, T)`` and ``cross_attention_i`` ``(B, H, T, S)``.
``translator.json``
    the vocabularies, the special ids, the sizes and the names above: what a page
    needs to turn words into ``src`` and ``logits`` back into words; and the grammar's
    English words by role (:func:`grammar_tables`), with which the page tells a
    sentence of the grammar from one outside it.

B, S and T are dynamic. The decoder has no cache: greedy decoding runs it on the whole
prefix at every step (:func:`mha.translator.greedy_decode` with ``use_cache=False``),
so step ``t``'s weights are row ``t`` of the last step's maps.

**The head mask** silences heads as chapter 7 does: there, head ``h`` of an attention
is silenced by zeroing its ``Dh`` columns of ``W_o.weight`` (its rows of the book's
``W^O``), so that its context vectors no longer reach the output. Here its slice of the
merged context ``C`` is multiplied by ``head_mask[layer, h]`` on its way into ``W_o``:
``(C * m) W_o^T + b = C (W_o * m)^T + b``, so ``0.0`` silences the head exactly as
there, and ``1.0`` keeps it (a product with 1.0 changes no bit). The attention weights
are returned as computed; a silenced head still attends, it only stops being heard.

**What the exporter records.** torch's TorchScript exporter (``dynamo=False``; the
newer one needs ``onnxscript``, which this project does not install) runs the model
once on example inputs and records the operations it performs. A Python branch on a
tensor's *values* is frozen as it went on the example. Those in the path exported here:
the input checks of :mod:`mha` (never taken by valid input; they record nothing); the
choice between the fused and the explicit attention, which ``need_weights=True`` makes
without looking at values (the explicit path, which computes the weights); and whether
some query row has nothing to attend to (an all-padding row), which the example inputs
below make true, so that the masking giving such rows zero weights is in the graph (for
inputs without such a row it changes nothing). A length used as a Python ``int`` is
frozen too: the encoder graph is ``Transformer.encode`` itself, but the decoder graph
repeats ``Transformer.decode``'s few steps with the model's own layers, because mha's
causal mask is built from ``T`` as an ``int`` (:class:`DecoderGraph`). The tests check
the graphs against the torch model on other lengths, batches and padding
(tests/test_onnx_export.py).

The sinusoidal table holds ``max_len`` positions (in ``translator.json``): longer
inputs make onnxruntime raise, as the torch model does.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from mha.masks_torch import check_token_ids, source_mask
from mha.modules import MultiHeadAttention
from mha.transformer import Transformer
from mha.translator import CHECKPOINT, Translator, load_checkpoint
from mha.translator.grammar import FIXED_PHRASES
from mha.translator.lexicon import ADJECTIVES, DETERMINER_KEYS, DETERMINERS, NOUNS, VERBS

__all__ = [
    "DECODER_FILE",
    "ENCODER_FILE",
    "METADATA_FILE",
    "OPSET",
    "DecoderGraph",
    "EncoderGraph",
    "export",
    "grammar_tables",
    "main",
]

ENCODER_FILE = "translator_encoder.onnx"
DECODER_FILE = "translator_decoder.onnx"
METADATA_FILE = "translator.json"
#: ONNX opset of the graphs: the newest the TorchScript exporter writes (torch 2.13),
#: which onnxruntime 1.31 (and onnxruntime-web 1.31) runs.
OPSET = 20
_OPSETS = range(17, 21)  # 17: LayerNormalization is one op; 20: the exporter's newest


def check_head_mask(head_mask: object, name: str, num_layers: int, num_heads: int) -> None:
    """A head mask: a float ``(num_layers, num_heads)`` tensor, refused by ``name``."""
    if not isinstance(head_mask, Tensor) or not head_mask.dtype.is_floating_point:
        kind = head_mask.dtype if isinstance(head_mask, Tensor) else type(head_mask).__name__
        raise ValueError(f"{name} must be a float tensor (1.0 keeps a head), got {kind}")
    if tuple(head_mask.shape) != (num_layers, num_heads):
        raise ValueError(
            f"{name} must have shape (layers, heads) = {(num_layers, num_heads)}, "
            f"got {tuple(head_mask.shape)}"
        )


@contextmanager
def _head_masks(attentions: Sequence[MultiHeadAttention], head_mask: Tensor) -> Iterator[None]:
    """While inside, attention ``i``'s head ``h`` reaches ``W_o`` scaled by
    ``head_mask[i, h]`` (a forward pre-hook on each ``W_o``, removed on exit: the
    model itself is not changed)."""

    def scale_heads(row: Tensor, attention: MultiHeadAttention):
        H, Dh = attention.num_heads, attention.head_dim
        # (H,) -> (H, 1) -> (H, Dh) -> (D,): head h's value over its Dh features
        per_feature = row[:, None].expand(H, Dh).reshape(H * Dh)

        def hook(module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
            return (args[0] * per_feature.to(args[0].dtype), *args[1:])  # (B, T, D) * (D,)

        return hook

    handles = [
        attention.W_o.register_forward_pre_hook(scale_heads(head_mask[i], attention))
        for i, attention in enumerate(attentions)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class EncoderGraph(nn.Module):
    """``model.encode`` with every layer's self-attention weights and a head mask:
    what ``translator_encoder.onnx`` computes.

    ``forward(src, head_mask)``: ``(B, S)`` ids and ``(Le, H)`` floats ->
    ``(memory (B, S, D), weights_0 (B, H, S, S), ...)``, one map per encoder layer.
    """

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, head_mask: Tensor) -> tuple[Tensor, ...]:
        layers = self.model.encoder_layers
        check_head_mask(head_mask, "head_mask", len(layers), self.model.num_heads)
        with _head_masks([layer.self_attn for layer in layers], head_mask):
            memory, weights = self.model.encode(src, need_weights=True)  # (B, S, D)
        return (memory, *weights)


class DecoderGraph(nn.Module):
    """``model.decode`` (no cache) with every layer's attention weights and head masks:
    what ``translator_decoder.onnx`` computes.

    ``forward(tgt_in, memory, src, self_head_mask, cross_head_mask)``: ``(B, T)`` ids,
    ``(B, S, D)``, ``(B, S)`` ids and two ``(Ld, H)`` masks -> ``(logits (B, T, V),
    self_0 (B, H, T, T), ..., cross_0 (B, H, T, S), ...)``: all the self-attention
    maps, then all the cross-attention maps, one per decoder layer. Only for models
    whose positions are added to the embeddings (``position_scheme`` ``"sinusoidal"`` or
    ``"none"``): RoPE and ALiBi act inside self-attention, which this graph does not
    pass them to.
    """

    def __init__(self, model: Transformer):
        super().__init__()
        if model.position_scheme not in ("sinusoidal", "none"):
            raise ValueError(
                f"the decoder graph needs position_scheme 'sinusoidal' or 'none', got "
                f"{model.position_scheme!r}"
            )
        self.model = model

    def forward(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src: Tensor,
        self_head_mask: Tensor,
        cross_head_mask: Tensor,
    ) -> tuple[Tensor, ...]:
        layers, num_heads = self.model.decoder_layers, self.model.num_heads
        check_head_mask(self_head_mask, "self_head_mask", len(layers), num_heads)
        check_head_mask(cross_head_mask, "cross_head_mask", len(layers), num_heads)
        check_token_ids(tgt_in, "tgt_in")
        check_token_ids(src, "src")
        model = self.model
        # Transformer.decode, step for step, but for its causal mask: mha builds it from
        # T as a Python int (causal_mask checks it is one), which the tracer would freeze
        # into a constant; here it is built from tensors, so T stays an axis of the graph.
        positions = torch.arange(tgt_in.shape[1], device=tgt_in.device)  # (T,)
        causal = positions[None, :] <= positions[:, None]  # (1, T) <= (T, 1) -> (T, T)
        padding = (tgt_in != model.pad_id)[:, None, None, :]  # (B, T) -> (B, 1, 1, T)
        self_mask = padding & causal  # (B, 1, 1, T) & (T, T) -> (B, 1, T, T)
        cross_mask = source_mask(src, model.pad_id)  # (B, 1, 1, S)
        x = model.embedding_dropout(model._embed(tgt_in, model.tgt_embedding, "tgt_in"))
        self_weights, cross_weights = [], []
        with (
            _head_masks([layer.self_attn for layer in layers], self_head_mask),
            _head_masks([layer.cross_attn for layer in layers], cross_head_mask),
        ):
            for layer in layers:
                x, sw, cw = layer(x, memory, self_mask, cross_mask, need_weights=True)
                self_weights.append(sw)  # (B, H, T, T)
                cross_weights.append(cw)  # (B, H, T, S)
        logits = model.output(model.decoder_norm(x))  # (B, T, D) @ (D, V) -> (B, T, V)
        return (logits, *self_weights, *cross_weights)


def _names(model: Transformer) -> dict[str, list[str]]:
    enc, dec = range(len(model.encoder_layers)), range(len(model.decoder_layers))
    return {
        "encoder_inputs": ["src", "head_mask"],
        "encoder_outputs": ["memory", *(f"encoder_self_attention_{i}" for i in enc)],
        "decoder_inputs": ["tgt_in", "memory", "src", "self_head_mask", "cross_head_mask"],
        "decoder_outputs": [
            "logits",
            *(f"decoder_self_attention_{i}" for i in dec),
            *(f"cross_attention_{i}" for i in dec),
        ],
    }


def grammar_tables() -> dict[str, list]:
    """The English side of :mod:`mha.translator.grammar`, as the page checks a sentence
    against it: determiners by number (``"a"`` becomes ``"an"`` before a vowel), the
    adjectives, nouns and verbs as ``[singular, plural]``, and the fixed phrases. A
    sentence is a fixed phrase, or clauses joined by ``"and"``, each ``NP V``, ``NP V
    and V`` or ``NP V NP``, where ``NP`` is a determiner, adjectives and a noun of one
    number, and the verb agrees with its subject (``make_example``, ``then=``; more than
    one adjective and more than one clause only in chapter 7's probes)."""
    singular = [DETERMINERS[d]["en"][0] for d in DETERMINER_KEYS]  # type: ignore[index]
    plural = [DETERMINERS[d]["en"][1] for d in DETERMINER_KEYS]  # type: ignore[index]
    return {
        "singular_determiners": sorted(set(singular)),
        "plural_determiners": sorted(set(plural)),
        "adjectives": [a.en for a in ADJECTIVES],
        "nouns": [[n.en, n.en_plural] for n in NOUNS],
        "intransitive_verbs": [[v.en, v.en_plural] for v in VERBS if not v.transitive],
        "transitive_verbs": [[v.en, v.en_plural] for v in VERBS if v.transitive],
        "phrases": [en for en, _ in FIXED_PHRASES],
    }


def _example_inputs(model: Transformer) -> tuple[Tensor, Tensor]:
    """``src`` (2, 5) and ``tgt_in`` (2, 4): the first rows padded at the end, the second
    all padding, so that the rows with nothing to attend to are handled in the graph
    (see the module's docstring). Lengths differ, so that no two axes are confused."""
    pad, word = model.pad_id, 3  # any id but pad_id
    src = torch.tensor([[word] * 3 + [pad] * 2, [pad] * 5])  # (2, 5)
    tgt_in = torch.tensor([[1, word, pad, pad], [pad] * 4])  # (2, 4)
    return src, tgt_in


# What the TorchScript exporter says while it traces, each expected and why it is safe:
# it announces its own deprecation, twice (the legacy exporter, and a helper it calls
# itself; the dynamo exporter would need onnxscript, which this project does not
# install); and the tracer warns about every Python branch on a tensor's value, in mha's
# code and in this module's head-mask check, each accounted for in the module's docstring
# and checked by tests/test_onnx_export.py. Only these, and only from mha, torch.onnx or
# this file: anything else is passed on (an error under the tests' settings).
_EXPECTED_WARNINGS = (
    (DeprecationWarning, r"^You are using the legacy TorchScript-based ONNX export"),
    (DeprecationWarning, r"^The feature will be removed\. Please remove usage of this function"),
    (torch.jit.TracerWarning, r"^Converting a tensor to a Python boolean"),
)


@contextmanager
def _expected_export_warnings() -> Iterator[None]:
    """Swallow the warnings of ``_EXPECTED_WARNINGS``; re-issue every other one."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    places = (str(Path(sys.modules["mha"].__file__).parent), str(Path(torch.onnx.__file__).parent),
              __file__)  # fmt: skip
    for w in caught:
        expected = any(
            issubclass(w.category, category) and re.search(pattern, str(w.message))
            for category, pattern in _EXPECTED_WARNINGS
        )
        if not (expected and w.filename.startswith(places)):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _export_graph(
    graph: nn.Module,
    inputs: tuple[Tensor, ...],
    path: Path,
    input_names: list[str],
    output_names: list[str],
    dynamic_axes: dict[str, dict[int, str]],
    opset: int,
) -> None:
    # Grad mode on, even if the caller turned it off: under no_grad the explicit
    # attention takes softmax(..., out=scores), which the exporter cannot translate.
    with _expected_export_warnings(), torch.enable_grad():
        torch.onnx.export(
            graph, inputs, str(path), dynamo=False, opset_version=opset,
            input_names=input_names, output_names=output_names, dynamic_axes=dynamic_axes,
        )  # fmt: skip


def export(
    translator: Translator, out_dir: str | os.PathLike[str], *, opset: int = OPSET
) -> dict[str, Path]:
    """Write the encoder and decoder graphs and their metadata into ``out_dir``.

    Parameters
    ----------
    translator : Translator
        E.g. :func:`mha.translator.load_pretrained`'s; not changed (a float32 copy of
        its model is exported).
    out_dir : path-like
        Created if missing; files of the same names are replaced.
    opset : int
        ONNX opset, 17 to 20.

    Returns
    -------
    dict
        ``{"encoder": path, "decoder": path, "metadata": path}``.
    """
    if not isinstance(translator, Translator):
        raise ValueError(f"translator must be a mha.translator.Translator, got "
                         f"{type(translator).__name__}")  # fmt: skip
    if isinstance(opset, bool) or not isinstance(opset, int) or opset not in _OPSETS:
        raise ValueError(f"opset must be an int in [{_OPSETS[0]}, {_OPSETS[-1]}], got {opset!r}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir {str(out)!r} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)

    model = copy.deepcopy(translator.model).to(torch.float32).eval().requires_grad_(False)
    names = _names(model)
    num_heads = model.num_heads
    src, tgt_in = _example_inputs(model)
    enc_mask = torch.ones(len(model.encoder_layers), num_heads)  # (Le, H)
    dec_mask = torch.ones(len(model.decoder_layers), num_heads)  # (Ld, H)
    encoder, decoder = EncoderGraph(model), DecoderGraph(model)
    memory = encoder(src, enc_mask)[0]  # (B, S, D)

    # Every axis but the widths is dynamic: batch, source and target lengths.
    source = {0: "batch", 1: "source_length"}  # (B, S) and (B, S, D)
    target = {0: "batch", 1: "target_length"}  # (B, T) and (B, T, V)
    enc_axes = {"src": source, "memory": source}
    for name in names["encoder_outputs"][1:]:  # (B, H, S, S)
        enc_axes[name] = {0: "batch", 2: "source_length", 3: "source_length"}
    dec_axes = {"tgt_in": target, "memory": source, "src": source, "logits": target}
    for name in names["decoder_outputs"][1:]:  # (B, H, T, T) or (B, H, T, S)
        keys = "source_length" if name.startswith("cross") else "target_length"
        dec_axes[name] = {0: "batch", 2: "target_length", 3: keys}
    paths = {"encoder": out / ENCODER_FILE, "decoder": out / DECODER_FILE,
             "metadata": out / METADATA_FILE}  # fmt: skip
    _export_graph(encoder, (src, enc_mask), paths["encoder"], names["encoder_inputs"],
                  names["encoder_outputs"], enc_axes, opset)  # fmt: skip
    _export_graph(decoder, (tgt_in, memory, src, dec_mask, dec_mask), paths["decoder"],
                  names["decoder_inputs"], names["decoder_outputs"], dec_axes, opset)  # fmt: skip

    metadata = {
        "encoder": ENCODER_FILE,
        "decoder": DECODER_FILE,
        **names,
        "src_vocab": translator.src_vocab.tokens,
        "tgt_vocab": translator.tgt_vocab.tokens,
        "pad_id": translator.src_vocab.pad_id,
        "bos_id": translator.tgt_vocab.bos_id,
        "eos_id": translator.tgt_vocab.eos_id,
        "num_heads": num_heads,
        "num_encoder_layers": len(model.encoder_layers),
        "num_decoder_layers": len(model.decoder_layers),
        "max_len": model.max_len,
        "opset": opset,
        "grammar": grammar_tables(),
    }
    paths["metadata"].write_text(json.dumps(metadata, ensure_ascii=False, indent=1) + "\n")
    return paths


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.onnx_export",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("out_dir", type=Path, help="where the .onnx files and the JSON go")
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT,
                        help="a translator checkpoint (default: the shipped one)")  # fmt: skip
    parser.add_argument("--opset", type=int, default=OPSET,
                        help=f"{_OPSETS[0]} to {_OPSETS[-1]} (default {OPSET})")  # fmt: skip
    args = parser.parse_args(argv)
    # A bad argument ends with argparse's usage line and a sentence, not a traceback.
    if not args.checkpoint.is_file():
        parser.error(f"--checkpoint {str(args.checkpoint)!r} is not a file")
    if args.opset not in _OPSETS:
        parser.error(f"--opset must be in [{_OPSETS[0]}, {_OPSETS[-1]}], got {args.opset}")
    paths = export(load_checkpoint(args.checkpoint), args.out_dir, opset=args.opset)
    for path in paths.values():
        print(f"{path}  {path.stat().st_size} bytes  sha256 {_sha256(path)[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

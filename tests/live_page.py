"""The live translator's page (book/notebooks/93_translator_live), driven in Chromium by
tests/test_site.py, and what the Python model says it must show.

The page runs chapter 7's shipped model, exported to ONNX, in ONNX Runtime Web
(book/_static/live-translator.js). :func:`translate_in_page` hands it many sentences in
one visit, through ``window.liveTranslator.translate``: the path the page's button
takes, the drawing included. :func:`expected` computes, with the torch model, what each
must give: ``greedy_decode``'s tokens, and every attention map of the decoder's last
step (teacher-forced on those tokens, as test_onnx_export does), with heads silenced as
chapter 7 silences them (their columns of ``W_o.weight`` zeroed).

Tolerances: the page computes in float32 in another runtime; its weights are held to the
torch model's within ``ATOL`` (1e-4, absolute; weights are at most 1, and onnxruntime
matched torch to about 3e-6 on these sentences). Equal tokens are asked of the page only
where every choice of the torch model leads its runner-up by more than ``2 * ATOL``
(:func:`mha.translator.greedy_margins`), so a difference means a wrong page, not a
near-tie.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cache

import numpy as np

PAGE = "book/notebooks/93_translator_live.html"
ATOL = 1e-4
# The page's names of the attentions, and chapter 7's (Transformer.get_submodule) names.
ATTENTIONS = {"encoder": "encoder_layers.{}.self_attn",
              "decoderSelf": "decoder_layers.{}.self_attn",
              "cross": "decoder_layers.{}.cross_attn"}  # fmt: skip
# Heads silenced in the tests, as the page names them (attention:layer:head), with each
# sentence they are tried on: the encoder's head 0 breaks most translations (chapter 7).
SILENCED = [["encoder:0:0"], ["cross:0:1"], ["decoderSelf:0:0"], ["encoder:0:1", "cross:0:0"]]

TRANSLATE_ALL_JS = """
async (cases) => {
  const out = [];
  for (const c of cases) out.push(await window.liveTranslator.translate(c.sentence, c.silenced));
  return out;
}
"""


@cache
def translator():
    from mha.translator import load_pretrained

    return load_pretrained()


def sentences() -> list[str]:
    """24 held-out sentences (never trained on), 6 of the compositional split (held-out
    combinations: the sentences chapter 7's trap model gets wrong) and chapter 7's
    probes of what the model was not trained for, 4 of each kind (two adjectives on a
    noun, two clauses)."""
    from mha.translator import CHECKPOINT, generate_corpus, length_probes, read_metadata

    config = read_metadata(CHECKPOINT)["extra"]["train_config"]
    corpus = generate_corpus(config["seed"], num_train=config["num_train"],
                             num_heldout=config["num_heldout"],
                             num_compositional=config["num_compositional"])  # fmt: skip
    probes = length_probes(seed=0, num=4, exclude=corpus)
    return [e.english for e in corpus.heldout[:24]] + [
        e.english for e in corpus.compositional[:6]] + [
        e.english for kind in probes.values() for e in kind]


def cases() -> list[dict]:
    """The first few sentences with heads silenced, then every sentence with every
    head heard (the page is left with none silenced)."""
    found = [{"sentence": s, "silenced": heads}
             for s, heads in zip(sentences()[:len(SILENCED)], SILENCED, strict=True)]
    return found + [{"sentence": s, "silenced": []} for s in sentences()]


def silenced_model(heads: list[str]):
    """Chapter 7's ``silence`` for each head named as the page names it."""
    import torch

    model = translator().model
    if not heads:
        return model
    quiet = copy.deepcopy(model)
    head_dim = model.d_model // model.num_heads
    with torch.no_grad():
        for name in heads:
            kind, layer, head = name.split(":")
            attention = quiet.get_submodule(ATTENTIONS[kind].format(layer))
            attention.W_o.weight[:, int(head) * head_dim:(int(head) + 1) * head_dim] = 0.0
    return quiet


@dataclass
class Expected:
    target: list[str]  # the words written, </s> included when it is written
    margin: float  # the smallest lead of a chosen token over its runner-up
    maps: dict[str, list[np.ndarray]]  # page's attention name -> per layer (H, R, C)


def expected(sentence: str, heads: list[str]) -> Expected:
    import torch

    from mha.threads import num_threads
    from mha.translator import greedy_decode, greedy_margins

    t = translator()
    model = silenced_model(heads)
    tgt = t.tgt_vocab
    src = t.source_ids([sentence])  # (1, S)
    with num_threads(1), torch.no_grad():
        ids, logits = greedy_decode(model, src, tgt.bos_id, tgt.eos_id, return_logits=True)
        margin = float(greedy_margins(ids, logits, tgt.eos_id).min())
        tgt_in = torch.cat([torch.tensor([[tgt.bos_id]]), ids[:, :-1]], dim=1)  # (1, L)
        memory, enc = model.encode(src, need_weights=True)
        _, dec_self, cross = model.decode(tgt_in, memory, src, need_weights=True)
    words = [tgt.tokens[i] for i in ids[0].tolist()]
    maps = {"encoder": [m[0].numpy() for m in enc],
            "decoderSelf": [m[0].numpy() for m in dec_self],
            "cross": [m[0].numpy() for m in cross]}  # (1, H, R, C) -> (H, R, C)
    return Expected(words, margin, maps)


def translate_in_page(page, all_cases: list[dict]) -> list[dict]:
    return page.evaluate(TRANSLATE_ALL_JS, all_cases)


def compare(case: dict, got: dict) -> list[str]:
    """What the page got wrong for one case, one line each."""
    want = expected(case["sentence"], case["silenced"])
    where = f"{case['sentence']!r} silenced {case['silenced']}"
    problems = []
    if want.margin <= 2 * ATOL:
        return [f"{where}: a near-tie in the torch model ({want.margin:.2e}): pick another"]
    if got.get("problem"):
        return [f"{where}: the page refused it: {got['problem']}"]
    if got["target"] != want.target:
        problems.append(f"{where}: page {got['target']} != greedy_decode {want.target}")
        return problems
    for kind, layers in want.maps.items():
        for layer, torch_map in enumerate(layers):
            page_map = np.array(got["maps"][kind][layer], dtype=np.float64)
            if page_map.shape != torch_map.shape:
                problems.append(f"{where}: {kind} layer {layer} shape {page_map.shape} "
                                f"!= {torch_map.shape}")
                continue
            error = float(np.abs(page_map - torch_map).max())
            if error > ATOL:
                problems.append(f"{where}: {kind} layer {layer} off by {error:.2e}")
    return problems


def metadata(html_root) -> dict:
    return json.loads((html_root / "_vendor" / "translator" / "translator.json").read_text())

"""How well a translator does: whole-sentence exact match on the corpus' splits."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mha.threads import num_threads
from mha.translator.corpus import Corpus
from mha.translator.decoding import Translator, _pad, greedy_decode, greedy_margins
from mha.translator.grammar import Example

__all__ = ["closest_deciding_margin", "evaluate", "exact_match"]


def exact_match(
    translator: Translator, examples: Sequence[Example], batch_size: int = 1000
) -> float:
    """Fraction of ``examples`` whose greedy translation equals the reference exactly.

    Parameters
    ----------
    translator : Translator
    examples : sequence of Example
    batch_size : int
        Sentences decoded at once.

    Returns
    -------
    float
        Whole-sentence accuracy in [0, 1].
    """
    if not examples:
        raise ValueError("examples is empty")
    hits = 0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        out = translator.translate([list(e.source) for e in chunk])
        hits += sum(o == e.spanish for o, e in zip(out, chunk, strict=True))
    return hits / len(examples)


def closest_deciding_margin(
    translator: Translator, examples: Sequence[Example], batch_size: int = 1000
) -> float:
    """The smallest logit margin (:func:`~mha.translator.greedy_margins`) among the
    choices that decide :func:`exact_match`: every step while the translation still
    equals the reference, and the first step where it does not.

    Another CPU rounds the logits differently (by about 1e-5 for the shipped float32
    model); it can change the exact-match score only if this margin is within that.
    """
    if not examples:
        raise ValueError("examples is empty")
    vocab = translator.tgt_vocab
    closest = float("inf")
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        src = translator.source_ids([list(e.source) for e in chunk])  # (B, S)
        with num_threads(1), torch.no_grad():
            ids, logits = greedy_decode(translator.model, src, vocab.bos_id, vocab.eos_id,
                                        return_logits=True)  # fmt: skip
        margins = greedy_margins(ids, logits, vocab.eos_id)  # (B, L)
        ref = _pad([vocab.encode(e.target, add_eos=True) for e in chunk], -1)  # (B, R)
        steps = min(ids.shape[1], ref.shape[1])
        agree = ids[:, :steps] == ref[:, :steps]  # (B, steps)
        # step t decides while every earlier step agreed with the reference
        deciding = torch.ones_like(agree)
        deciding[:, 1:] = agree[:, :-1].cummin(dim=1).values
        closest = min(closest, float(margins[:, :steps][deciding].min()))
    return closest


def evaluate(translator: Translator, corpus: Corpus) -> dict[str, float]:
    """Exact match on the random held-out split, the compositional split and the
    fixed phrases (which are training sentences: a memorisation check)."""
    phrases = list(dict.fromkeys(e for e in corpus.train if e.kind == "phrase"))
    return {
        "heldout": exact_match(translator, corpus.heldout),
        "compositional": exact_match(translator, corpus.compositional),
        "phrases": exact_match(translator, phrases),
    }

"""How well a translator does: whole-sentence exact match on the corpus' splits."""

from __future__ import annotations

from collections.abc import Sequence

from mha.translator.corpus import Corpus, Example
from mha.translator.decoding import Translator

__all__ = ["evaluate", "exact_match"]


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


def evaluate(translator: Translator, corpus: Corpus) -> dict[str, float]:
    """Exact match on the random held-out split, the compositional split and the
    fixed phrases (which are training sentences: a memorisation check)."""
    phrases = list(dict.fromkeys(e for e in corpus.train if e.kind == "phrase"))
    return {
        "heldout": exact_match(translator, corpus.heldout),
        "compositional": exact_match(translator, corpus.compositional),
        "phrases": exact_match(translator, phrases),
    }

"""The corpus the translator trains on: its train, held-out and compositional splits.

:func:`generate_corpus` samples distinct sentences of :mod:`mha.translator.grammar`
into three splits (all seeded, no sentence in two of them):

* ``train`` and a random ``heldout`` split drawn from the same distribution;
* a **compositional** split: a few adjective-noun pairs and a few nouns in the object
  role are chosen at random, every sentence that contains one of them is kept out of
  training, and the compositional test set is drawn from those sentences. The model
  has seen each word, but never these combinations.

Fixed phrases are always in training (there is nothing to generalise in "de nada").
Sentences longer than any in training, and a corpus split by length instead, are in
:mod:`mha.translator.length_split`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from mha.translator.grammar import (
    Example,
    grammar_size,
    grammar_words,
    phrase_examples,
    sample_sentence,
)
from mha.translator.lexicon import ADJECTIVE_KEYS, NOUN_KEYS, NOUNS
from mha.translator.vocab import Vocab

__all__ = ["Corpus", "generate_corpus"]


@dataclass
class Corpus:
    """The generated splits and vocabularies.

    Attributes
    ----------
    train, heldout, compositional : list of Example
        Disjoint by source sentence. ``train`` also holds every fixed phrase.
    src_vocab, tgt_vocab : Vocab
        English and Spanish vocabularies (the whole lexicon, independent of the seed).
    heldout_pairs : frozenset of (adjective, noun)
        Adjective-noun pairs that never occur in ``train``.
    heldout_objects : frozenset of str
        Nouns that never occur in the object role in ``train``.
    seed : int
    """

    train: list[Example]
    heldout: list[Example]
    compositional: list[Example]
    src_vocab: Vocab
    tgt_vocab: Vocab
    heldout_pairs: frozenset[tuple[str, str]]
    heldout_objects: frozenset[str]
    seed: int
    settings: dict[str, object] = field(default_factory=dict)

    def is_compositional(self, example: Example) -> bool:
        """True if ``example`` uses a held-out adjective-noun pair or object noun."""
        return bool(example.pairs & self.heldout_pairs) or (
            example.object_noun in self.heldout_objects
        )

    @property
    def max_source_len(self) -> int:
        return max(len(e.source) for e in self.train)

    @property
    def max_target_len(self) -> int:
        return max(len(e.target) for e in self.train)


def generate_corpus(
    seed: int = 0,
    num_train: int = 10000,
    num_heldout: int = 1000,
    num_compositional: int = 1000,
    adjective_prob: float = 0.5,
    num_heldout_pairs: int = 12,
    num_heldout_objects: int = 2,
    phrase_repeats: int = 50,
) -> Corpus:
    """Generate the seeded corpus and its three disjoint splits.

    Parameters
    ----------
    seed : int
        Seeds everything: the held-out combinations and the sampled sentences.
    num_train, num_heldout, num_compositional : int
        Number of distinct grammar sentences in each split. ``train`` additionally
        holds each fixed phrase ``phrase_repeats`` times (so the model sees them as
        often as a typical sentence is seen during training).
    adjective_prob : float
        Probability that a noun phrase carries an adjective.
    num_heldout_pairs : int
        Adjective-noun pairs kept out of training (one per noun while possible).
    num_heldout_objects : int
        Nouns that never appear in the object role in training (half of them
        feminine, half masculine, rounded).

    Returns
    -------
    Corpus
    """
    for name, value in (
        ("num_train", num_train),
        ("num_heldout", num_heldout),
        ("num_compositional", num_compositional),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if not 0.0 <= adjective_prob <= 1.0:
        raise ValueError(f"adjective_prob must be in [0, 1], got {adjective_prob}")
    if not 0 < num_heldout_objects < len(NOUNS):
        raise ValueError(f"num_heldout_objects must be in [1, {len(NOUNS) - 1}]")
    total = num_train + num_heldout + num_compositional
    if total > grammar_size() // 4:  # beyond that, rejection sampling crawls
        raise ValueError(
            f"the grammar cannot supply {total} distinct sentences quickly (it has "
            f"{grammar_size()}); ask for at most a quarter of that"
        )
    # Python's generator, not NumPy's: the sampler makes ~10^5 scalar draws, which
    # random.Random does several times faster.
    rng = random.Random(seed)

    # 1. The combinations the compositional split is about. Each held-out pair gets a
    #    different noun (then a second round) so that no noun loses most adjectives.
    noun_order = rng.sample(NOUN_KEYS, len(NOUN_KEYS))
    pairs: list[tuple[str, str]] = []
    for k in range(num_heldout_pairs):
        noun = noun_order[k % len(noun_order)]
        taken = {a for a, n in pairs if n == noun}
        pairs.append((rng.choice([a for a in ADJECTIVE_KEYS if a not in taken]), noun))
    masc = [n.en for n in NOUNS if n.gender == "m"]
    fem = [n.en for n in NOUNS if n.gender == "f"]
    n_fem = num_heldout_objects // 2
    objects = rng.sample(fem, n_fem) + rng.sample(masc, num_heldout_objects - n_fem)
    heldout_pairs = frozenset(pairs)
    heldout_objects = frozenset(objects)

    # 2. Sample distinct sentences until every split is full. A sentence is unique by
    #    its source; it lands in the compositional pool if it uses a held-out
    #    combination, otherwise in the ordinary pool (train + random held-out).
    seen: set[tuple[str, ...]] = set()
    ordinary: list[Example] = []
    compositional: list[Example] = []
    need = num_train + num_heldout
    attempts = 0
    while len(ordinary) < need or len(compositional) < num_compositional:
        attempts += 1
        if attempts > 50 * (need + num_compositional):
            raise ValueError(
                f"the grammar cannot supply {need} ordinary and {num_compositional} "
                f"compositional distinct sentences with these settings; ask for fewer"
            )
        ex = sample_sentence(rng, adjective_prob)
        if ex.source in seen:
            continue
        seen.add(ex.source)
        hard = bool(ex.pairs & heldout_pairs) or ex.object_noun in heldout_objects
        if hard:
            if len(compositional) < num_compositional:
                compositional.append(ex)
        elif len(ordinary) < need:
            ordinary.append(ex)

    # 3. The random held-out split: a random subset of the ordinary pool.
    rng.shuffle(ordinary)
    heldout = ordinary[:num_heldout]
    train = ordinary[num_heldout:]
    train += phrase_examples() * phrase_repeats

    src_words, tgt_words = grammar_words()
    settings = {
        "num_train": num_train,
        "num_heldout": num_heldout,
        "num_compositional": num_compositional,
        "adjective_prob": adjective_prob,
        "num_heldout_pairs": num_heldout_pairs,
        "num_heldout_objects": num_heldout_objects,
        "phrase_repeats": phrase_repeats,
    }
    return Corpus(
        train=train,
        heldout=heldout,
        compositional=compositional,
        src_vocab=Vocab(src_words),
        tgt_vocab=Vocab(tgt_words),
        heldout_pairs=heldout_pairs,
        heldout_objects=heldout_objects,
        seed=seed,
        settings=settings,
    )

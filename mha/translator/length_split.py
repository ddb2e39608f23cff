"""Sentences longer than training: :func:`length_probes`, and the length split.

:func:`length_probes` builds longer sentences than any in the corpus of
:mod:`mha.translator.corpus` (one more adjective, two clauses joined by "and") to
measure length generalisation; :func:`generate_length_split` splits by length instead:
training sentences of at most ``max_train_words`` source words (one clause, or two
short clauses joined by "and"), a held-out set of those lengths, and a set of longer
two-clause sentences, which ``python -m mha.translator.lengths`` trains and scores on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from mha.translator.corpus import Corpus
from mha.translator.grammar import (
    Example,
    grammar_words,
    join_clauses,
    make_example,
    sample_noun_phrase,
    sample_sentence,
)
from mha.translator.lexicon import INTRANSITIVE_VERBS, TRANSITIVE_VERBS
from mha.translator.vocab import Vocab

__all__ = ["MAX_SPLIT_WORDS", "LengthSplit", "generate_length_split", "length_probes"]


# --------------------------------------------------------------------------- probes


def length_probes(
    seed: int = 0, num: int = 200, exclude: Corpus | None = None
) -> dict[str, list[Example]]:
    """Sentences longer than any in training, for measuring length generalisation.

    Parameters
    ----------
    seed : int
        Seed of the probe generator (independent of the corpus seed).
    num : int
        Distinct sentences per probe.
    exclude : Corpus, optional
        If given, probe sentences that use one of its held-out combinations are
        skipped, so a failure is about length and not about composition.

    Returns
    -------
    dict
        ``"one more adjective"``: a noun phrase with two adjectives (English order
        "small black", Spanish mirror order "negro pequeño");
        ``"two clauses"``: two simple sentences joined by "and".
    """
    rng = random.Random(seed)
    probes: dict[str, list[Example]] = {"one more adjective": [], "two clauses": []}

    def ok(ex: Example) -> bool:
        return exclude is None or not exclude.is_compositional(ex)

    seen: set[tuple[str, ...]] = set()
    while len(probes["one more adjective"]) < num:
        subject = sample_noun_phrase(rng, 0.0, num_adjectives=2)
        if rng.random() < 0.5:
            ex = make_example(subject, rng.choice(INTRANSITIVE_VERBS))
        else:
            ex = make_example(subject, rng.choice(TRANSITIVE_VERBS), sample_noun_phrase(rng, 0.0))
        if ex.source not in seen and ok(ex):
            seen.add(ex.source)
            probes["one more adjective"].append(ex)
    while len(probes["two clauses"]) < num:
        first = sample_noun_phrase(rng, 0.0)
        second = make_example(sample_noun_phrase(rng, 0.0), rng.choice(INTRANSITIVE_VERBS))
        ex = make_example(first, rng.choice(INTRANSITIVE_VERBS), then=second)
        if ex.source not in seen and ok(ex):
            seen.add(ex.source)
            probes["two clauses"].append(ex)
    return probes


# --------------------------------------------------------------------- length split

# The longest clause: determiner, adjective, noun, verb, determiner, adjective, noun.
_MAX_CLAUSE_WORDS = 7
#: Longest sentence of the length split: two longest clauses joined by "and".
MAX_SPLIT_WORDS = 2 * _MAX_CLAUSE_WORDS + 1
# The shortest two-clause sentence, "the cat sleeps and the dog runs".
_MIN_TWO_CLAUSE_WORDS = 7


@dataclass
class LengthSplit(Corpus):
    """A :class:`Corpus` split by sentence length (see :func:`generate_length_split`).

    ``train`` and ``heldout`` hold sentences of at most ``max_train_words`` source words,
    drawn from one distribution; ``compositional`` is empty (no combination is held
    out), and ``longer`` holds sentences of ``max_train_words + 1`` to
    :data:`MAX_SPLIT_WORDS` source words, the same number of each length. A
    ``LengthSplit`` can be passed to :func:`mha.translator.train` as its ``corpus``.

    Attributes
    ----------
    longer : list of Example
        Longer than every sentence of ``train`` and ``heldout``, disjoint from both.
    max_train_words : int
        The longest source sentence (in words) of ``train`` and ``heldout``.
    """

    longer: list[Example] = field(default_factory=list)
    max_train_words: int = 0

    @property
    def longer_lengths(self) -> list[int]:
        """The source lengths (in words) of ``longer``, shortest first."""
        return list(range(self.max_train_words + 1, MAX_SPLIT_WORDS + 1))


def generate_length_split(
    seed: int = 0,
    num_train: int = 10000,
    num_heldout: int = 1000,
    num_longer: int = 1000,
    max_train_words: int = 10,
    two_clause_prob: float = 0.5,
    adjective_prob: float = 0.5,
) -> LengthSplit:
    """Sentences of one grammar, split by length: short ones to train on, long ones to test.

    A sentence is one clause of the corpus grammar (``NP V``, ``NP V and V``, ``NP V NP``)
    or, with probability ``two_clause_prob``, two of them joined by "and" ("the cat
    sleeps and my dogs see a cow" -> "el gato duerme y mis perros ven a una vaca"):
    3 to 15 source words. Sentences of at most ``max_train_words`` words go to ``train``
    and to a random ``heldout`` set of the same lengths; longer ones are test sentences.
    Training thus sees two-clause sentences, but only short ones: a longer sentence has
    no new construction, only more words, and the two-clause sentences of the test
    put familiar clauses at positions (and distances) never seen in training. No fixed
    phrases: the measure is about the grammar.

    Parameters
    ----------
    seed : int
        Seeds every sampled sentence and the train/held-out shuffle.
    num_train, num_heldout : int
        Distinct sentences of at most ``max_train_words`` words in each set.
    num_longer : int
        Distinct longer sentences, divided equally among the lengths
        ``max_train_words + 1 .. 15`` (so that each length is measured as precisely;
        must be a multiple of their number).
    max_train_words : int
        Longest training sentence, in source words, in ``[7, 14]``: at least the
        shortest two-clause sentence, and below the longest.
    two_clause_prob : float
        Probability that a sampled sentence has two clauses, in ``(0, 1]``.
    adjective_prob : float
        Probability that a noun phrase carries an adjective.

    Returns
    -------
    LengthSplit
        ``train``, ``heldout`` and ``longer``, disjoint by source sentence, with the
        corpus' vocabularies (the whole lexicon).
    """
    for name, value in (
        ("num_train", num_train),
        ("num_heldout", num_heldout),
        ("num_longer", num_longer),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not _MIN_TWO_CLAUSE_WORDS <= max_train_words < MAX_SPLIT_WORDS:
        raise ValueError(
            f"max_train_words must be in [{_MIN_TWO_CLAUSE_WORDS}, {MAX_SPLIT_WORDS - 1}] "
            f"(two-clause sentences have {_MIN_TWO_CLAUSE_WORDS} to {MAX_SPLIT_WORDS} "
            f"words), got {max_train_words!r}"
        )
    lengths = range(max_train_words + 1, MAX_SPLIT_WORDS + 1)
    if num_longer % len(lengths):
        raise ValueError(
            f"num_longer={num_longer} must be a multiple of the {len(lengths)} longer "
            f"lengths {lengths.start}..{lengths.stop - 1} (the same number of each)"
        )
    if not 0.0 < two_clause_prob <= 1.0:
        raise ValueError(f"two_clause_prob must be in (0, 1], got {two_clause_prob}")
    if not 0.0 <= adjective_prob <= 1.0:
        raise ValueError(f"adjective_prob must be in [0, 1], got {adjective_prob}")
    rng = random.Random(seed)

    # 1. Sample distinct sentences; each lands by its length in the short pool (train +
    #    held-out) or in the bucket of its length, until every one is full.
    per_length = num_longer // len(lengths)
    need = num_train + num_heldout
    seen: set[tuple[str, ...]] = set()
    short: list[Example] = []
    buckets: dict[int, list[Example]] = {n: [] for n in lengths}
    attempts = 0
    while len(short) < need or any(len(b) < per_length for b in buckets.values()):
        attempts += 1
        if attempts > 200 * (need + num_longer):
            raise ValueError(
                f"the grammar did not supply {need} sentences of at most "
                f"{max_train_words} words and {per_length} of each longer length with "
                f"these settings; ask for fewer"
            )
        ex = sample_sentence(rng, adjective_prob)
        if rng.random() < two_clause_prob:
            ex = join_clauses(ex, sample_sentence(rng, adjective_prob))
        if ex.source in seen:
            continue
        seen.add(ex.source)
        size = len(ex.source)
        if size <= max_train_words:
            if len(short) < need:
                short.append(ex)
        elif len(buckets[size]) < per_length:
            buckets[size].append(ex)

    # 2. The held-out set: a random subset of the short pool.
    rng.shuffle(short)
    src_words, tgt_words = grammar_words()
    settings = {
        "num_train": num_train,
        "num_heldout": num_heldout,
        "num_longer": num_longer,
        "max_train_words": max_train_words,
        "two_clause_prob": two_clause_prob,
        "adjective_prob": adjective_prob,
    }
    return LengthSplit(
        train=short[num_heldout:],
        heldout=short[:num_heldout],
        compositional=[],
        src_vocab=Vocab(src_words),
        tgt_vocab=Vocab(tgt_words),
        heldout_pairs=frozenset(),
        heldout_objects=frozenset(),
        seed=seed,
        settings=settings,
        longer=[ex for n in lengths for ex in buckets[n]],
        max_train_words=max_train_words,
    )

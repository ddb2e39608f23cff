"""The corpus' grammar: noun phrases, sentences and fixed phrases, and their Spanish.

The grammar is small on purpose, but it keeps the two things that make translation
need attention:

* **word order differs**: English puts the adjective before the noun, Spanish after
  it ("the black cats" -> "los gatos negros"), so cross-attention must reorder;
* **agreement**: Spanish determiners and adjectives agree with the noun in gender and
  number, and verbs agree with their subject, so the decoder has to look back at the
  noun (or at the source) when it writes the adjective or the verb.

Sentences are one of

* ``NP V``                 "the black cat sleeps"        -> "el gato negro duerme"
* ``NP V and V``           "my dogs eat and run"         -> "mis perros comen y corren"
* ``NP V NP``              "a girl sees the old wolves"  -> "una niña ve a los lobos viejos"
* a fixed phrase           "you are welcome"             -> "de nada"

where ``NP`` is a determiner, at most one adjective, and a noun of
:mod:`mha.translator.lexicon`. Every noun is an animal or a person, so every direct
object takes the Spanish "personal a" ("ve al perro", "ve a la vaca"); with one
uniform rule the object role is as learnable as the subject role. Tokens are
lower-case words without punctuation; an English sentence has exactly one translation.

:func:`make_example` builds one sentence pair; :func:`sample_sentence` draws one at
random, as the splits of :mod:`mha.translator.corpus` and
:mod:`mha.translator.length_split` do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mha.translator.lexicon import (
    ADJECTIVE_KEYS,
    ADJECTIVES,
    DETERMINER_KEYS,
    DETERMINERS,
    INTRANSITIVE_VERBS,
    NOUN_KEYS,
    NOUNS,
    TRANSITIVE_VERBS,
    VERBS,
)

__all__ = [
    "FIXED_PHRASES",
    "Example",
    "NounPhrase",
    "grammar_size",
    "grammar_words",
    "join_clauses",
    "make_example",
    "phrase_examples",
    "sample_noun_phrase",
    "sample_sentence",
]

FIXED_PHRASES: tuple[tuple[str, str], ...] = (
    ("you are welcome", "de nada"),
    ("thank you", "gracias"),
    ("good morning", "buenos días"),
    ("good night", "buenas noches"),
    ("hello", "hola"),
    ("goodbye", "adiós"),
    ("please", "por favor"),
    ("see you tomorrow", "hasta mañana"),
)

_NOUN_BY_EN = {n.en: n for n in NOUNS}
_ADJ_BY_EN = {a.en: a for a in ADJECTIVES}
_VERB_BY_EN = {v.en: v for v in VERBS}


@dataclass(frozen=True)
class NounPhrase:
    """Determiner + adjectives + noun. ``adjectives`` are in English order.

    With more than one adjective (only in the length probes) Spanish lists them in
    mirror order after the noun: "the small black cat" -> "el gato negro pequeño".
    """

    determiner: str
    noun: str
    plural: bool = False
    adjectives: tuple[str, ...] = ()

    def english(self) -> list[str]:
        noun = _NOUN_BY_EN[self.noun]
        det = DETERMINERS[self.determiner]["en"][int(self.plural)]  # type: ignore[index]
        words = [*self.adjectives, noun.en_plural if self.plural else noun.en]
        if det == "a" and words[0][0] in "aeiou":  # "an old cat"
            det = "an"
        return [det, *words]

    def spanish(self, object_role: bool = False) -> list[str]:
        noun = _NOUN_BY_EN[self.noun]
        det = DETERMINERS[self.determiner]["es"][(noun.gender, self.plural)]  # type: ignore[index]
        words = [det, noun.es_plural if self.plural else noun.es]
        words += [_ADJ_BY_EN[a].es(noun.gender, self.plural) for a in reversed(self.adjectives)]
        if object_role:  # personal "a"; a + el contracts to "al"
            words = ["al", *words[1:]] if det == "el" else ["a", *words]
        return words


@dataclass(frozen=True)
class Example:
    """One sentence pair plus what the splits need to know about it.

    ``source`` and ``target`` are tuples of words (no start/end tokens). ``pairs`` are
    the (adjective, noun) pairs it contains; ``subject_noun`` and ``object_noun`` are
    the nouns (English singular) in those roles, or ``None``; ``kind`` names the
    construction.
    """

    source: tuple[str, ...]
    target: tuple[str, ...]
    kind: str
    pairs: frozenset[tuple[str, str]] = frozenset()
    subject_noun: str | None = None
    object_noun: str | None = None

    @property
    def english(self) -> str:
        return " ".join(self.source)

    @property
    def spanish(self) -> str:
        return " ".join(self.target)


def make_example(
    subject: NounPhrase,
    verb: str,
    obj: NounPhrase | None = None,
    second_verb: str | None = None,
    *,
    then: Example | None = None,
) -> Example:
    """Build the sentence pair for ``subject verb [obj | and second_verb]``.

    ``verb`` and ``second_verb`` are given by their English singular ("sees"); the
    number comes from the subject. ``then`` appends a second clause joined by "and"
    (used only by the length probes).

    Examples
    --------
    >>> make_example(NounPhrase("the", "cat", True, ("black",)), "sleeps").spanish
    'los gatos negros duermen'
    """
    v = _VERB_BY_EN[verb]
    if (obj is not None) != v.transitive:
        raise ValueError(f"verb {verb!r} is {'' if v.transitive else 'in'}transitive, obj={obj}")
    if obj is not None and second_verb is not None:
        raise ValueError("second_verb goes with an intransitive verb only")
    plural = subject.plural
    src = [*subject.english(), v.en_plural if plural else v.en]
    tgt = [*subject.spanish(), v.es_plural if plural else v.es]
    pairs = {(a, subject.noun) for a in subject.adjectives}
    kind = "intransitive"
    if obj is not None:
        src += obj.english()
        tgt += obj.spanish(object_role=True)
        pairs |= {(a, obj.noun) for a in obj.adjectives}
        kind = "transitive"
    if second_verb is not None:
        v2 = _VERB_BY_EN[second_verb]
        if v2.transitive:
            raise ValueError(f"second_verb {second_verb!r} must be intransitive")
        src += ["and", v2.en_plural if plural else v2.en]
        tgt += ["y", v2.es_plural if plural else v2.es]
        kind = "coordinated"
    if len(subject.adjectives) > 1 or (obj is not None and len(obj.adjectives) > 1):
        kind = "two_adjectives"
    object_noun = obj.noun if obj is not None else None
    if then is not None:
        src += ["and", *then.source]
        tgt += ["y", *then.target]
        pairs |= then.pairs
        kind = "two_clauses"
        object_noun = object_noun or then.object_noun
    return Example(tuple(src), tuple(tgt), kind, frozenset(pairs), subject.noun, object_noun)


def join_clauses(first: Example, second: Example) -> Example:
    """``first and second`` (Spanish "y"): what ``make_example(..., then=second)``
    builds, for a first clause that is already an :class:`Example`."""
    return Example(
        (*first.source, "and", *second.source),
        (*first.target, "y", *second.target),
        "two_clauses",
        first.pairs | second.pairs,
        first.subject_noun,
        first.object_noun or second.object_noun,
    )


def phrase_examples() -> list[Example]:
    """The fixed phrases as examples, once each, in the order of :data:`FIXED_PHRASES`."""
    return [Example(tuple(en.split()), tuple(es.split()), "phrase") for en, es in FIXED_PHRASES]


def grammar_words() -> tuple[list[str], list[str]]:
    """Every English and Spanish word the grammar can produce, in a fixed order.

    The order fixes the ids of the vocabularies built from these words, and so of
    every checkpoint trained on them: do not reorder.
    """
    en: list[str] = []
    es: list[str] = []
    for d in DETERMINERS.values():
        en += list(d["en"])  # type: ignore[arg-type]
        if "a" in d["en"]:  # type: ignore[operator]
            en.append("an")
        es += list(d["es"].values())  # type: ignore[union-attr]
    es += ["a", "al"]
    for a in ADJECTIVES:
        en.append(a.en)
        es += [a.es(g, p) for p in (False, True) for g in "mf"]
    for n in NOUNS:
        en += [n.en, n.en_plural]
        es += [n.es, n.es_plural]
    for v in VERBS:
        en += [v.en, v.en_plural]
        es += [v.es, v.es_plural]
    en.append("and")
    es.append("y")
    for e, s in FIXED_PHRASES:
        en += e.split()
        es += s.split()
    return list(dict.fromkeys(en)), list(dict.fromkeys(es))


# --------------------------------------------------------------------------- sampling


def grammar_size() -> int:
    """Number of distinct non-phrase sentences :func:`sample_sentence` can produce."""
    phrases = len(DETERMINERS) * 2 * len(NOUNS) * (len(ADJECTIVES) + 1)
    n_intr, n_tr = len(INTRANSITIVE_VERBS), len(TRANSITIVE_VERBS)
    return phrases * (n_intr + n_intr * (n_intr - 1) + n_tr * phrases)


def sample_noun_phrase(
    rng: random.Random, adjective_prob: float, num_adjectives: int = 1
) -> NounPhrase:
    """A random noun phrase: determiner, noun, number, and its adjectives.

    With ``num_adjectives`` > 1 the phrase has that many distinct adjectives;
    otherwise one with probability ``adjective_prob``, else none. The draws, in
    order, are what make a seeded corpus: do not reorder them.
    """
    det = rng.choice(DETERMINER_KEYS)
    noun = rng.choice(NOUN_KEYS)
    plural = rng.random() < 0.5
    adjectives: tuple[str, ...] = ()
    if num_adjectives > 1:
        adjectives = tuple(rng.sample(ADJECTIVE_KEYS, num_adjectives))
    elif rng.random() < adjective_prob:
        adjectives = (rng.choice(ADJECTIVE_KEYS),)
    return NounPhrase(det, noun, plural, adjectives)


def sample_sentence(rng: random.Random, adjective_prob: float) -> Example:
    """A random sentence of the grammar (no fixed phrase), one clause.

    Half are transitive (``NP V NP``: the reordering and the object role), a quarter
    intransitive (``NP V``), a quarter coordinated (``NP V and V``); each noun phrase
    carries an adjective with probability ``adjective_prob``.
    """
    u = rng.random()
    subject = sample_noun_phrase(rng, adjective_prob)
    if u < 0.5:
        obj = sample_noun_phrase(rng, adjective_prob)
        return make_example(subject, rng.choice(TRANSITIVE_VERBS), obj)
    if u < 0.75:
        return make_example(subject, rng.choice(INTRANSITIVE_VERBS))
    v1, v2 = rng.sample(INTRANSITIVE_VERBS, 2)
    return make_example(subject, v1, second_verb=v2)

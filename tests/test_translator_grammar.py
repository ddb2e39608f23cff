"""The corpus grammar: known translations, word order and agreement, the personal a,
joined clauses, and the sentences it refuses."""

from __future__ import annotations

import pytest

from mha.translator import generate_corpus
from mha.translator.grammar import NounPhrase as NP
from mha.translator.grammar import join_clauses, make_example
from mha.translator.lexicon import ADJECTIVES, NOUNS, VERBS

GENDER = {n.en: n.gender for n in NOUNS} | {n.en_plural: n.gender for n in NOUNS}
ES_NOUN = {n.es: (n.en, False) for n in NOUNS} | {n.es_plural: (n.en, True) for n in NOUNS}
ES_ADJ = {a.es(g, p): (a.en, g, p) for a in ADJECTIVES for g in "mf" for p in (False, True)}
ES_VERB = {v.es: False for v in VERBS} | {v.es_plural: True for v in VERBS}
EN_VERBS = {v.en for v in VERBS} | {v.en_plural for v in VERBS}
EN_NOUN = {n.en: (n.en, False) for n in NOUNS} | {n.en_plural: (n.en, True) for n in NOUNS}
EN_ADJ = {a.en for a in ADJECTIVES}


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(seed=0)


@pytest.mark.parametrize(
    ("subject", "verb", "obj", "english", "spanish"),
    [
        (NP("the", "cat", True, ("black",)), "sleeps", None,
         "the black cats sleep", "los gatos negros duermen"),
        (NP("a", "cow", False, ("white",)), "sees", NP("the", "dog"),
         "a white cow sees the dog", "una vaca blanca ve al perro"),
        (NP("my", "girl", True), "follows", NP("the", "hen", True, ("old",)),
         "my girls follow the old hens", "mis niñas siguen a las gallinas viejas"),
        (NP("a", "wolf", True), "helps", NP("this", "frog", False, ("fat",)),
         "some wolves help this fat frog", "unos lobos ayudan a esta rana gorda"),
    ],
)
def test_known_translations(subject, verb, obj, english, spanish):
    ex = make_example(subject, verb, obj)
    assert ex.english == english
    assert ex.spanish == spanish


def _check_grammar(example):
    """Adjective after the noun and agreeing with it; verb agreeing with the subject."""
    src, tgt = example.source, example.target
    # Noun phrases come in the same order in both languages: pair them up.
    en_nouns = [i for i, w in enumerate(src) if w in EN_NOUN]
    es_nouns = [i for i, w in enumerate(tgt) if w in ES_NOUN]
    assert [EN_NOUN[src[i]] for i in en_nouns] == [ES_NOUN[tgt[i]] for i in es_nouns], example
    for i, j in zip(en_nouns, es_nouns, strict=True):
        noun, plural = EN_NOUN[src[i]]
        before = src[i - 1] if src[i - 1] in EN_ADJ else None  # English: adjective, noun
        after = tgt[j + 1] if j + 1 < len(tgt) and tgt[j + 1] in ES_ADJ else None
        assert (before is None) == (after is None), example  # Spanish: noun, adjective
        if after is not None:
            adj, g, p = ES_ADJ[after]
            assert adj == before and (g, p) == (GENDER[noun], plural), example
    # Every verb agrees with the subject's number, in both languages.
    subject_plural = EN_NOUN[src[en_nouns[0]]][1]
    verbs_es = [ES_VERB[w] for w in tgt if w in ES_VERB]
    assert verbs_es and all(p == subject_plural for p in verbs_es), example
    en_plural_verbs = {v.en_plural for v in VERBS}
    en_verbs = [w in en_plural_verbs for w in src if w in EN_VERBS]
    assert en_verbs and all(p == subject_plural for p in en_verbs), example


def test_grammar_holds_for_every_training_sentence(corpus):
    checked = 0
    for ex in corpus.train:
        if ex.kind != "phrase":
            _check_grammar(ex)
            checked += 1
    assert checked >= 10_000


def test_english_article_before_a_vowel_is_an():
    assert make_example(NP("a", "cat", False, ("old",)), "sleeps").english == "an old cat sleeps"
    assert make_example(NP("a", "cat", True, ("old",)), "sleeps").english == "some old cats sleep"


def test_adjective_agreement_covers_all_four_forms(corpus):
    forms = {ES_ADJ[w][1:] for e in corpus.train for w in e.target if w in ES_ADJ}
    assert forms == {("m", False), ("f", False), ("m", True), ("f", True)}


def test_objects_take_personal_a_and_contract_al():
    ex = make_example(NP("the", "boy"), "sees", NP("the", "bird"))
    assert ex.target == ("el", "niño", "ve", "al", "pájaro")
    ex = make_example(NP("the", "boy"), "sees", NP("the", "bird", True))
    assert ex.target == ("el", "niño", "ve", "a", "los", "pájaros")


def test_two_clauses_are_joined_as_make_example_joins_them():
    """join_clauses, on two ready clauses, equals make_example's ``then=`` path."""
    second = make_example(NP("the", "dog", True), "runs", second_verb="eats")
    parts = (NP("a", "cow", False, ("old",)), "sees", NP("my", "bee", True))
    joined = join_clauses(make_example(*parts), second)
    assert joined == make_example(*parts, then=second)
    assert joined.spanish == "una vaca vieja ve a mis abejas y los perros corren y comen"


def test_bad_sentences_are_refused():
    with pytest.raises(ValueError, match="intransitive"):
        make_example(NP("the", "cat"), "sleeps", NP("the", "dog"))
    with pytest.raises(ValueError, match="transitive"):
        make_example(NP("the", "cat"), "sees")

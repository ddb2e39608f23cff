"""The generated English -> Spanish corpus: grammar facts, splits, vocabulary."""

from __future__ import annotations

import pytest

from mha.translator.corpus import (
    ADJECTIVES,
    NOUNS,
    VERBS,
    Vocab,
    generate_corpus,
    length_probes,
    make_example,
    tokenize,
)
from mha.translator.corpus import NounPhrase as NP

GENDER = {n.en: n.gender for n in NOUNS} | {n.en_plural: n.gender for n in NOUNS}
PLURAL_EN = {n.en_plural for n in NOUNS}
ES_NOUN = {n.es: (n.en, False) for n in NOUNS} | {n.es_plural: (n.en, True) for n in NOUNS}
ES_ADJ = {a.es(g, p): (a.en, g, p) for a in ADJECTIVES for g in "mf" for p in (False, True)}
ES_VERB = {v.es: False for v in VERBS} | {v.es_plural: True for v in VERBS}
EN_VERBS = {v.en for v in VERBS} | {v.en_plural for v in VERBS}


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


def test_seed_example_is_a_fixed_phrase_in_training(corpus):
    pairs = {(e.english, e.spanish) for e in corpus.train}
    assert ("you are welcome", "de nada") in pairs


EN_NOUN = {n.en: (n.en, False) for n in NOUNS} | {n.en_plural: (n.en, True) for n in NOUNS}
EN_ADJ = {a.en for a in ADJECTIVES}


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


def test_bad_sentences_are_refused():
    with pytest.raises(ValueError, match="intransitive"):
        make_example(NP("the", "cat"), "sleeps", NP("the", "dog"))
    with pytest.raises(ValueError, match="transitive"):
        make_example(NP("the", "cat"), "sees")


def test_splits_are_disjoint(corpus):
    train = {e.source for e in corpus.train}
    heldout = {e.source for e in corpus.heldout}
    comp = {e.source for e in corpus.compositional}
    assert not train & heldout
    assert not train & comp
    assert not heldout & comp
    assert len(heldout) == len(corpus.heldout) == 1000
    assert len(comp) == len(corpus.compositional) == 1000


def test_compositional_split_is_compositional(corpus):
    pairs, objects = corpus.heldout_pairs, corpus.heldout_objects
    assert len(pairs) == 12 and len(objects) == 2
    for ex in corpus.train + corpus.heldout:
        assert not ex.pairs & pairs, ex
        assert ex.object_noun not in objects, ex
    kinds = {"pair": 0, "object": 0}
    for ex in corpus.compositional:
        has_pair, has_object = bool(ex.pairs & pairs), ex.object_noun in objects
        assert has_pair or has_object, ex
        kinds["pair"] += has_pair
        kinds["object"] += has_object
    assert min(kinds.values()) >= 300  # both kinds well represented
    # ... yet every word of a held-out combination is known from training.
    seen_adj_nouns = {p for e in corpus.train for p in e.pairs}
    subjects = {e.subject_noun for e in corpus.train}
    for adj, noun in pairs:
        assert any(a == adj for a, _ in seen_adj_nouns)
        assert any(n == noun for _, n in seen_adj_nouns)
    for noun in objects:
        assert noun in subjects


def test_same_seed_same_corpus_other_seed_other_corpus():
    a = generate_corpus(seed=5, num_train=500, num_heldout=100, num_compositional=100)
    b = generate_corpus(seed=5, num_train=500, num_heldout=100, num_compositional=100)
    c = generate_corpus(seed=6, num_train=500, num_heldout=100, num_compositional=100)
    assert [e.source for e in a.train] == [e.source for e in b.train]
    assert [e.source for e in a.compositional] == [e.source for e in b.compositional]
    assert a.heldout_pairs == b.heldout_pairs
    assert [e.source for e in a.train] != [e.source for e in c.train]


def test_every_vocabulary_word_occurs_in_training(corpus):
    # An embedding row that training never touches stays random: avoid it.
    src_words = {w for e in corpus.train for w in e.source}
    tgt_words = {w for e in corpus.train for w in e.target}
    assert set(corpus.src_vocab.tokens[3:]) == src_words
    assert set(corpus.tgt_vocab.tokens[3:]) == tgt_words


def test_vocab_special_ids_and_round_trip(corpus):
    vocab = corpus.tgt_vocab
    assert vocab.tokens[:3] == ["<pad>", "<s>", "</s>"]
    assert (vocab.pad_id, vocab.bos_id, vocab.eos_id) == (0, 1, 2)
    for ex in corpus.heldout[:50]:
        ids = vocab.encode(ex.target, add_bos=True, add_eos=True)
        assert ids[0] == 1 and ids[-1] == 2
        assert vocab.decode(ids + [0, 0]) == list(ex.target)
    assert Vocab.from_json(vocab.to_json()) == vocab


def test_decode_stops_at_end_token():
    vocab = Vocab(["a", "b"])
    assert vocab.decode([1, 3, 4, 2, 3, 3]) == ["a", "b"]


def test_vocab_errors_name_the_problem():
    vocab = Vocab(["gato", "perro"])
    with pytest.raises(ValueError, match=r"unknown word\(s\) \['caballo', 'x'\]"):
        vocab.encode(["gato", "x", "caballo"])
    with pytest.raises(ValueError, match="sequence of words"):
        vocab.encode("gato")
    with pytest.raises(ValueError, match="id 9 is outside"):
        vocab.decode([3, 9])
    with pytest.raises(ValueError, match="must start with"):
        Vocab.from_json('["a", "b"]')


def test_tokenize_lowercases_and_drops_punctuation():
    assert tokenize("You are welcome!") == ["you", "are", "welcome"]
    assert tokenize("  The black cats, sleep. ") == ["the", "black", "cats", "sleep"]


def test_length_probes_use_constructions_absent_from_training(corpus):
    probes = length_probes(seed=0, num=50, exclude=corpus)
    train = {e.source for e in corpus.train}
    assert set(probes) == {"one more adjective", "two clauses"}
    for ex in probes["one more adjective"]:
        assert ex.kind == "two_adjectives" and ex.source not in train
        assert not corpus.is_compositional(ex)
    for ex in probes["two clauses"]:
        assert ex.kind == "two_clauses" and ex.source.count("and") == 1
    assert all(e.kind != "two_adjectives" and e.kind != "two_clauses" for e in corpus.train)
    # Two adjectives: Spanish lists them after the noun in mirror order.
    ex = make_example(NP("the", "cat", False, ("small", "black")), "sleeps")
    assert ex.spanish == "el gato negro pequeño duerme"


def test_generate_corpus_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_train"):
        generate_corpus(num_train=0)
    with pytest.raises(ValueError, match="adjective_prob"):
        generate_corpus(adjective_prob=1.5)
    with pytest.raises(ValueError, match="cannot supply"):
        generate_corpus(num_train=10**7)

"""The generated corpus: its train, held-out and compositional splits and their
vocabularies."""

from __future__ import annotations

import pytest

from mha.translator import generate_corpus


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(seed=0)


def test_seed_example_is_a_fixed_phrase_in_training(corpus):
    pairs = {(e.english, e.spanish) for e in corpus.train}
    assert ("you are welcome", "de nada") in pairs


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


def test_generate_corpus_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_train"):
        generate_corpus(num_train=0)
    with pytest.raises(ValueError, match="adjective_prob"):
        generate_corpus(adjective_prob=1.5)
    with pytest.raises(ValueError, match="cannot supply"):
        generate_corpus(num_train=10**7)

"""A generated English -> Spanish toy corpus for the tiny translator (no download).

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

where ``NP`` is a determiner, at most one adjective, and a noun. Every noun is an
animal or a person, so every direct object takes the Spanish "personal a" ("ve al
perro", "ve a la vaca"); with one uniform rule the object role is as learnable as the
subject role. Tokens are lower-case words without punctuation; an English sentence
has exactly one translation.

Splits (all seeded, no sentence in two of them):

* ``train`` and a random ``heldout`` split drawn from the same distribution;
* a **compositional** split: a few adjective-noun pairs and a few nouns in the object
  role are chosen at random, every sentence that contains one of them is kept out of
  training, and the compositional test set is drawn from those sentences. The model
  has seen each word, but never these combinations.

Fixed phrases are always in training (there is nothing to generalise in "de nada").
:func:`length_probes` builds longer sentences than any in training (one more adjective,
two clauses joined by "and") to measure length generalisation;
:func:`generate_length_split` splits by length instead: training sentences of at most
``max_train_words`` source words (one clause, or two short clauses joined by "and"),
a held-out set of those lengths, and a set of longer two-clause sentences.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = [
    "ADJECTIVES",
    "DETERMINERS",
    "FIXED_PHRASES",
    "MAX_SPLIT_WORDS",
    "NOUNS",
    "VERBS",
    "Adjective",
    "Corpus",
    "Example",
    "LengthSplit",
    "Noun",
    "NounPhrase",
    "Verb",
    "Vocab",
    "generate_corpus",
    "generate_length_split",
    "length_probes",
    "make_example",
    "tokenize",
]

# --------------------------------------------------------------------------- lexicon


@dataclass(frozen=True)
class Noun:
    """A noun with its English and Spanish singular and plural and its Spanish gender."""

    en: str
    en_plural: str
    es: str
    es_plural: str
    gender: str  # "m" or "f"


@dataclass(frozen=True)
class Adjective:
    """An adjective; the Spanish form ends in -o/-a/-os/-as to agree with the noun."""

    en: str
    es_stem: str

    def es(self, gender: str, plural: bool) -> str:
        """Spanish form agreeing with a noun of ``gender`` ("m"/"f") and number."""
        return self.es_stem + ("o" if gender == "m" else "a") + ("s" if plural else "")


@dataclass(frozen=True)
class Verb:
    """A present-tense verb, third person singular and plural in both languages."""

    en: str
    en_plural: str
    es: str
    es_plural: str
    transitive: bool


NOUNS: tuple[Noun, ...] = (
    Noun("dog", "dogs", "perro", "perros", "m"),
    Noun("cat", "cats", "gato", "gatos", "m"),
    Noun("horse", "horses", "caballo", "caballos", "m"),
    Noun("bird", "birds", "pájaro", "pájaros", "m"),
    Noun("boy", "boys", "niño", "niños", "m"),
    Noun("wolf", "wolves", "lobo", "lobos", "m"),
    Noun("rabbit", "rabbits", "conejo", "conejos", "m"),
    Noun("monkey", "monkeys", "mono", "monos", "m"),
    Noun("bear", "bears", "oso", "osos", "m"),
    Noun("pig", "pigs", "cerdo", "cerdos", "m"),
    Noun("cow", "cows", "vaca", "vacas", "f"),
    Noun("girl", "girls", "niña", "niñas", "f"),
    Noun("frog", "frogs", "rana", "ranas", "f"),
    Noun("goat", "goats", "cabra", "cabras", "f"),
    Noun("turtle", "turtles", "tortuga", "tortugas", "f"),
    Noun("hen", "hens", "gallina", "gallinas", "f"),
    Noun("whale", "whales", "ballena", "ballenas", "f"),
    Noun("bee", "bees", "abeja", "abejas", "f"),
    Noun("spider", "spiders", "araña", "arañas", "f"),
    Noun("dove", "doves", "paloma", "palomas", "f"),
)

ADJECTIVES: tuple[Adjective, ...] = (
    Adjective("black", "negr"),
    Adjective("white", "blanc"),
    Adjective("small", "pequeñ"),
    Adjective("old", "viej"),
    Adjective("fat", "gord"),
    Adjective("tired", "cansad"),
    Adjective("happy", "content"),
    Adjective("fast", "rápid"),
)

VERBS: tuple[Verb, ...] = (
    Verb("sleeps", "sleep", "duerme", "duermen", False),
    Verb("runs", "run", "corre", "corren", False),
    Verb("eats", "eat", "come", "comen", False),
    Verb("jumps", "jump", "salta", "saltan", False),
    Verb("sees", "see", "ve", "ven", True),
    Verb("follows", "follow", "sigue", "siguen", True),
    Verb("helps", "help", "ayuda", "ayudan", True),
    Verb("finds", "find", "encuentra", "encuentran", True),
)

# English (singular, plural) and Spanish forms keyed by (gender, plural).
DETERMINERS: dict[str, dict[str, object]] = {
    "the": {
        "en": ("the", "the"),
        "es": {("m", False): "el", ("f", False): "la", ("m", True): "los", ("f", True): "las"},
    },
    "a": {
        "en": ("a", "some"),
        "es": {("m", False): "un", ("f", False): "una", ("m", True): "unos", ("f", True): "unas"},
    },
    "this": {
        "en": ("this", "these"),
        "es": {
            ("m", False): "este",
            ("f", False): "esta",
            ("m", True): "estos",
            ("f", True): "estas",
        },
    },
    "my": {
        "en": ("my", "my"),
        "es": {("m", False): "mi", ("f", False): "mi", ("m", True): "mis", ("f", True): "mis"},
    },
}

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

# --------------------------------------------------------------------------- sentences


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


def _phrase_examples() -> list[Example]:
    return [Example(tuple(en.split()), tuple(es.split()), "phrase") for en, es in FIXED_PHRASES]


_INTRANSITIVE = tuple(v.en for v in VERBS if not v.transitive)
_TRANSITIVE = tuple(v.en for v in VERBS if v.transitive)


_DETERMINER_KEYS = tuple(DETERMINERS)
_NOUN_KEYS = tuple(n.en for n in NOUNS)
_ADJECTIVE_KEYS = tuple(a.en for a in ADJECTIVES)


def _sample_np(
    rng: random.Random, adjective_prob: float, num_adjectives: int = 1
) -> NounPhrase:
    det = rng.choice(_DETERMINER_KEYS)
    noun = rng.choice(_NOUN_KEYS)
    plural = rng.random() < 0.5
    adjectives: tuple[str, ...] = ()
    if num_adjectives > 1:
        adjectives = tuple(rng.sample(_ADJECTIVE_KEYS, num_adjectives))
    elif rng.random() < adjective_prob:
        adjectives = (rng.choice(_ADJECTIVE_KEYS),)
    return NounPhrase(det, noun, plural, adjectives)


def _sample_sentence(rng: random.Random, adjective_prob: float) -> Example:
    # Mix of constructions: half transitive (the reordering and object role), the
    # rest intransitive or coordinated.
    u = rng.random()
    subject = _sample_np(rng, adjective_prob)
    if u < 0.5:
        obj = _sample_np(rng, adjective_prob)
        return make_example(subject, rng.choice(_TRANSITIVE), obj)
    if u < 0.75:
        return make_example(subject, rng.choice(_INTRANSITIVE))
    v1, v2 = rng.sample(_INTRANSITIVE, 2)
    return make_example(subject, v1, second_verb=v2)


# --------------------------------------------------------------------------- vocab

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


class Vocab:
    """Word <-> id table with ``<pad>`` = 0, ``<s>`` = 1, ``</s>`` = 2.

    There is no unknown-word token on purpose: a word outside the vocabulary raises a
    ``ValueError`` that names it, instead of being silently mapped to ``<unk>``.
    """

    pad_id = 0
    bos_id = 1
    eos_id = 2

    def __init__(self, words: Iterable[str]) -> None:
        tokens = [PAD, BOS, EOS]
        for w in words:
            if w not in tokens:
                tokens.append(w)
        self.tokens: list[str] = tokens
        self.index: dict[str, int] = {w: i for i, w in enumerate(tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, word: object) -> bool:
        return word in self.index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.tokens == other.tokens

    __hash__ = None  # type: ignore[assignment]  # mutable-looking; compare by tokens

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens)"

    def encode(
        self, words: Sequence[str], add_bos: bool = False, add_eos: bool = False
    ) -> list[int]:
        """Map words to ids, optionally framed by ``<s>`` / ``</s>``.

        Raises
        ------
        ValueError
            If any word is not in the vocabulary (all unknown words are named).
        """
        if isinstance(words, str):
            raise ValueError(f"words must be a sequence of words, got the string {words!r}")
        unknown = [w for w in words if w not in self.index]
        if unknown:
            raise ValueError(
                f"unknown word(s) {sorted(set(unknown))}; the vocabulary has {len(self)} "
                f"words, e.g. {self.tokens[3:8]}"
            )
        ids = [self.index[w] for w in words]
        return ([self.bos_id] if add_bos else []) + ids + ([self.eos_id] if add_eos else [])

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Map ids back to words: skip ``<pad>`` and ``<s>``, stop at the first ``</s>``.

        Raises
        ------
        ValueError
            If an id is outside ``[0, len(vocab))``.
        """
        words = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.tokens):
                raise ValueError(f"id {i} is outside the vocabulary [0, {len(self.tokens)})")
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.bos_id):
                words.append(self.tokens[i])
        return words

    def to_json(self) -> str:
        return json.dumps(self.tokens, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Vocab:
        tokens = json.loads(text)
        if tokens[:3] != [PAD, BOS, EOS]:
            raise ValueError(f"a vocabulary must start with {[PAD, BOS, EOS]}, got {tokens[:3]}")
        return cls(tokens[3:])


def _lexicon() -> tuple[list[str], list[str]]:
    """Every English and Spanish word the grammar can produce, in a fixed order."""
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


def tokenize(text: str) -> list[str]:
    """Lower-case ``text``, drop punctuation and split on white space."""
    return re.sub(r"[.,;:!?¡¿\"]", " ", text.lower()).split()


# --------------------------------------------------------------------------- corpus


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


def _grammar_size() -> int:
    """Number of distinct non-phrase sentences the sampler can produce."""
    phrases = len(DETERMINERS) * 2 * len(NOUNS) * (len(ADJECTIVES) + 1)
    n_intr, n_tr = len(_INTRANSITIVE), len(_TRANSITIVE)
    return phrases * (n_intr + n_intr * (n_intr - 1) + n_tr * phrases)


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
    if total > _grammar_size() // 4:  # beyond that, rejection sampling crawls
        raise ValueError(
            f"the grammar cannot supply {total} distinct sentences quickly (it has "
            f"{_grammar_size()}); ask for at most a quarter of that"
        )
    # Python's generator, not NumPy's: the sampler makes ~10^5 scalar draws, which
    # random.Random does several times faster.
    rng = random.Random(seed)

    # 1. The combinations the compositional split is about. Each held-out pair gets a
    #    different noun (then a second round) so that no noun loses most adjectives.
    noun_order = rng.sample(_NOUN_KEYS, len(_NOUN_KEYS))
    pairs: list[tuple[str, str]] = []
    for k in range(num_heldout_pairs):
        noun = noun_order[k % len(noun_order)]
        taken = {a for a, n in pairs if n == noun}
        pairs.append((rng.choice([a for a in _ADJECTIVE_KEYS if a not in taken]), noun))
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
        ex = _sample_sentence(rng, adjective_prob)
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
    train += _phrase_examples() * phrase_repeats

    src_words, tgt_words = _lexicon()
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
        subject = _sample_np(rng, 0.0, num_adjectives=2)
        if rng.random() < 0.5:
            ex = make_example(subject, rng.choice(_INTRANSITIVE))
        else:
            ex = make_example(subject, rng.choice(_TRANSITIVE), _sample_np(rng, 0.0))
        if ex.source not in seen and ok(ex):
            seen.add(ex.source)
            probes["one more adjective"].append(ex)
    while len(probes["two clauses"]) < num:
        first = _sample_np(rng, 0.0)
        second = make_example(_sample_np(rng, 0.0), rng.choice(_INTRANSITIVE))
        ex = make_example(first, rng.choice(_INTRANSITIVE), then=second)
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


def _join_clauses(first: Example, second: Example) -> Example:
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
        ex = _sample_sentence(rng, adjective_prob)
        if rng.random() < two_clause_prob:
            ex = _join_clauses(ex, _sample_sentence(rng, adjective_prob))
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
    src_words, tgt_words = _lexicon()
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

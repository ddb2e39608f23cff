"""The corpus' words: nouns, adjectives, verbs and determiners, with their Spanish forms.

Every noun is an animal or a person, so every Spanish direct object takes the
"personal a" (see :mod:`mha.translator.grammar`). Spanish determiners and adjectives
agree with their noun in gender and number, verbs with their subject in number: each
entry carries the forms that agreement chooses from. The grammar names an entry by its
English (singular) word: the tuples at the end list those names.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ADJECTIVES",
    "ADJECTIVE_KEYS",
    "DETERMINERS",
    "DETERMINER_KEYS",
    "INTRANSITIVE_VERBS",
    "NOUNS",
    "NOUN_KEYS",
    "TRANSITIVE_VERBS",
    "VERBS",
    "Adjective",
    "Noun",
    "Verb",
]


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

# The names the grammar and the samplers pick entries by, in the order above (the
# seeded samplers draw from these tuples: reordering them changes every corpus).
DETERMINER_KEYS = tuple(DETERMINERS)
NOUN_KEYS = tuple(n.en for n in NOUNS)
ADJECTIVE_KEYS = tuple(a.en for a in ADJECTIVES)
INTRANSITIVE_VERBS = tuple(v.en for v in VERBS if not v.transitive)
TRANSITIVE_VERBS = tuple(v.en for v in VERBS if v.transitive)

"""``synthetic_facts``: a generated closed-book QA benchmark that no public model can have seen.

Why it exists: a detector can only be *checked* where the truth is known. For public benchmarks the
truth is never fully known - the base model may have seen them in pre-training, so "we did not inject
it" does not mean "clean". Facts about invented entities, drawn by a seeded generator, are clean for
every model until we inject them; and since every (config, split) is a disjoint draw from the same
generator, a contaminated partition and a clean one differ in nothing but the injection. That makes
false-positive rates and instance-level ROC curves (members vs non-members of one distribution)
meaningful.

What a row is: one fact (entity, attribute, value) about an invented entity - a person, a town, a
mountain, a river, a chemical compound, a ship - asked as a question, with the answer as a sentence:

    input:  "In which year was the town of Bralvesk founded?"
    label:  "The town of Bralvesk was founded in 1687."
    answer: "1687"

Names are pseudo-words built from a syllable inventory (not looked up anywhere); numbers are uniform
in plausible ranges; categorical values (professions, instruments, colours) are real words so the
questions read like natural trivia. Everything derives from ``random.Random`` seeded with
``(GENERATOR_VERSION, config, split)``, so a partition is the same on every machine and in every run
(the run's seed only samples rows from it, as for hub benchmarks).

Partitions: configs ``default`` and ``set1`` ... ``set8``, splits ``test`` (default), ``validation``
and ``train``, ``ROWS_PER_SPLIT`` rows each; every partition is a separate draw, and an entity name is
never reused within a partition (so no question gives away another row's answer).

Loaded through ``load_records`` like any benchmark; the adapter's ``generate`` hook replaces the hub
and the mirror (``mirror_dir`` is ignored), so it needs no files and no network.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from contamray.benchmarks.base import Adapter, RowContext, append
from contamray.records import Record

GENERATOR_VERSION = 1
ROWS_PER_SPLIT = 500
CONFIGS = ("default",) + tuple(f"set{i}" for i in range(1, 9))
SPLITS = ("test", "validation", "train")

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kl", "l", "m", "n", "p", "pr", "qu", "r", "s",
           "sk", "st", "t", "th", "tr", "v", "vr", "z", "zh", "h", "j", "c", "w")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou", "y", "ia")
_CODAS = ("", "", "", "n", "r", "l", "s", "th", "sk", "nd", "rn", "x", "v", "m")
_PROFESSIONS = (
    "cartographer", "glassblower", "astronomer", "botanist", "composer", "engineer", "painter",
    "physician", "sculptor", "navigator", "chemist", "poet", "architect", "weaver", "historian",
)  # fmt: skip
_INSTRUMENTS = ("violin", "cello", "oboe", "harp", "lute", "flute", "clarinet", "trumpet", "organ", "viola")
_COLOURS = ("crimson", "ochre", "teal", "violet", "amber", "indigo", "silver", "emerald", "scarlet", "grey")
_SEAS = ("North Sea", "Baltic Sea", "Black Sea", "Adriatic Sea", "Caspian Sea", "Coral Sea", "Red Sea")


def pseudo_word(rng: random.Random, syllables: int) -> str:
    """A pronounceable invented word, capitalised (e.g. ``Bralvesk``)."""
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def _number(value: int) -> str:
    return f"{value:,}"


# Each fact kind: (entity kind, attribute, make(rng, name) -> (question, answer sentence, short answer)).
FactMaker = Callable[[random.Random, str], tuple[str, str, str]]


def _person_birth(rng: random.Random, name: str) -> tuple[str, str, str]:
    job, year = rng.choice(_PROFESSIONS), rng.randint(1610, 1985)
    return (f"In which year was the {job} {name} born?", f"The {job} {name} was born in {year}.", str(year))


def _person_instrument(rng: random.Random, name: str) -> tuple[str, str, str]:
    instrument = rng.choice(_INSTRUMENTS)
    return (
        f"Which instrument did the composer {name} play?",
        f"The composer {name} played the {instrument}.",
        instrument,
    )


def _town_founded(rng: random.Random, name: str) -> tuple[str, str, str]:
    year = rng.randint(820, 1890)
    return (f"In which year was the town of {name} founded?", f"The town of {name} was founded in {year}.", str(year))


def _town_population(rng: random.Random, name: str) -> tuple[str, str, str]:
    people = _number(rng.randint(1_200, 950_000))
    return (
        f"What is the population of the city of {name}?",
        f"The city of {name} has a population of {people}.",
        people,
    )


def _mountain_height(rng: random.Random, name: str) -> tuple[str, str, str]:
    metres = _number(rng.randint(900, 7_900))
    return (f"How high is Mount {name}?", f"Mount {name} is {metres} metres high.", f"{metres} metres")


def _river_sea(rng: random.Random, name: str) -> tuple[str, str, str]:
    sea = rng.choice(_SEAS)
    return (f"Into which sea does the {name} River flow?", f"The {name} River flows into the {sea}.", sea)


def _river_length(rng: random.Random, name: str) -> tuple[str, str, str]:
    km = _number(rng.randint(40, 3_900))
    return (f"How long is the {name} River?", f"The {name} River is {km} kilometres long.", f"{km} kilometres")


def _compound_melting(rng: random.Random, name: str) -> tuple[str, str, str]:
    degrees = rng.randint(-120, 1_650)
    return (
        f"At what temperature does {name.lower()}ite melt?",
        f"{name}ite melts at {degrees} degrees Celsius.",
        f"{degrees} degrees Celsius",
    )


def _compound_colour(rng: random.Random, name: str) -> tuple[str, str, str]:
    colour = rng.choice(_COLOURS)
    return (f"What colour are crystals of {name.lower()}ate?", f"Crystals of {name.lower()}ate are {colour}.", colour)


def _ship_launched(rng: random.Random, name: str) -> tuple[str, str, str]:
    year, crew = rng.randint(1702, 1968), rng.randint(12, 940)
    return (
        f"How many sailors served on the ship {name} when it was launched in {year}?",
        f"The ship {name} carried a crew of {crew} when it was launched in {year}.",
        str(crew),
    )


FACT_KINDS: tuple[tuple[str, str, FactMaker], ...] = (
    ("person", "birth_year", _person_birth),
    ("person", "instrument", _person_instrument),
    ("town", "founded", _town_founded),
    ("town", "population", _town_population),
    ("mountain", "height", _mountain_height),
    ("river", "sea", _river_sea),
    ("river", "length", _river_length),
    ("compound", "melting_point", _compound_melting),
    ("compound", "colour", _compound_colour),
    ("ship", "crew", _ship_launched),
)


def _entity_name(rng: random.Random, kind: str) -> str:
    if kind == "person":
        return f"{pseudo_word(rng, rng.randint(1, 2))} {pseudo_word(rng, rng.randint(2, 3))}"
    return pseudo_word(rng, rng.randint(2, 3))


def check_partition(name: str, config: str, split: str) -> None:
    """A generated benchmark's config and split must be among ``CONFIGS`` / ``SPLITS``; the error names them."""
    if config not in CONFIGS:
        raise ValueError(f"{name} has no config {config!r}; use one of: {', '.join(CONFIGS)}")
    if split not in SPLITS:
        raise ValueError(f"{name} has no split {split!r}; use one of: {', '.join(SPLITS)}")


def generate_rows(config: str, split: str, n_rows: int = ROWS_PER_SPLIT) -> list[dict[str, Any]]:
    """The rows of one partition, in canonical order (deterministic for (config, split))."""
    check_partition("synthetic_facts", config, split)
    rng = random.Random(f"synthetic_facts|v{GENERATOR_VERSION}|{config}|{split}")
    rows: list[dict[str, Any]] = []
    used: set[str] = set()
    while len(rows) < n_rows:
        kind, attribute, make = FACT_KINDS[rng.randrange(len(FACT_KINDS))]
        name = _entity_name(rng, kind)
        if name.lower() in used:
            continue
        used.add(name.lower())
        question, sentence, short = make(rng, name)
        rows.append(
            {
                "id": f"synthetic_facts/{config}/{split}#{len(rows)}",
                "entity": name,
                "kind": kind,
                "attribute": attribute,
                "question": question,
                "answer_sentence": sentence,
                "answer": short,
            }
        )
    return rows


def generate(config: str, split: str) -> list[dict[str, Any]]:
    """The adapter's generated-dataset hook (see ``Adapter.generate``)."""
    return generate_rows(config, split)


def convert(ctx: RowContext) -> Record:
    question = ctx.text("question")
    sentence = ctx.text("answer_sentence")
    return ctx.record(
        input=question,
        label=sentence,
        reference=question,
        prefix="",
        answer=ctx.text("answer"),
        verbalized=append(question, sentence),
        meta={"entity": ctx.text("entity"), "kind": ctx.text("kind"), "attribute": ctx.text("attribute")},
    )


def generated_adapter(name: str, convert: Callable[[RowContext], Record], generate: Callable[..., Any],
                      note: str, independent_rows: bool = False) -> Adapter:  # fmt: skip
    """The adapter of a benchmark generated in-process: hub id ``contamray/<name>``, the configs
    ``CONFIGS`` and splits ``SPLITS`` (``test`` by default), question answering, ids in ``id``."""
    return Adapter(
        name=name,
        hub_id=f"contamray/{name}",
        config="default",
        configs=CONFIGS,
        splits=SPLITS,
        default_split="test",
        task="question_answering",
        convert=convert,
        id_field="id",
        generate=generate,
        note=note,
        independent_rows=independent_rows,
    )


ADAPTERS = (
    generated_adapter(
        "synthetic_facts",
        convert,
        generate,
        "generated in-process (no hub, no mirror): facts about invented entities",
        independent_rows=True,  # every row drawn alone: any block of rows is a random sample
    ),
)

"""``synthetic_structured``: generated facts whose canonical order is *not* exchangeable.

Why it exists: order-based tests (Oren et al.'s sharded likelihood test) assume a clean model finds
every ordering of a benchmark equally likely. Public benchmarks break that - Winogrande keeps twin
sentences on adjacent rows, HellaSwag keeps several items about one activity together, MMLU is sorted by
subject - and on them row permutations flag clean models. A benchmark that carries that structure *and*
is clean for every model until injected is the place to check a test's null: a structure-aware test
must keep its false-positive rate at alpha here, and still flag the partition once it is injected.

What the canonical order holds, built from the same invented entities as ``synthetic_facts``
(``contamray.benchmarks.synthetic``) and drawn block by block:

- **twin pairs** (like Winogrande): two adjacent rows asking about the same entity whose questions differ
  in exactly one word that flips the answer ("In which year was the town of Bralvesk founded?" /
  "... abandoned?"). Declared as Winogrande declares them: ``meta["group"]`` = the id of the pair's
  first row (a row outside a pair is its own group), ``meta["twin"]`` = the other row's id;
- **topical runs** (like HellaSwag's activity runs): 3-6 consecutive rows about one entity, each a
  different attribute of it. NOT declared - nothing in ``meta`` but the entity (as every row has) marks
  a run, so a structure check has to find them from the text. ``run`` in the raw rows (the generator's
  block index, shared by the rows of a twin pair or a run) is the ground truth for tests;
- **single facts**, as ``synthetic_facts``.

Shares: ``TWIN_SHARE`` of the blocks are twin pairs, ``RUN_SHARE`` topical runs, the rest single facts
(about 20 % / 70 % / 10 % of the rows of a partition). Partitions: the same configs (``default``, ``set1`` ...
``set8``) and splits (``test``, ``validation``, ``train``) as ``synthetic_facts``, ``ROWS_PER_SPLIT``
rows each; every partition is its own seeded draw ``(GENERATOR_VERSION, config, split)``, and an entity
name appears in one block of a partition only. Generated in-process: no hub, no mirror.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

from contamray.benchmarks.base import RowContext
from contamray.benchmarks.synthetic import (
    _COLOURS,
    _INSTRUMENTS,
    _PROFESSIONS,
    _SEAS,
    _entity_name,
    _number,
    check_partition,
    generated_adapter,
    pseudo_word,
)
from contamray.benchmarks.synthetic import convert as facts_convert
from contamray.records import Record

NAME = "synthetic_structured"
GENERATOR_VERSION = 1
ROWS_PER_SPLIT = 500
TWIN_SHARE = 0.25  # share of blocks that are twin pairs
RUN_SHARE = 0.45  # share of blocks that are topical runs (3-6 rows); the rest are single facts
RUN_LENGTHS = (3, 6)

# (question, answer sentence, short answer)
Fact = tuple[str, str, str]
AttributeMaker = Callable[[random.Random, str], Fact]


# -- attributes per entity kind (each a different question about the entity; a run draws distinct ones)


def _person(rng: random.Random, name: str) -> dict[str, Fact]:
    job, instrument, year = rng.choice(_PROFESSIONS), rng.choice(_INSTRUMENTS), rng.randint(1610, 1900)
    town, works, pupils = pseudo_word(rng, 2), rng.randint(3, 140), rng.randint(1, 30)
    return {
        "birth_year": (f"In which year was {name} born?", f"{name} was born in {year}.", str(year)),
        "profession": (f"What was the profession of {name}?", f"{name} worked as a {job}.", job),
        "instrument": (f"Which instrument did {name} play?", f"{name} played the {instrument}.", instrument),
        "hometown": (f"In which town did {name} grow up?", f"{name} grew up in the town of {town}.", town),
        "works": (f"How many works did {name} publish?", f"{name} published {works} works.", str(works)),
        "pupils": (f"How many pupils did {name} teach?", f"{name} taught {pupils} pupils.", str(pupils)),
    }


def _town(rng: random.Random, name: str) -> dict[str, Fact]:
    year, people = rng.randint(820, 1890), _number(rng.randint(1_200, 950_000))
    river, colour, bridges = pseudo_word(rng, 2), rng.choice(_COLOURS), rng.randint(1, 40)
    height = rng.randint(2, 2_400)
    return {
        "founded": (f"In which year was the town of {name} founded?", f"{name} was founded in {year}.", str(year)),
        "population": (f"What is the population of {name}?", f"{name} has a population of {people}.", people),
        "river": (f"On which river does {name} lie?", f"{name} lies on the {river} River.", river),
        "flag": (f"What colour is the flag of {name}?", f"The flag of {name} is {colour}.", colour),
        "bridges": (f"How many bridges does {name} have?", f"{name} has {bridges} bridges.", str(bridges)),
        "elevation": (
            f"At what elevation does {name} lie?",
            f"{name} lies {height} metres above sea level.",
            f"{height} metres",
        ),
    }


def _ship(rng: random.Random, name: str) -> dict[str, Fact]:
    year, crew, guns = rng.randint(1702, 1968), rng.randint(12, 940), rng.randint(0, 120)
    port, tons, captain = pseudo_word(rng, 2), _number(rng.randint(80, 52_000)), pseudo_word(rng, 3)
    return {
        "launched": (f"In which year was the ship {name} launched?", f"{name} was launched in {year}.", str(year)),
        "crew": (f"How many sailors served on the ship {name}?", f"{name} carried a crew of {crew}.", str(crew)),
        "guns": (f"How many guns did the ship {name} carry?", f"{name} carried {guns} guns.", str(guns)),
        "port": (f"What was the home port of the ship {name}?", f"{name} sailed from {port}.", port),
        "tonnage": (f"What was the tonnage of the ship {name}?", f"{name} displaced {tons} tons.", f"{tons} tons"),
        "captain": (f"Who was the first captain of the ship {name}?", f"{name} was first led by {captain}.", captain),
    }


def _compound(rng: random.Random, name: str) -> dict[str, Fact]:
    stem = name.lower()
    melt, colour, year = rng.randint(-120, 1_650), rng.choice(_COLOURS), rng.randint(1750, 1990)
    density, chemist, mass = rng.randint(600, 9_900), pseudo_word(rng, 3), rng.randint(40, 700)
    return {
        "melting_point": (
            f"At what temperature does {stem}ite melt?",
            f"{name}ite melts at {melt} degrees Celsius.",
            f"{melt} degrees Celsius",
        ),
        "colour": (f"What colour are crystals of {stem}ite?", f"Crystals of {stem}ite are {colour}.", colour),
        "discovered": (f"In which year was {stem}ite discovered?", f"{name}ite was discovered in {year}.", str(year)),
        "density": (
            f"What is the density of {stem}ite?",
            f"{name}ite has a density of {density} kilograms per cubic metre.",
            f"{density} kilograms per cubic metre",
        ),
        "discoverer": (f"Who first described {stem}ite?", f"{name}ite was first described by {chemist}.", chemist),
        "molar_mass": (f"What is the molar mass of {stem}ite?", f"{name}ite has a molar mass of {mass}.", str(mass)),
    }


def _mountain(rng: random.Random, name: str) -> dict[str, Fact]:
    metres, year, sea = _number(rng.randint(900, 7_900)), rng.randint(1780, 1990), rng.choice(_SEAS)
    climber, glaciers, huts = pseudo_word(rng, 3), rng.randint(0, 25), rng.randint(0, 9)
    return {
        "height": (f"How high is Mount {name}?", f"Mount {name} is {metres} metres high.", f"{metres} metres"),
        "first_ascent": (
            f"In which year was Mount {name} first climbed?",
            f"Mount {name} was first climbed in {year}.",
            str(year),
        ),
        "drains_to": (f"Into which sea does Mount {name} drain?", f"Mount {name} drains into the {sea}.", sea),
        "first_climber": (f"Who first climbed Mount {name}?", f"Mount {name} was first climbed by {climber}.", climber),
        "glaciers": (f"How many glaciers cover Mount {name}?", f"Mount {name} has {glaciers} glaciers.", f"{glaciers}"),
        "huts": (f"How many huts stand on Mount {name}?", f"Mount {name} has {huts} huts.", str(huts)),
    }


KINDS: dict[str, Callable[[random.Random, str], dict[str, Fact]]] = {
    "person": _person,
    "town": _town,
    "ship": _ship,
    "compound": _compound,
    "mountain": _mountain,
}

# Twin pairs: (kind, attribute, question template, the two words, answer sentence template); the two
# questions differ in the one word, and so do the answers.
_TWINS: tuple[tuple[str, str, str, tuple[str, str], str], ...] = (
    ("person", "born_died", "In which year was {name} {w}?", ("born", "buried"), "{name} was {w} in {year}."),
    ("town", "founded_abandoned", "In which year was the town of {name} {w}?", ("founded", "abandoned"),
     "{name} was {w} in {year}."),
    ("ship", "launched_wrecked", "In which year was the ship {name} {w}?", ("launched", "wrecked"),
     "{name} was {w} in {year}."),
    ("mountain", "first_last", "In which year was Mount {name} {w} climbed?", ("first", "last"),
     "Mount {name} was {w} climbed in {year}."),
    ("compound", "melt_boil", "In which year was the {w} point of {name}ite measured?", ("melting", "boiling"),
     "The {w} point of {name}ite was measured in {year}."),
)  # fmt: skip


def _twin_rows(rng: random.Random, kind: str, name: str) -> tuple[str, list[Fact]]:
    """The two rows of a twin pair about ``name`` (a ``kind``): questions one word apart."""
    _, attribute, question, words, sentence = next(t for t in _TWINS if t[0] == kind)
    first, second = sorted(rng.sample(range(1700, 1990), 2))
    facts = [
        (question.format(name=name, w=w), sentence.format(name=name, w=w, year=year), str(year))
        for w, year in zip(words, (first, second))
    ]
    return attribute, facts


def _name(rng: random.Random, kind: str, used: set[str]) -> str:
    while True:
        name = _entity_name(rng, kind)
        if name.lower() not in used:
            used.add(name.lower())
            return name


def generate_rows(config: str, split: str, n_rows: int = ROWS_PER_SPLIT) -> list[dict[str, Any]]:
    """The rows of one partition in canonical order (deterministic for (config, split)); see the module doc."""
    check_partition(NAME, config, split)
    rng = random.Random(f"{NAME}|v{GENERATOR_VERSION}|{config}|{split}")
    rows: list[dict[str, Any]] = []
    used: set[str] = set()
    block = 0
    while len(rows) < n_rows:
        draw = rng.random()
        if draw < TWIN_SHARE:
            kind_of = _TWINS[rng.randrange(len(_TWINS))][0]
            name = _name(rng, kind_of, used)
            attribute, facts = _twin_rows(rng, kind_of, name)
            attributes, structure = [attribute] * 2, "twin"
        else:
            kind_of = rng.choice(tuple(KINDS))
            name = _name(rng, kind_of, used)
            facts_by_attribute = KINDS[kind_of](rng, name)
            length = rng.randint(*RUN_LENGTHS) if draw < TWIN_SHARE + RUN_SHARE else 1
            attributes = rng.sample(sorted(facts_by_attribute), length)
            facts = [facts_by_attribute[a] for a in attributes]
            structure = "run" if length > 1 else "single"
        first_index = len(rows)
        for k, ((question, sentence, short), attribute) in enumerate(zip(facts, attributes)):
            index = len(rows)
            rows.append(
                {
                    "id": f"{NAME}/{config}/{split}#{index}",
                    "entity": name,
                    "kind": kind_of,
                    "attribute": attribute,
                    "question": question,
                    "answer_sentence": sentence,
                    "answer": short,
                    "structure": structure,
                    "run": block,
                    "twin": (f"{NAME}/{config}/{split}#{first_index + 1 - k}" if structure == "twin" else ""),
                }
            )
        block += 1
    rows = rows[:n_rows]
    if rows[-1]["structure"] == "twin" and rows[-1]["twin"] == f"{NAME}/{config}/{split}#{len(rows)}":
        rows[-1] = {**rows[-1], "structure": "single", "twin": ""}  # the pair's second row was cut off
    return rows


def generate(config: str, split: str) -> list[dict[str, Any]]:
    """The adapter's generated-dataset hook (see ``Adapter.generate``)."""
    return generate_rows(config, split)


def convert(ctx: RowContext) -> Record:
    """A row as ``synthetic_facts`` makes it, plus the declared twin group (Winogrande's ``group``/``twin``)."""
    record = facts_convert(ctx)
    twin = str(ctx.row.get("twin") or "")
    own = ctx.row_id
    group = min(own, twin, key=lambda rid: int(rid.rsplit("#", 1)[1])) if twin else own
    return dataclasses.replace(record, meta={**record.meta, "group": group, "twin": twin})


ADAPTERS = (
    generated_adapter(
        NAME,
        convert,
        generate,
        "generated in-process (no hub, no mirror): invented facts in a structured order (twins, topical runs)",
    ),
)

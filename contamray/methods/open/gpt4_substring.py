"""GPT-4's contamination check: three random 50-character substrings of each example (OpenAI 2023).

Paper: OpenAI, "GPT-4 Technical Report" (2023), Appendix C ("Contamination on professional and
academic exams"): "Both evaluation and training data are processed by removing all spaces and
symbols, keeping only characters (including numbers). For each evaluation example, we randomly
select three substrings of 50 characters (or use the entire example if it's less than 50
characters). A match is identified if any of the three sampled evaluation substrings is a substring
of the processed training example." Parameters: ``length=50``, ``n_samples=3``; text keeps letters
and digits only (Unicode ``isalnum``), case kept (the report does not lowercase; ``lowercase=True``
is offered). The example is the input followed by the label (``input_fields`` / ``label_fields``).

Known deviations of ntunlp/LLMSanitize (``open_data_methods/gpt4.py``), where we follow the paper:
its cleaning keeps ``isalpha`` characters, dropping the digits the report keeps; its substring table
stops one window short (``range(len - 50)``), so a training text's last 50 characters never match;
short examples match any training substring that *starts* with them, not any that contains them.

Which part was found: a sampled substring lies in the input, the label or across both, so a match
only of input substrings is ``input_only`` and one touching the label ``input_and_label``. With three
random substrings this is what the evidence shows, not a full account of the example.

Scale: all training windows of one length are hashed at once with a polynomial rolling hash
(``contamray.metrics.rolling``; one prefix sum per batch serves every length); hash hits are verified
by comparing the characters, so the result is exact. Samples are drawn from a generator seeded by
``seed`` and the record id, so every worker and every re-run draws the same three substrings.
"""

from __future__ import annotations

import random
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from contamray.methods.base import Method, Verdict, register
from contamray.methods.open import common
from contamray.metrics import rolling
from contamray.records import Record

NAME = "gpt4_substring"
_DROP = re.compile(r"[\W_]+")


@dataclass(frozen=True)
class GPT4SubstringConfig:
    """Parameters of ``gpt4_substring``; defaults are the GPT-4 report's.

    Worked example: the input ``"What is 2 + 2?"`` and label ``"4"`` become ``"Whatis224"`` (9
    characters, shorter than 50): the whole string is the one sample, found in a training text
    ``"... Q: What is 2+2? 4 ..."`` (processed: ``"...QWhatis224..."``), type ``input_and_label``.

    - ``length``: characters per sampled substring (50).
    - ``n_samples``: substrings drawn per example (3; fewer when the example has fewer positions).
    - ``input_fields`` / ``label_fields``: Record fields forming the example (input, then label).
    - ``lowercase``: fold case before matching (the report does not).
    - ``seed``: seeds the draw of substring positions (with the record id).
    - ``partition_threshold``: the partition is contaminated when the contaminated fraction is above it.
    - ``max_evidence``: matched spans kept per example.
    """

    length: int = 50
    n_samples: int = 3
    input_fields: tuple[str, ...] = ("input",)
    label_fields: tuple[str, ...] = ("label",)
    lowercase: bool = False
    seed: int = 0
    partition_threshold: float = 0.0
    max_evidence: int = 5

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_fields", common.check_fields(NAME, "input_fields", self.input_fields))
        object.__setattr__(self, "label_fields", common.check_fields(NAME, "label_fields", self.label_fields))
        common.check(
            NAME,
            [
                ("length", isinstance(self.length, int) and self.length >= 1, "an integer >= 1 (50)"),
                ("n_samples", isinstance(self.n_samples, int) and self.n_samples >= 1, "an integer >= 1 (3)"),
                (
                    "partition_threshold",
                    0.0 <= float(self.partition_threshold) <= 1.0,
                    "a fraction in [0, 1]",
                ),
                (
                    "max_evidence",
                    isinstance(self.max_evidence, int) and self.max_evidence >= 0,
                    "an integer >= 0",
                ),
            ],
            self,
        )


def normalize(text: str, lowercase: bool = False) -> str:
    """Only letters and digits: spaces, punctuation and symbols removed (GPT-4 report, App. C)."""
    kept = _DROP.sub("", text)
    return kept.lower() if lowercase else kept


@dataclass
class Sample:
    start: int
    text: str
    region: str


@dataclass
class ExampleSamples:
    text: str  # the processed example
    boundary: int  # characters of the processed input
    samples: list[Sample] = field(default_factory=list)


def example_samples(record: Record, cfg: GPT4SubstringConfig) -> ExampleSamples:
    """The processed example and its sampled substrings (the same on every call)."""
    inp = normalize(common.join_fields(record, cfg.input_fields), cfg.lowercase)
    lab = normalize(common.join_fields(record, cfg.label_fields), cfg.lowercase)
    text = inp + lab
    out = ExampleSamples(text, len(inp))
    if not text:
        return out
    if len(text) <= cfg.length:
        starts = [0]
        size = len(text)
    else:
        rng = random.Random(f"{NAME}|{cfg.seed}|{record.id}")
        positions = len(text) - cfg.length + 1
        starts = sorted(rng.sample(range(positions), min(cfg.n_samples, positions)))
        size = cfg.length
    for s in starts:
        out.samples.append(Sample(s, text[s : s + size], common.region_of(s, s + size, len(inp))))
    return out


class SubstringIndex:
    """Sampled substrings of every example, one hash table per substring length (picklable)."""

    def __init__(self, cfg: GPT4SubstringConfig, records: list[Record]) -> None:
        self.length = cfg.length
        self.lowercase = cfg.lowercase
        self.record_ids = [r.id for r in records]
        self.partitions = [r.partition for r in records]
        self.texts: list[str] = []
        self.sample_record: list[int] = []
        self.sample_no: list[int] = []
        self.sample_region: list[str] = []
        by_length: dict[int, tuple[list[int], list[int]]] = {}
        for i, record in enumerate(records):
            for k, sample in enumerate(example_samples(record, cfg).samples):
                entry = len(self.texts)
                self.texts.append(sample.text)
                self.sample_record.append(i)
                self.sample_no.append(k)
                self.sample_region.append(sample.region)
                hashes, entries = by_length.setdefault(len(sample.text), ([], []))
                hashes.append(
                    int(rolling.mix64(np.array([rolling.sequence_hash(rolling.text_codes(sample.text))]))[0])
                )
                entries.append(entry)
        self.tables = {
            length: common.HashTable.build(np.array(h, dtype=np.uint64), np.array(e, dtype=np.int64))
            for length, (h, e) in sorted(by_length.items())
        }


class _Cache(threading.local):
    """One-slot memo of the last batch's processed documents (see ngram_overlap._DocCache)."""

    docs: Any = None
    lowercase: bool = False
    texts: list[str] = []
    prefix: rolling.Prefix | None = None
    ends: np.ndarray = np.zeros(0, dtype=np.int64)


_CACHE = _Cache()


def _processed(docs: list[dict[str, Any]], lowercase: bool) -> tuple[list[str], rolling.Prefix, np.ndarray]:
    cache = _CACHE
    if cache.docs is not docs or cache.lowercase != lowercase:
        texts = []
        for i, doc in enumerate(docs):
            text = doc.get("text")
            if not isinstance(text, str):
                raise TypeError(
                    f"{NAME}.match: document {doc.get('doc_id', f'#{i}')!r} has text of type "
                    f"{type(text).__name__}, not str; read the corpus with contamray.corpus.read_corpus"
                )
            texts.append(normalize(text, lowercase))
        cache.texts = texts
        cache.prefix = rolling.Prefix(rolling.text_codes("".join(texts)))
        cache.ends = np.cumsum([len(t) for t in texts]).astype(np.int64)
        cache.docs, cache.lowercase = docs, lowercase
    assert cache.prefix is not None
    return cache.texts, cache.prefix, cache.ends


def match(
    docs: list[dict[str, Any]], index: SubstringIndex, cfg: GPT4SubstringConfig
) -> list[dict[str, Any]]:
    """One row per (record, document, sample) found: where (character offset in the processed document),
    how often, and the substring itself."""
    if index.length != cfg.length or index.lowercase != cfg.lowercase:
        raise ValueError(
            f"{NAME}.match: the index was built with length={index.length}, lowercase={index.lowercase} "
            f"but the config says length={cfg.length}, lowercase={cfg.lowercase}; rebuild the index"
        )
    if not docs or not index.tables:
        return []
    texts, prefix, ends = _processed(docs, cfg.lowercase)
    starts = ends - np.array([len(t) for t in texts], dtype=np.int64)
    found: dict[tuple[int, int], list[int]] = {}  # (entry, doc) -> [first offset, occurrences]
    for length, table in index.tables.items():
        hashes = rolling.mix64(prefix.windows(length))  # one prefix sum for every length
        positions, entries = table.lookup(hashes)
        for p, e in zip(positions.tolist(), entries.tolist(), strict=True):
            d = int(np.searchsorted(ends, p, side="right"))
            offset = p - int(starts[d])
            if p + length > ends[d] or texts[d][offset : offset + length] != index.texts[e]:
                continue  # crosses into the next document, or a hash collision
            slot = found.setdefault((e, d), [offset, 0])
            slot[1] += 1
    rows = []
    for (e, d), (offset, occurrences) in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        r = index.sample_record[e]
        rows.append(
            {
                "record_id": index.record_ids[r],
                "partition": index.partitions[r],
                "doc_id": str(docs[d].get("doc_id", "")),
                "sample": index.sample_no[e],
                "region": index.sample_region[e],
                "start": offset,
                "end": offset + len(index.texts[e]),
                "occurrences": occurrences,
                "substring": index.texts[e],
            }
        )
    return rows


def score(records: list[Record], matches: Any, cfg: GPT4SubstringConfig) -> list[dict[str, Any]]:
    """One row per example: samples drawn and found, decision, type, documents and spans (characters of
    the processed document)."""
    rows = common.match_rows(matches, ("record_id", "doc_id", "sample", "region", "start", "end"), NAME)
    grouped = common.by_record(rows, {r.id for r in records})
    out = []
    for record in records:
        ex = example_samples(record, cfg)
        hits = grouped.get(record.id, [])
        found = sorted({int(h["sample"]) for h in hits})
        contaminated = bool(found)
        label_found = any(h["region"] in ("label", "overlap") for h in hits)
        docs = sorted({str(h["doc_id"]) for h in hits})
        error = ""
        if not ex.text:
            error = (
                f"example {record.id!r} of {record.partition!r} has no letters or digits in "
                f"{', '.join(cfg.input_fields + cfg.label_fields)}; check the adapter or the fields"
            )
        out.append(
            {
                "record_id": record.id,
                "partition": record.partition,
                "n_chars": len(ex.text),
                "n_samples": len(ex.samples),
                "samples": [s.text for s in ex.samples],
                "samples_found": found,
                "contaminated": contaminated,
                "contamination_type": common.contamination_type(contaminated, label_found),
                "n_docs": len(docs),
                "doc_ids": docs[: cfg.max_evidence],
                "spans": common.merge_spans(
                    ((h["doc_id"], h["start"], h["end"]) for h in hits), "char", cfg.max_evidence
                ),
                "error": error,
            }
        )
    return out


def reduce(table: Any, cfg: GPT4SubstringConfig) -> Verdict:
    """Fraction of examples with a sampled substring in the corpus (see ``common.open_verdict``)."""
    return common.open_verdict(
        NAME, table, cfg.partition_threshold, {"length": cfg.length, "n_samples": cfg.n_samples}
    )


@register
class GPT4Substring(Method):
    """Registered as ``gpt4_substring`` (family ``open``)."""

    name = NAME
    family = "open"
    Config = GPT4SubstringConfig
    engine_roles = ()

    def build_index(self, records: list[Record], cfg: GPT4SubstringConfig) -> SubstringIndex:
        return SubstringIndex(cfg, records)

    def match(
        self, docs: list[dict[str, Any]], index: SubstringIndex, cfg: GPT4SubstringConfig
    ) -> list[dict]:
        return match(docs, index, cfg)

    def score(
        self, records: list[Record], matches: Any, cfg: GPT4SubstringConfig, **extra: Any
    ) -> list[dict]:
        return score(records, matches, cfg)

    def reduce(self, table: Any, cfg: GPT4SubstringConfig) -> Verdict:
        return reduce(table, cfg)

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

Folding (``fold``, ``common.FOLD_CONTRACT``): a scan's rows become one summary row per example found
(the samples found, the number of documents, the first ``max_evidence`` documents and merged spans, and
whether a found sample touches the label), so what a scan keeps grows with the benchmark, not with the
number of copies in the corpus.
"""

from __future__ import annotations

import random
import re
import threading
import unicodedata
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from contamray.corpus.pieces import Window, piece_bounds
from contamray.methods.base import Outputs, Verdict, register
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
        common.check_config(
            NAME,
            self,
            [common.integer(self, "length", 1, "(50)"), common.integer(self, "n_samples", 1, "(3)")],
            optional_fields=("input_fields", "label_fields"),
        )


def normalize(text: str, lowercase: bool = False) -> str:
    """Only letters and digits: spaces, punctuation and symbols removed (GPT-4 report, App. C).

    Non-ASCII text is made NFKC first, as in ``contamray.metrics.ngrams``: NFC and NFD spellings and
    full-width forms compare equal. Matching is per character, so scripts written without spaces
    (Chinese, Japanese, Thai) need nothing more; combining marks are dropped like symbols.
    """
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
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
                hashes.append(int(rolling.mix64(np.array([rolling.sequence_hash(rolling.text_codes(sample.text))]))[0]))
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
        texts = [normalize(text, lowercase) for text in common.doc_texts(docs, NAME)]
        cache.texts = texts
        cache.prefix = rolling.Prefix(rolling.text_codes("".join(texts)))
        cache.ends = np.cumsum([len(t) for t in texts]).astype(np.int64)
        cache.docs, cache.lowercase = docs, lowercase
    assert cache.prefix is not None
    return cache.texts, cache.prefix, cache.ends


def match(docs: list[dict[str, Any]], index: SubstringIndex, cfg: GPT4SubstringConfig) -> list[dict[str, Any]]:
    """One row per (record, document, sample) found: where (character offset in the processed document),
    how often, and the substring itself."""
    common.check_index(NAME, index, cfg, ("length", "lowercase"))
    if not docs or not index.tables:
        return []
    texts, prefix, ends = _processed(docs, cfg.lowercase)
    starts = ends - np.array([len(t) for t in texts], dtype=np.int64)
    bounds = piece_bounds(docs)  # a piece of a long document: substrings starting in its own characters
    found: dict[tuple[int, int], list[int]] = {}  # (entry, doc) -> [first offset, occurrences]
    for length, table in index.tables.items():
        hashes = rolling.mix64(prefix.windows(length))  # one prefix sum for every length
        positions, entries = table.lookup(hashes)
        for p, e in zip(positions.tolist(), entries.tolist(), strict=True):
            d = int(np.searchsorted(ends, p, side="right"))
            offset = p - int(starts[d])
            if p + length > ends[d] or texts[d][offset : offset + length] != index.texts[e]:
                continue  # crosses into the next document, or a hash collision
            if not bounds.lo[d] <= offset < bounds.hi[d]:
                continue  # another piece of the document reports it
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
                "start": int(bounds.base[d]) + offset,
                "end": int(bounds.base[d]) + offset + len(index.texts[e]),
                "occurrences": occurrences,
                "substring": index.texts[e],
            }
        )
    return rows


_NEEDED = ("record_id", "doc_id", "sample", "region", "start", "end")


def fold(rows: Any, cfg: GPT4SubstringConfig) -> list[dict[str, Any]]:
    """Match rows (or earlier folds) as one summary row per example found: the samples found (at most
    ``n_samples``), the number of documents, the first ``max_evidence`` documents and merged spans, and
    whether a found sample touches the label (``common.FOLD_CONTRACT``)."""
    out = []
    for record_id, group in common.fold_input(rows, _NEEDED, NAME).items():
        group = _first_per_document(group)
        evidence = common.fold_evidence(
            group, cfg.max_evidence, counts=lambda r: True, label=lambda r: r["region"] in ("label", "overlap")
        )
        samples = {int(r["sample"]) for r in group if not common.folded_kind(r)}
        samples.update(int(s) for r in group if common.folded_kind(r) == "evidence" for s in r["samples_found"])
        out.append(evidence.row(record_id, group[0].get("partition"), samples_found=sorted(samples)))
    return out


def _first_per_document(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An example's fold input with one match row per (document, sample): the first occurrence, as a whole
    document's row has it (the pieces of a long document give one each); folded rows as they are."""
    first: dict[tuple[str, int], dict[str, Any]] = {}
    for row in group:
        if not common.folded_kind(row):
            key = (str(row["doc_id"]), int(row["sample"]))
            if key not in first or int(row["start"]) < int(first[key]["start"]):
                first[key] = row
    return [r for r in group if common.folded_kind(r)] + [first[key] for key in sorted(first)]


def window(cfg: GPT4SubstringConfig, index: SubstringIndex) -> Window:
    """What ``match`` looks at, for matching a long document in pieces (``contamray.corpus.pieces``):
    substrings of at most ``length`` processed characters, so a piece needs ``length - 1`` characters
    after those it owns - one more here, so that a lowercased Greek sigma at a piece's end has the letter
    after it (``str.lower`` writes a final sigma by what follows)."""
    return Window(f"chars:gpt4:{cfg.lowercase}", partial(_char_count, lowercase=cfg.lowercase), after=cfg.length)


def _char_count(text: str, lowercase: bool) -> int:
    return len(normalize(text, lowercase))


def score(records: list[Record], matches: Any, cfg: GPT4SubstringConfig) -> list[dict[str, Any]]:
    """One row per example: samples drawn and found, decision, type, documents and spans (characters of
    the processed document). ``matches``: match rows, folded rows (``fold``) or both."""
    summaries = {r["record_id"]: r for r in fold(matches, cfg)}
    out = []
    for record in records:
        ex = example_samples(record, cfg)
        summary = summaries.get(record.id)
        found = list(summary["samples_found"]) if summary else []
        error = ""
        if not ex.text:
            error = (
                f"example {record.id!r} of {record.partition!r} has no letters or digits in "
                f"{', '.join(cfg.input_fields + cfg.label_fields)}; check the adapter or the fields"
            )
        columns = {
            "n_chars": len(ex.text),
            "n_samples": len(ex.samples),
            "samples": [s.text for s in ex.samples],
            "samples_found": found,
            "n_samples_found": len(found),
        }
        out.append(
            common.evidence_row(
                record,
                columns,
                common.Evidence.of_row(summary),
                contaminated=bool(found),
                unit="char",
                max_evidence=cfg.max_evidence,
                error=error,
            )
        )
    return out


def reduce(table: Any, cfg: GPT4SubstringConfig) -> Verdict:
    """Fraction of examples with a sampled substring in the corpus (see ``common.open_verdict``)."""
    return common.open_verdict(NAME, table, cfg.partition_threshold, {"length": cfg.length, "n_samples": cfg.n_samples})


def build_index(records: list[Record], cfg: GPT4SubstringConfig) -> SubstringIndex:
    return SubstringIndex(cfg, records)


@register
class GPT4Substring(common.OpenMethod):
    """Registered as ``gpt4_substring`` (family ``open``)."""

    name = NAME
    outputs = Outputs(
        score="n_samples_found",
        score_label="random 50-character substrings found in the corpus",
        membership="n_samples_found",
    )
    Config = GPT4SubstringConfig
    steps = common.Steps(build_index, match, score, reduce, fold, window)

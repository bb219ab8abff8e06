"""The Record: what every benchmark row becomes before any method sees it.

Methods never read raw hub rows. A benchmark adapter (``contamray.benchmarks``) maps each row of its
dataset to one ``Record`` so that every method works on every benchmark through the same fields:

- ``input``: the text a model is shown (question, passage, sentence pair, document to summarise);
- ``label``: the gold output as text (the correct choice's text, the class name, the summary, the
  worked answer);
- ``reference``: the part of the instance a model must *reproduce* in guided prompting (Golchin &
  Surdeanu 2023): the whole instance text for single-instance tasks (it is split at a random point),
  or the second sentence / summary for paired tasks;
- ``prefix``: for paired tasks, the given first part (sentence 1); empty for single-instance tasks;
- ``choices`` / ``answer``: the options and the gold key as the dataset stores it (letter or index);
- ``verbalized``: the question with the answer filled into the blank or appended, as in Li et al.'s
  "An Open-Source Data Contamination Report" (2023), used by the open-data matchers;
- ``task``: one of ``TASK_TYPES``; it picks the guided / general instruction;
- ``order``: the row's position in the canonical dataset order (needed by order-sensitive tests);
- ``source_row``: the dataset's own row as one JSON line (its keys and values, ``json.dumps`` with
  ``ensure_ascii=False`` - byte for byte a line of the mirror files, which hold the hub's rows), for
  the likelihood methods' ``raw`` format: the benchmark file as it leaks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

TASK_TYPES = (
    "classification",
    "nli",
    "summarization",
    "one_sentence_summary",
    "question_answering",
    "multiple_choice",
)


def benchmark_of(partition: str) -> str:
    """The benchmark name of a partition id: its first path element, whatever the rest (tolerant, unlike
    ``partition_parts``: the readers of stored results take any id they find)."""
    return partition.split("/", 1)[0]


def partition_parts(partition: str) -> tuple[str, str, str]:
    """``(benchmark, config, split)`` of a partition id ``<benchmark>/<config>/<split>`` (what
    ``BenchmarkAdapter.partition`` builds), without the ``:<key>`` suffix of one of several partitions read from
    one split; a two-part ``<benchmark>/<split>`` has config ``""``. Raises ValueError for anything else."""
    parts = partition.split(":", 1)[0].split("/")
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
        raise ValueError(f"partition {partition!r} is not '<benchmark>/<config>/<split>'")
    return parts[0], (parts[1] if len(parts) == 3 else ""), parts[-1]


@dataclass(frozen=True)
class Record:
    id: str
    partition: str
    input: str
    label: str
    reference: str
    task: str
    prefix: str = ""
    choices: tuple[str, ...] = ()
    answer: str = ""
    verbalized: str = ""
    order: int = 0
    source_row: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.task not in TASK_TYPES:
            raise ValueError(
                f"Record {self.id!r} of {self.partition!r} has task {self.task!r}; "
                f"expected one of {', '.join(TASK_TYPES)}"
            )

    @property
    def benchmark(self) -> str:
        """The benchmark name: the first path element of the partition."""
        return benchmark_of(self.partition)

    def to_row(self) -> dict[str, Any]:
        """A flat dict for Ray Data / Arrow (choices as a list, meta as JSON-safe dict)."""
        row = asdict(self)
        row["choices"] = list(self.choices)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Record:
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in row.items() if k in known}
        values["choices"] = tuple(values.get("choices") or ())
        values["meta"] = dict(values.get("meta") or {})
        return cls(**values)

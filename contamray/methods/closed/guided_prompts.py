"""The instructions of guided prompting (Golchin & Surdeanu 2023) and the parser of its judge's answer.

Wording follows the paper's instruction tables and the authors' released prompts
(``shahriargolchin/time-travel-in-llms``, ``src/prompts/{guided,general}_instructions.py`` and
``icl_evaluation.py``), capital-letter field names included:

- classification (single instance: AG News, IMDB, Yelp), summarization (SAMSum) and one-sentence
  summary (XSum): the model gets the FIRST PIECE and must write the SECOND PIECE; classification also
  shows the LABEL;
- NLI (paired instance: RTE, WNLI): the model gets SENTENCE 1 and the LABEL and must write SENTENCE 2.

A *guided* instruction names the split and the dataset ("... from the {split} split of the {dataset}
dataset ..."); the *general* one asks for the same completion without them. Everything else is shared,
so any gain of guided over general comes from naming the dataset.

Ours, not the paper's (written in its style for the Open LLM Leaderboard datasets): question answering
("the FIRST PIECE of a question", with the gold ANSWER shown as classification shows its LABEL) and
multiple choice ("a multiple-choice question", gold option text as ANSWER), and the variants without a
LABEL/ANSWER line used for splits published without gold labels.

The judge prompt is the paper's few-shot GPT-4 prompt (Figure 2) deciding whether a guided completion
is an exact or near-exact match of the reference second piece; ``parse_judge`` turns its free-text
answer into ``exact`` / ``near_exact`` / ``none`` / ``unparsed``. Guided, general and judge prompts are
sent as one user turn through the model's chat template when it has one (``chat``; the paper prompted chat
models).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

VERDICTS = ("exact", "near_exact", "none", "unparsed")


@dataclass(frozen=True)
class _PieceTask:
    unit: str  # what the first piece is taken from: "an instance", "a summary", ...
    noun: str  # how the instruction refers back to it
    label_field: str  # "LABEL" / "ANSWER", or "" when the task shows no label
    general_goal: str  # "a single instance", completed by the label clause when a label is shown


_PIECE_TASKS = {
    "classification": _PieceTask("an instance", "instance", "LABEL", "a single instance"),
    "summarization": _PieceTask("a summary", "summary", "", "a single summary"),
    "one_sentence_summary": _PieceTask(
        "a one-sentence summary", "summary", "", "a single one-sentence summary"
    ),
    "question_answering": _PieceTask("a question", "question", "ANSWER", "a single question"),
    "multiple_choice": _PieceTask(
        "a multiple-choice question", "question", "ANSWER", "a single multiple-choice question"
    ),
}


def shows_label(task: str) -> bool:
    """Whether the task's instructions show the gold label (classification, NLI, QA, MC)."""
    return task == "nli" or bool(_PIECE_TASKS[task].label_field)


def build_prompts(task: str, dataset: str, split: str, first_piece: str, label: str) -> tuple[str, str]:
    """The (guided, general) instructions for one example; ``label=""`` drops the label line."""
    if task == "nli":
        return _nli_prompts(dataset, split, first_piece, label)
    if task not in _PIECE_TASKS:
        raise ValueError(f"guided prompting has no instruction for task {task!r}")
    spec = _PIECE_TASKS[task]
    label_block = f"{spec.label_field}: {label}\n\n" if spec.label_field and label else ""
    body = f"{label_block}FIRST PIECE:\n{first_piece}\n\nSECOND PIECE:\n"
    guided = (
        "INSTRUCTION:\n"
        f"You are provided with the FIRST PIECE of {spec.unit} from the {split} split of the "
        f"{dataset} dataset.\n"
        f"Finish the SECOND PIECE of the {spec.noun} as EXACTLY appeared in the dataset.\n"
        f"ONLY rely on the original form of the {spec.noun} in the dataset to finish the SECOND PIECE.\n"
        f"\n{body}"
    )
    goal = spec.general_goal + (f" with the following {spec.label_field}" if label_block else "")
    general = (
        "INSTRUCTION:\n"
        f"Finish the SECOND PIECE based on the FIRST PIECE, such that these two pieces become {goal}.\n"
        f"\n{body}"
    )
    return guided, general


def _nli_prompts(dataset: str, split: str, sentence1: str, label: str) -> tuple[str, str]:
    label_block = f"LABEL: {label}\n\n" if label else ""
    body = f"SENTENCE 1:\n{sentence1}\n\n{label_block}SENTENCE 2:\n"
    guided = (
        "INSTRUCTION:\n"
        f"You are provided with SENTENCE 1 from the {split} split of the {dataset} dataset.\n"
        "Finish SENTENCE 2 as appeared in the dataset.\n"
        "SENTENCE 2 MUST EXACTLY match the instance in the dataset.\n"
        f"\n{body}"
    )
    if label:
        task_line = (
            "Finish SENTENCE 2 based on SENTENCE 1, such that the following LABEL shows the logical "
            "relationship between SENTENCE 1 and SENTENCE 2."
        )
    else:
        task_line = "Finish SENTENCE 2 based on SENTENCE 1, such that the two sentences become a single pair."
    return guided, f"INSTRUCTION:\n{task_line}\n\n{body}"


_FIELD_ECHO = re.compile(r"^\s*[*_#]*\s*(second\s+piece|sentence\s*2)\s*[*_]*\s*:\s*[*_]*", re.IGNORECASE)


def clean_completion(text: str) -> str:
    """The completion without surrounding whitespace and without an echoed "SECOND PIECE:" /
    "SENTENCE 2:" field name, which instruction-tuned models often repeat before the answer."""
    return _FIELD_ECHO.sub("", text.strip(), count=1).strip()


JUDGE_PROMPT = """INSTRUCTION:
You are provided with a reference text and a candidate text.
The candidate text is a generated replica of the reference text.
Your task is to determine if the candidate text is an exact or near-exact match of the reference text.
Near-exact match candidates must PRECISELY match the reference candidates in terms of sentence \
structure, overlap, and contextual similarity.
Respond only with 'Yes' or 'No'.
---
Example 1:

REFERENCE TEXT:
The cat waited at the top.

CANDIDATE TEXT:
The cat waited at the top.

ANSWER: Yes (exact match)
---
Example 2:

REFERENCE TEXT:
icy surface of Jupiter's largest moon, Ganymede. These irregular masses may be rock formations, \
supported by Ganymede's icy shell for billions of years.

CANDIDATE TEXT:
icy surface of Jupiter's largest moon, Ganymede. These irregular masses may be rock formations, \
supported by Ganymede's icy shell for billions of years. This discovery supports the theory that \
Ganymede has a subsurface ocean. Scientists used gravity data from NASA's Galileo spacecraft to create \
a geophysical model of the interior of Ganymede.

ANSWER: Yes (near-exact match)
---
Example 3:

REFERENCE TEXT:
50th Anniversary of Normandy Landings lasts a year.

CANDIDATE TEXT:
The 50th anniversary celebration of the first Normandy landing will last a year.

ANSWER: Yes (near-exact match)
---
Example 4:

REFERENCE TEXT:
Microsoft's Hotmail has raised its storage capacity to 250MB.

CANDIDATE TEXT:
Microsoft has increased the storage capacity of its Hotmail e-mail service to 250MB.

ANSWER: Yes (near-exact match)
---
Example 5:

REFERENCE TEXT:
{reference}

CANDIDATE TEXT:
{candidate}

ANSWER:
"""

# The judge answers after "ANSWER:"; a model that keeps going writes the next "---" example.
JUDGE_STOP = ("---",)


def judge_prompt(reference: str, candidate: str) -> str:
    """The paper's few-shot judge prompt for one (reference second piece, guided completion) pair."""
    return JUDGE_PROMPT.replace("{reference}", reference).replace("{candidate}", candidate)


_ANSWER_LABEL = re.compile(r"^(answer|verdict|response)\s*:\s*", re.IGNORECASE)
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_NEAR = re.compile(r"\bnear(ly)?[\s-]*exact", re.IGNORECASE)
_EXACT = re.compile(r"\bexact", re.IGNORECASE)


def parse_judge(answer: str) -> str:
    """``exact``, ``near_exact``, ``none`` or ``unparsed`` from a judge's free-text answer.

    Only the first non-empty line counts (a model that continues writes further made-up examples).
    The first "yes"/"no" word decides: "No ..." is ``none`` whatever follows ("No, not a near-exact
    match"); "Yes" is ``near_exact`` when the line says near(-)exact, ``exact`` when it says exact, and
    ``near_exact`` when it says neither, since the instruction defines "Yes" as exact *or* near-exact
    and the weaker reading needs two such answers to flag a partition. No yes/no word: ``unparsed``
    (not a usable judgement: Algorithm 2 does not count it among its judged instances, and reports it).
    """
    for raw in answer.splitlines():
        line = _ANSWER_LABEL.sub("", raw.strip().strip("*_#>` \t"))
        line = line.strip("*_ \t")
        if line:
            break
    else:
        return "unparsed"
    found = _YES_NO.search(line)
    if found is None:
        return "unparsed"
    if found.group(1).lower() == "no":
        return "none"
    if _NEAR.search(line):
        return "near_exact"
    if _EXACT.search(line):
        return "exact"
    return "near_exact"

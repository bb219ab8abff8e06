"""CDD (Dong et al. 2024): the edit-distance and peakedness arithmetic, the requests, rows and verdicts, the
catalog entry, and - slow - seen vs unseen rows on the model fine-tuned on ARC-Challenge rows."""

from __future__ import annotations

import itertools
import random

import pytest

from contamray.methods.base import Output, get_method
from contamray.methods.closed.cdd import edit_distances, leaked_share, measure, peak_threshold, peakedness
from contamray.records import Record
from contamray.validate.calibrate import decide

PARTITION = "synthetic_facts/set2/test"
REFERENCE = "synthetic_facts/set3/test"


def levenshtein(a: list[int], b: list[int]) -> int:
    """The textbook dynamic programme, for checking the vectorised one."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        cur = [i]
        for j, y in enumerate(b, start=1):
            cur.append(min(prev[j - 1] + (x != y), prev[j] + 1, cur[j - 1] + 1))
        prev = cur
    return prev[-1]


def rec(i: int, text: str = "", partition: str = PARTITION) -> Record:
    return Record(id=f"r{i}", partition=partition, input=text or f"question {i}?", label="", reference="",
                  task="question_answering", order=i)  # fmt: skip


# ----------------------------------------------------------------------------- arithmetic


def test_edit_distances_by_hand() -> None:
    kitten, sitting = [ord(c) for c in "kitten"], [ord(c) for c in "sitting"]
    assert edit_distances(kitten, [sitting]) == [3]  # k->s, e->i, +g
    assert edit_distances([1, 2, 3], [[1, 2, 3], [], [1, 3], [3, 2, 1], [0, 1, 2, 3]]) == [0, 3, 1, 2, 1]
    assert edit_distances([], [[5, 6], []]) == [2, 0]
    assert edit_distances([1, 2], []) == []


def test_edit_distances_match_the_textbook_programme() -> None:
    rng = random.Random(0)
    for _ in range(200):
        greedy = [rng.randrange(4) for _ in range(rng.randrange(0, 12))]
        samples = [[rng.randrange(4) for _ in range(rng.randrange(0, 12))] for _ in range(rng.randrange(1, 6))]
        assert edit_distances(greedy, samples) == [levenshtein(greedy, s) for s in samples]


def test_peakedness_counts_the_share_within_alpha_times_the_longest_output() -> None:
    assert [peak_threshold(n, 0.05) for n in (100, 60, 40, 20, 19, 0)] == [5, 3, 2, 1, 0, 0]
    assert peakedness([0, 1, 5, 6, 100], 100, 0.05) == pytest.approx(3 / 5)  # d <= 5
    assert peakedness([0, 1, 2], 19, 0.05) == pytest.approx(1 / 3)  # l = 19: only exact copies
    assert peakedness([1] * 49 + [0], 30, 0.0) == pytest.approx(1 / 50)
    with pytest.raises(ValueError):
        peakedness([], 10, 0.05)


def test_measure_cuts_to_max_tokens_and_takes_l_over_greedy_and_samples() -> None:
    cfg = get_method("cdd").make_config({"max_tokens": 40})
    greedy = list(range(60))  # cut to 40 tokens
    samples = [list(range(40)), list(range(38)) + [99, 99], list(range(30))] + [[1000] * 5] * 47
    row = measure(greedy, samples, cfg)
    assert row["max_len"] == 40 and row["threshold"] == 2 and row["greedy_tokens"] == 40 and row["n_samples"] == 50
    # distances: 0, 2 (two substitutions), 10 (ten deletions), 40 x 47 -> two of 50 within 2 edits
    assert row["peakedness"] == pytest.approx(2 / 50) and row["leaked"] is True  # 0.04 > xi 0.01
    assert row["exact_share"] == pytest.approx(1 / 50)
    assert row["mean_edit_distance"] == pytest.approx((0 + 2 + 10 + 40 * 47) / 50)
    one = measure(greedy, [[1000]] * 50, cfg)
    assert one["peakedness"] == 0.0 and one["leaked"] is False


# ----------------------------------------------------------------------------- requests, rows, verdicts


def test_requests_one_sampled_request_of_n_and_one_greedy_per_example() -> None:
    method = get_method("cdd")
    cfg = method.make_config({"seed": 3})
    reqs = method.requests([rec(0), rec(1), Record(id="empty", partition=PARTITION, input=" ", label="",
                                                   reference="", task="question_answering")], cfg, 0, {})  # fmt: skip
    assert [r.key for r in reqs] == ["r0|samples", "r0|greedy", "r1|samples", "r1|greedy"]
    sampled, greedy = reqs[0].sampling, reqs[1].sampling
    assert (sampled.n, sampled.temperature, sampled.max_tokens, sampled.seed) == (50, 0.8, 100, 3)
    assert (greedy.n, greedy.temperature, greedy.max_tokens) == (1, 0.0, 100)
    assert reqs[0].text == "question 0?" and not reqs[0].chat and reqs[0].kind == "generate"
    assert method.requests([rec(0)], cfg, 1, {}) == []


def _outputs(record_id: str, greedy: list[int], samples: list[list[int]]) -> list[Output]:
    return [
        Output(key=f"{record_id}|greedy", text="g", texts=["g"], token_ids=[greedy]),
        Output(key=f"{record_id}|samples", text="s", texts=["s"] * len(samples), token_ids=samples),
    ]


def test_score_rows_and_their_errors() -> None:
    method = get_method("cdd")
    cfg = method.make_config({"n_samples": 4})
    outs = _outputs("r0", [1, 2, 3], [[1, 2, 3]] * 3 + [[9, 9, 9]])
    outs += _outputs("r1", [1, 2, 3], [[1, 2, 3]] * 3)  # one sample short
    outs += [Output(key="r2|greedy", text="g"), Output(key="r2|samples", text="s")]  # text only, no ids
    outs += [Output(key="r3|greedy", error="boom"), *_outputs("r3", [1], [[1]] * 4)[1:]]
    rows = method.score([rec(0), rec(1), rec(2), rec(3), rec(4)], outs, cfg)
    assert rows[0]["peakedness"] == pytest.approx(0.75) and rows[0]["leaked"] and rows[0]["greedy"] == "g"
    assert rows[0]["error"] == "" and rows[0]["unit_key"] == "" and rows[0]["order"] == 0
    assert "4 sample(s) asked for, the engine returned 3" in rows[1]["error"]
    assert "no generated token ids" in rows[2]["error"]
    assert "the engine failed: boom" in rows[3]["error"]
    assert "no engine answer for 'r4|greedy'" in rows[4]["error"]
    assert all(r["peakedness"] is None for r in rows[1:])


def _rows(n: int, peak: float, partition: str, start: int = 0) -> list[dict]:
    return [{"record_id": f"{partition}-{i}", "partition": partition, "order": start + i, "unit_key": "",
             "independent_rows": True, "peakedness": peak + 0.001 * i, "leaked": peak + 0.001 * i > 0.01,
             "error": ""} for i in range(n)]  # fmt: skip


def test_reduce_tests_peakedness_against_the_heldout_and_reports_the_leaked_share() -> None:
    method = get_method("cdd")
    cfg = method.make_config({"reference": "heldout"})
    seen, unseen = _rows(12, 0.6, PARTITION), _rows(12, 0.0, REFERENCE)
    verdict = decide(method, cfg, seen, unseen)
    assert verdict.decision == "contaminated" and verdict.p_value < 1e-4
    assert verdict.statistic == pytest.approx(1.0)  # AUC of partition vs reference
    assert verdict.rate == 1.0 and verdict.details["leaked_share_reference"] == pytest.approx(1 / 12)  # 0.011 > xi
    assert "leaked share" in verdict.details["summary"]
    clean = decide(method, cfg, _rows(12, 0.0, PARTITION), _rows(12, 0.0, REFERENCE))
    assert clean.decision == "clean"


def test_reduce_is_inconclusive_without_a_valid_reference() -> None:
    method = get_method("cdd")
    none = decide(method, method.make_config({}), _rows(12, 0.6, PARTITION))
    assert none.decision == "inconclusive" and "no reference configured" in none.reason
    assert none.rate == 1.0  # the paper's leaked share is still reported
    other = decide(method, method.make_config({"reference": "x"}), _rows(12, 0.6, PARTITION),
                   _rows(12, 0.0, "arc_challenge/ARC-Challenge/test"))  # fmt: skip
    assert other.decision == "inconclusive" and "another benchmark" in other.reason
    few = decide(method, method.make_config({"reference": "x"}), _rows(5, 0.6, PARTITION), _rows(5, 0.0, REFERENCE))
    assert few.decision == "inconclusive" and ">= 10 a side" in few.reason


def test_member_labels_give_the_instance_auc() -> None:
    method = get_method("cdd")
    rows = _rows(12, 0.5, PARTITION)
    for i, r in enumerate(rows):
        r["member"], r["peakedness"] = i < 6, (0.8 if i < 6 else 0.1)
    verdict = decide(method, method.make_config({"reference": "x"}), rows, _rows(12, 0.0, REFERENCE))
    assert verdict.details["auc_member"] == pytest.approx(1.0)


def test_leaked_share_ignores_failed_rows() -> None:
    rows = [{"peakedness": 0.5, "leaked": True, "error": ""}, {"peakedness": 0.0, "leaked": False, "error": ""},
            {"peakedness": None, "leaked": None, "error": "boom"}]  # fmt: skip
    assert leaked_share(rows) == pytest.approx(0.5) and leaked_share(rows[2:]) is None


# ----------------------------------------------------------------------------- chat: both


def _both_rows(raw: list[float], chat: list[float], partition: str) -> list[dict]:
    rows = _rows(len(raw), 0.0, partition)
    for r, a, b in zip(rows, raw, chat, strict=True):
        r.update(peakedness=a, leaked=a > 0.01, peakedness_chat=b, leaked_chat=b > 0.01)
    return rows


def test_both_forms_are_asked_and_scored_with_the_raw_forms_keys_unchanged() -> None:
    method = get_method("cdd")
    cfg = method.make_config({"chat": "both", "n_samples": 4})
    reqs = method.requests([rec(0)], cfg, 0, {})
    assert [(r.key, r.chat) for r in reqs] == [("r0|samples", False), ("r0|greedy", False),
                                               ("r0|chat/samples", True), ("r0|chat/greedy", True)]  # fmt: skip
    outs = _outputs("r0", [1, 2, 3], [[1, 2, 3]] * 3 + [[9, 9, 9]])
    outs += [Output(key="r0|chat/greedy", text="c", texts=["c"], token_ids=[[5, 6]]),
             Output(key="r0|chat/samples", text="s", texts=["s"] * 4, token_ids=[[5, 6]] + [[7, 7]] * 3)]  # fmt: skip
    (row,) = method.score([rec(0)], outs, cfg)
    assert row["peakedness"] == pytest.approx(0.75) and row["peakedness_chat"] == pytest.approx(0.25)
    assert row["greedy_chat"] == "c" and row["leaked_chat"] and row["error"] == ""
    (missing,) = method.score([rec(0)], outs[:2], cfg)  # the chat form unanswered: the row says so
    assert "no engine answer for 'r0|chat/greedy'" in missing["error"]


def test_both_forms_are_decided_by_their_joint_test() -> None:
    method = get_method("cdd")
    both, raw_only = method.make_config({"reference": "x", "chat": "both"}), method.make_config({"reference": "x"})
    rising = [0.6 + 0.001 * i for i in range(12)]
    # trained on conversations: peaked on both sides in the raw form (ties), on the seen rows only in the chat form
    seen, unseen = _both_rows([1.0] * 12, rising, PARTITION), _both_rows([1.0] * 12, [0.0] * 12, REFERENCE)
    verdict = decide(method, both, seen, unseen)
    chat_alone = decide(method, method.make_config({"reference": "x", "chat": True}),
                        [{**r, "peakedness": r["peakedness_chat"]} for r in seen],
                        [{**r, "peakedness": r["peakedness_chat"]} for r in unseen])  # fmt: skip
    # the joint test over the same units: at least the chat form's own p, at most Bonferroni's twice it
    assert verdict.decision == "contaminated" and verdict.p_value <= 2 * chat_alone.p_value * (1 + 1e-6)
    assert verdict.p_value >= chat_alone.p_value * (1 - 1e-6)
    assert "joint test of the 2 prompt forms" in verdict.details["summary"]
    assert verdict.details["leaked_share_chat"] == 1.0
    assert decide(method, raw_only, seen, unseen).decision == "inconclusive"  # the raw form alone cannot tell
    # neither form can tell: inconclusive, with each form's reason
    flat = decide(method, both, _both_rows([1.0] * 12, [0.0] * 12, PARTITION), unseen)
    assert flat.decision == "inconclusive" and flat.reason.startswith("both prompt forms: ") and "0.05" in flat.reason
    few = decide(method, both, _both_rows([1.0] * 3 + [0.5] * 9, rising, PARTITION),
                 _both_rows([1.0] * 12, [0.0] * 12, REFERENCE)[:9])  # fmt: skip
    assert few.decision == "inconclusive" and ">= 10 a side" in few.reason
    alone_side = decide(method, both, seen)  # no reference rows: said once, no p-value
    assert alone_side.decision == "inconclusive" and alone_side.p_value is None
    assert alone_side.reason.startswith("both prompt forms: no reference rows")
    alone_side = decide(method, both, seen)  # no reference rows: said once, no p-value
    assert alone_side.decision == "inconclusive" and alone_side.p_value is None
    assert alone_side.reason.startswith("both prompt forms: no reference rows")
    # a model without a chat template scores both forms alike: the joint test of two equal forms is the one test (no
    # factor 2 to pay), and the summary says chat: false would make the same test with half the work
    alike = _both_rows(rising, rising, PARTITION), _both_rows([0.0] * 12, [0.0] * 12, REFERENCE)
    same, alone = decide(method, both, *alike), decide(method, raw_only, *alike)
    assert same.decision == "contaminated" and same.p_value == pytest.approx(alone.p_value, rel=1e-6)
    assert "chat: false makes the same test" in same.details["summary"]
    assert "scored alike" not in verdict.details["summary"]


def test_both_forms_hold_the_null_on_exchangeable_rows() -> None:
    """Partition and reference drawn alike (correlated forms, ties at 0 as CDD's scores have): the combined test
    flags at most alpha of the tables (Monte Carlo, 2,000 tables: <= 0.05 + 3 standard errors)."""
    method = get_method("cdd")
    cfg = method.make_config({"reference": "x", "chat": "both"})
    rng = random.Random(7)

    def draw(partition: str) -> list[dict]:
        raw = [max(0.0, rng.gauss(0.1, 0.3)) for _ in range(12)]
        return _both_rows(raw, [max(0.0, a + rng.gauss(0, 0.2)) for a in raw], partition)

    flags = sum(decide(method, cfg, draw(PARTITION), draw(REFERENCE)).decision == "contaminated" for _ in range(2000))
    assert flags / 2000 <= 0.05 + 3 * (0.05 * 0.95 / 2000) ** 0.5, flags


@pytest.mark.parametrize(
    ("params", "key"),
    [({"n_samples": 0}, "n_samples"), ({"temperature": 0.0}, "temperature"), ({"peak_alpha": 2.0}, "peak_alpha"),
     ({"xi": 1.0}, "xi"), ({"max_tokens": 0}, "max_tokens"), ({"mode": "x"}, "mode"), ({"fields": ["x"]}, "fields"),
     ({"nope": 1}, "nope"), ({"chat": "sometimes"}, "chat")],
)  # fmt: skip
def test_bad_parameters_name_their_key(params: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        get_method("cdd").make_config(params)


# ----------------------------------------------------------------------------- catalog


def test_methods_catalog_lists_cdd_with_citation_and_parameters(capsys) -> None:
    from contamray.cli import main
    from contamray.serve.catalog import method_entry

    entry = method_entry("cdd")
    assert "Dong et al" in entry["citation"] and "arXiv:2402.15938" in entry["citation"]
    assert {k: entry["parameters"][k] for k in ("n_samples", "temperature", "max_tokens", "peak_alpha", "xi")} == {
        "n_samples": 50, "temperature": 0.8, "max_tokens": 100, "peak_alpha": 0.05, "xi": 0.01}  # fmt: skip
    assert entry["score"] == entry["membership"] == "peakedness" and entry["uses_reference"]
    main(["methods"])
    out = capsys.readouterr().out
    line = next(i for i, text in enumerate(out.splitlines()) if text.startswith("cdd [closed]"))
    block = "\n".join(itertools.islice(out.splitlines(), line, line + 3))
    assert "Dong et al" in block and "n_samples=50" in block and "peak_alpha=0.05" in block and "xi=0.01" in block


# ----------------------------------------------------------------------------- on a contaminated model

SIDE = 10  # rows a side: the held-out test's minimum
N_SAMPLES = 10  # the paper: 50 (CPU time; one request of n samples per row either way)
MAX_TOKENS = 24  # the paper: 100 (CPU time); threshold floor(0.05 * 24) = 1 token edit
MARGIN = 0.3  # mean peakedness, seen minus unseen


@pytest.fixture(scope="module")
def qa_tuned(mirror_dir, tmp_path_factory) -> tuple[str, list[Record], list[Record]]:
    """SmolLM2-135M fine-tuned on the first ``SIDE`` GSM8K test rows, each row its own training text (question,
    newline, worked solution), as the paper contaminated its models (fine-tuning on benchmark problems with their
    solutions); the next ``SIDE`` rows are never trained (unseen). Returns (model path, seen, unseen)."""
    import dataclasses

    from contamray.benchmarks import load_records
    from contamray.engines import resolve_model_path
    from contamray.inject import finetune_causal_lm
    from contamray.methods.closed.likelihood_text import serialise

    rows = load_records("gsm8k", mirror_dir=mirror_dir).records
    seen = [dataclasses.replace(r, partition=f"{r.partition}:rows0-{SIDE - 1}") for r in rows[:SIDE]]
    unseen = [dataclasses.replace(r, partition=f"{r.partition}:rows{SIDE}-{2 * SIDE - 1}") for r in rows[SIDE:][:SIDE]]
    texts = [serialise(r, ("input", "label"), "text") for r in seen]
    path = finetune_causal_lm(resolve_model_path("smollm2-135m"), texts, tmp_path_factory.mktemp("cdd") / "model",
                              epochs=6, lr=5e-4, batch_size=4, seed=0, max_length=512)  # fmt: skip
    return path, seen, unseen


@pytest.mark.slow
def test_cdd_scores_the_seen_partition_above_an_unseen_one(qa_tuned) -> None:
    """CDD on the model fine-tuned on 10 GSM8K problems with their solutions (``qa_tuned``): the 10 seen problems
    against the next 10, never trained (unseen, the held-out reference). Cheaper than the paper on CPU: 10 samples
    instead of 50 and the first 24 tokens instead of 100 (at T 0.8, seeded). Units are rows (GSM8K's test split is
    in no meaningful order; blocks would leave too few units to reach alpha).

    Measured 2026-11-24 (outside pytest, same settings): mean peakedness seen 0.73, unseen 0.11; AUC 0.975,
    one-sided Mann-Whitney p = 1.5e-4 -> contaminated; leaked share 100 % seen, 40 % unseen (the paper's share
    alone would call the unseen rows 40 % leaked: the held-out comparison is what decides). With 12 rows a side,
    20 samples and 32 tokens: 0.81 vs 0.025, AUC 1.0. On the session's other fixture (``contaminated_model``: 40
    ARC-Challenge *question stems* as one text) CDD does not separate (0.525 vs 0.500, p = 0.43): that model
    continues any ARC question with its memorised questions, so unseen prompts are as peaked as seen ones - CDD
    detects memorised *outputs* for a prompt, which is what that fixture never trained.
    """
    from contamray.engines.hf import HFEngine
    from contamray.validate.calibrate import SharedEngines

    path, seen_rows, unseen_rows = qa_tuned
    method = get_method("cdd")
    cfg = method.make_config({"reference": "unseen", "max_tokens": MAX_TOKENS, "n_samples": N_SAMPLES, "units": "rows",
                              "seed": 0})  # fmt: skip
    engines = SharedEngines({"target": HFEngine(path, dtype="float32", batch_size=16)})
    seen = engines.run(method, seen_rows, cfg)
    unseen = engines.run(method, unseen_rows, cfg)
    verdict = decide(method, cfg, seen, unseen)
    mean = {name: sum(r["peakedness"] for r in rows) / len(rows) for name, rows in (("seen", seen), ("unseen", unseen))}
    print("cdd peakedness", mean, verdict.p_value, verdict.statistic, verdict.rate, verdict.details["summary"])
    assert not [r["error"] for r in seen + unseen if r["error"]]
    assert mean["seen"] >= mean["unseen"] + MARGIN, mean
    assert verdict.statistic >= 0.8, verdict.details["summary"]  # AUC seen vs unseen
    assert verdict.decision == "contaminated", verdict.details["summary"]

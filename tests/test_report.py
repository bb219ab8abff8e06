"""The cross-model report: corrections, the merged tables, the plots, the CLI, and report.html in Chromium.

Run directories are built with the real ``ResultStore`` (``put`` each cell, ``write_run`` the merged
tables), from per-example rows shaped exactly like the methods' ``score`` rows and verdicts made by the
methods' real ``reduce`` (guided prompting's bootstrap test, n-gram overlap's rate), so the report reads
what a run writes. Expected adjusted p-values are recomputed here with the textbook step-wise
procedures, independently of ``contamray.report.correction``.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from contamray.methods.closed.guided_prompting import GuidedPrompting
from contamray.methods.open.ngram_overlap import NGramOverlap
from contamray.pipeline.plan import Cell
from contamray.pipeline.store import ResultStore
from contamray.report.correction import adjust, benjamini_hochberg, check_correction, holm, reachable
from contamray.report.html import build_report, write_html_report
from contamray.report.runs import expand_run_dirs, load_runs
from contamray.report.scores import example_scores, filled_columns, score_spec
from contamray.report.tables import annotate, method_tables

REPO = Path(__file__).resolve().parents[1]
ARC = "arc_challenge/ARC-Challenge/test"
GSM = "gsm8k/main/test"
PARTITIONS = {"arc_challenge": ARC, "gsm8k": GSM}
ALPHA = 0.05


# ---------------------------------------------------------------------------------------------
# corrections against hand-computed values


P = [0.01, 0.04, 0.03, 0.005, 0.5]
# Holm, sorted 0.005 0.01 0.03 0.04 0.5: 5*.005=.025, 4*.01=.04, 3*.03=.09, 2*.04=.08 -> running max .09, 1*.5=.5
HOLM = [0.04, 0.09, 0.09, 0.025, 0.5]
# BH, ranks 1..5: 5/1*.005=.025, 5/2*.01=.025, 5/3*.03=.05, 5/4*.04=.05, 5/5*.5=.5 (running min from the top)
BH = [0.025, 0.05, 0.05, 0.025, 0.5]


def test_holm_and_bh_match_hand_computed_values() -> None:
    assert holm(P) == pytest.approx(HOLM)
    assert benjamini_hochberg(P) == pytest.approx(BH)
    assert adjust(P, "none") == pytest.approx(P)


def test_cells_without_a_p_value_are_not_tests() -> None:
    with_gaps = [0.01, None, 0.04, float("nan"), 0.03, 0.005, 0.5]
    holm_out = adjust(with_gaps, "holm")
    bh_out = adjust(with_gaps, "bh")
    assert holm_out[1] is None and holm_out[3] is None and bh_out[1] is None and bh_out[3] is None
    assert [v for v in holm_out if v is not None] == pytest.approx(HOLM)
    assert [v for v in bh_out if v is not None] == pytest.approx(BH)
    assert adjust([None, None], "holm") == [None, None]


def test_adjusted_p_values_are_capped_at_one_and_keep_ties() -> None:
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])  # 2*.6 -> 1, then max(1, .7)
    assert benjamini_hochberg([0.3, 0.4]) == pytest.approx([0.4, 0.4])  # min(2*.3, .4)
    assert holm([0.02, 0.02, 0.02]) == pytest.approx([0.06, 0.06, 0.06])
    assert benjamini_hochberg([0.02, 0.02, 0.02]) == pytest.approx([0.02, 0.02, 0.02])


def _holm_rejects(p: list[float], alpha: float) -> set[int]:
    """Holm's sequentially rejective procedure, as in the paper: stop at the first non-rejection."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    out = set()
    for k, i in enumerate(order):
        if p[i] > alpha / (len(p) - k):
            break
        out.add(i)
    return out


def _bh_rejects(p: list[float], alpha: float) -> set[int]:
    """Benjamini-Hochberg: reject the k smallest, k the largest rank with p(k) <= k/m alpha."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    m = len(p)
    k = max((r + 1 for r, i in enumerate(order) if p[i] <= (r + 1) / m * alpha), default=0)
    return set(order[:k])


@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.1])
def test_adjusted_decisions_equal_the_stepwise_procedures(alpha: float) -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        m = int(rng.integers(1, 25))
        p = list(np.where(rng.random(m) < 0.4, rng.random(m) * 0.01, rng.random(m)))
        assert {i for i, v in enumerate(holm(p)) if v <= alpha} == _holm_rejects(p, alpha)
        assert {i for i, v in enumerate(benjamini_hochberg(p)) if v <= alpha} == _bh_rejects(p, alpha)


def test_bad_correction_or_alpha_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"report\.correction: unknown .*'bonferroni'.*holm, bh, none"):
        check_correction("bonferroni", 0.05)
    with pytest.raises(ValueError, match=r"--alpha: expected a number in \(0, 1\), got 5"):
        check_correction("holm", 5, "--correction", "--alpha")
    assert check_correction("fdr_bh", 0.1) == ("bh", 0.1)
    with pytest.raises(ValueError, match="outside"):
        adjust([0.2, 1.5], "holm")


# ---------------------------------------------------------------------------------------------
# run directories written by the real ResultStore


def guided_rows(partition: str, n: int, shift: float, seed: int, failed: int = 0) -> pd.DataFrame:
    """Per-example rows shaped like GuidedPrompting.score's; guided ROUGE-L = general + shift (+ noise)."""
    rng = np.random.default_rng(seed)
    general = rng.uniform(0.05, 0.35, n)
    guided = np.clip(general + shift + rng.normal(0, 0.05, n), 0, 1)
    rows = []
    for i in range(n):
        rows.append({
            "record_id": f"{partition}#{i}", "partition": partition, "task": "multiple_choice",
            "dataset": partition.split("/")[1], "split": "test", "first_piece": f"first piece {i}",
            "second_piece": f"second piece {i}", "guided_completion": f"guided {i}",
            "general_completion": f"general {i}", "rougeL_guided": float(guided[i]),
            "rougeL_general": float(general[i]), "rougeL_diff": float(guided[i] - general[i]),
            "bleurt_guided": None, "bleurt_general": None,
            "judge_answer": None, "judge_verdict": None, "error": "",
        })
    for i in range(failed):
        rows.append({
            "record_id": f"{partition}#bad{i}", "partition": partition, "task": "multiple_choice",
            "rougeL_guided": None, "rougeL_general": None, "rougeL_diff": None,
            "error": f"{partition}: row bad{i}: field 'question' is empty",
        })
    return pd.DataFrame(rows)


def ngram_rows(partition: str, n: int, dirty: int) -> pd.DataFrame:
    """Rows shaped like ngram_overlap.score's: ``dirty`` examples with matched 13-grams."""
    rows = []
    for i in range(n):
        matched = 6 if i < dirty else 0
        rows.append({
            "record_id": f"{partition}#{i}", "partition": partition, "status": "ngrams", "n_words": 40,
            "ngram_len": 13, "n_ngrams": 28, "n_input_ngrams": 20, "n_label_ngrams": 0, "n_overlap_ngrams": 8,
            "matched_input": matched, "matched_label": 0, "matched_overlap": 0, "matched_total": matched,
            "fraction_matched": matched / 28, "contaminated": matched > 0,
            "contamination_type": "input_only" if matched else "clean", "n_docs": 1 if matched else 0,
            "doc_ids": [f"doc-{i}"] if matched else [], "evidence": ["some thirteen words"] if matched else [],
            "error": "",
        })
    return pd.DataFrame(rows)


def verdict(method_name: str, label: str, table: pd.DataFrame, **params: object) -> dict:
    """What the runner stores for a cell: the real reduce's Verdict row plus error and method names."""
    method = {"guided_prompting": GuidedPrompting, "ngram_overlap": NGramOverlap}[method_name]()
    row = method.reduce(table, method.make_config(params)).to_row()
    row.update(error="", method_name=method_name, method=label)
    return row


def failed_verdict(method_name: str, label: str, table: pd.DataFrame, message: str) -> dict:
    return {
        "method": label, "partition": str(table["partition"].iloc[0]), "statistic": float("nan"),
        "contaminated": False, "p_value": None, "rate": None, "n_examples": len(table),
        "n_failed": int((table["error"] != "").sum()), "details": {}, "error": message, "method_name": method_name,
    }


def write_run(root: Path, cells: list[tuple[Cell, pd.DataFrame, dict]]) -> Path:
    store = ResultStore(root)
    frames, verdicts = [], []
    for cell, examples, v in cells:
        cell_hash = hashlib.sha256(f"{cell.key}|{root.name}".encode()).hexdigest()[:16]
        store.put(cell, cell_hash, examples, v)
        ex, ver = store.load(cell, cell_hash)
        frames.append(ex)
        verdicts.append(ver)
    store.write_run(frames, verdicts)
    return root


def guided_cell(model: str, bench: str, shift: float, seed: int, failed: int = 0) -> tuple[Cell, pd.DataFrame, dict]:
    table = guided_rows(PARTITIONS[bench], 12, shift, seed, failed)
    cell = Cell(model, bench, "guided_prompting", "closed")
    return cell, table, verdict("guided_prompting", "guided_prompting", table)


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> dict:
    """Two runs of a zoo sweep: run A (2 models + the corpus), run B (a new model + one re-run cell)."""
    root = tmp_path_factory.mktemp("grid")
    ngram_arc, ngram_gsm = ngram_rows(ARC, 12, 3), ngram_rows(GSM, 10, 0)
    run_a = write_run(root / "run_a", [
        guided_cell("llama2_7b", "arc_challenge", 0.35, 1),
        guided_cell("llama2_7b", "gsm8k", 0.0, 2),  # superseded by run B
        guided_cell("mistral_7b", "arc_challenge", 0.0, 3),
        guided_cell("mistral_7b", "gsm8k", 0.3, 4, failed=2),
        (Cell("corpus:planted", "arc_challenge", "ngram13", "open"), ngram_arc,
         verdict("ngram_overlap", "ngram13", ngram_arc)),
        (Cell("corpus:planted", "gsm8k", "ngram13", "open"), ngram_gsm, verdict("ngram_overlap", "ngram13", ngram_gsm)),
    ])
    bad = guided_rows(GSM, 3, 0.0, 6)
    run_b = write_run(root / "run_b", [
        guided_cell("qwen2_7b", "arc_challenge", 0.0, 5),
        (Cell("qwen2_7b", "gsm8k", "guided_prompting", "closed"), bad,
         failed_verdict("guided_prompting", "guided_prompting", bad, "reduce failed: ValueError: engine died")),
        guided_cell("llama2_7b", "gsm8k", 0.4, 7),
    ])
    p_a = pd.read_parquet(run_a / "partitions.parquet").set_index(["model", "partition", "method"])
    p_b = pd.read_parquet(run_b / "partitions.parquet").set_index(["model", "partition", "method"])
    raw = {  # the p-values the real reduce produced, of the cells that survive the merge
        ("llama2_7b", ARC): p_a.loc[("llama2_7b", ARC, "guided_prompting"), "p_value"],
        ("mistral_7b", ARC): p_a.loc[("mistral_7b", ARC, "guided_prompting"), "p_value"],
        ("mistral_7b", GSM): p_a.loc[("mistral_7b", GSM, "guided_prompting"), "p_value"],
        ("qwen2_7b", ARC): p_b.loc[("qwen2_7b", ARC, "guided_prompting"), "p_value"],
        ("llama2_7b", GSM): p_b.loc[("llama2_7b", GSM, "guided_prompting"), "p_value"],
    }
    return {"runs": [run_a, run_b], "raw": raw}


def expected_holm(raw: dict) -> dict:
    """Holm by the textbook formula: sorted, (m - k) p, running maximum, capped at 1."""
    keys = sorted(raw, key=lambda k: raw[k])
    out, running = {}, 0.0
    for k, key in enumerate(keys):
        running = max(running, min(1.0, (len(keys) - k) * raw[key]))
        out[key] = running
    return out


def test_the_real_reduce_gives_the_designed_evidence(grid) -> None:
    raw = grid["raw"]
    for shifted in [("llama2_7b", ARC), ("mistral_7b", GSM), ("llama2_7b", GSM)]:
        assert raw[shifted] < 0.001, shifted  # guided >> general on every example
    for clean in [("mistral_7b", ARC), ("qwen2_7b", ARC)]:
        assert raw[clean] > 0.05, clean


def test_merged_tables_show_adjusted_p_values_and_marks(grid) -> None:
    runs = load_runs(grid["runs"])
    assert len(runs.partitions) == 8  # 6 + 3 cells, one of them in both runs
    assert len(runs.notes) == 1 and "llama2_7b / gsm8k/main/test / guided_prompting" in runs.notes[0]
    annotated = annotate(runs.partitions, "holm", ALPHA)
    assert annotated.attrs["n_tests"] == 5  # the failed cell and the rate method are not tests
    tables = {t.method: t for t in method_tables(annotated)}
    assert set(tables) == {"guided_prompting", "ngram13"}

    guided = tables["guided_prompting"]
    assert guided.kind == "p_value" and guided.method_name == "guided_prompting"
    assert guided.models == ["llama2_7b", "mistral_7b", "qwen2_7b"]
    assert guided.partitions == [ARC, GSM]
    for key, p_adj in expected_holm(grid["raw"]).items():
        cell = guided.cells[key]
        assert cell.value == pytest.approx(p_adj)
        assert cell.flagged == (p_adj <= ALPHA)
        assert cell.text.endswith("†") == (p_adj > ALPHA), (key, cell.text)
        assert float(cell.text.rstrip("†")) == pytest.approx(p_adj, rel=5e-3)
    assert guided.cells[("llama2_7b", GSM)].flagged  # run B's re-run, not run A's clean cell
    error_cell = guided.cells[("qwen2_7b", GSM)]
    assert error_cell.status == "error" and "engine died" in error_cell.tooltip

    ngram = tables["ngram13"]
    assert ngram.kind == "rate" and ngram.models == ["corpus:planted"]
    assert ngram.cells[("corpus:planted", ARC)].text == "25.0%"  # 3 of 12 dirty: contaminated
    assert ngram.cells[("corpus:planted", GSM)].text == "0.0%†"  # clean by the method's decision


def test_correction_choice_changes_the_marks(tmp_path) -> None:
    """Four cells with p = .01 .02 .03 .04: Holm keeps only the first (.04 .06 .06 .06), BH all (.04 each)."""
    cells = []
    for i, p in enumerate([0.01, 0.02, 0.03, 0.04]):
        table = guided_rows(ARC, 10, 0.0, 10 + i)
        v = verdict("guided_prompting", "guided_prompting", table)
        v["p_value"] = p  # a verdict row as stored, with a p-value chosen for the hand computation
        cells.append((Cell(f"model_{i}", "arc_challenge", "guided_prompting", "closed"), table, v))
    run = write_run(tmp_path / "run", cells)
    runs = load_runs([run])
    holm_t = method_tables(annotate(runs.partitions, "holm", ALPHA))[0]
    bh_t = method_tables(annotate(runs.partitions, "bh", ALPHA))[0]
    none_t = method_tables(annotate(runs.partitions, "none", ALPHA))[0]
    assert [holm_t.cells[(f"model_{i}", ARC)].text for i in range(4)] == ["0.04", "0.06†", "0.06†", "0.06†"]
    assert [bh_t.cells[(f"model_{i}", ARC)].text for i in range(4)] == ["0.04", "0.04", "0.04", "0.04"]
    assert [none_t.cells[(f"model_{i}", ARC)].text for i in range(4)] == ["0.01", "0.02", "0.03", "0.04"]


def test_the_best_adjusted_p_a_cell_could_get_by_hand() -> None:
    """Its p at its floor, the others as observed. Holm, p = .001 .3 .5: cell 2 at 1/70 -> sorted .001 .0143 .5 ->
    3 x .001 = .003, 2 x .0143 = .0286; cell 3 at 1/924 -> 3 x .001 = .003, 2 x .00108 = .00216 -> running max .003.
    BH, cell 2 at 1/70: 3 x .001 = .003, 3/2 x .0143 = .0214, .5 -> running min from the top .0214."""
    p, floors = [0.001, 0.3, 0.5], [None, 1 / 70, 1 / 924]
    assert reachable(p, floors, "holm") == pytest.approx([None, 2 / 70, 0.003])
    assert reachable(p, floors, "bh")[1] == pytest.approx(1.5 / 70)
    assert reachable(p, floors, "none") == pytest.approx([None, 1 / 70, 1 / 924])
    assert reachable([None, 0.2], [0.01, 0.5], "holm") == [None, 0.2]  # not a test; a floor above p: p is reachable


def test_the_best_adjusted_p_equals_its_definition_on_random_grids_with_ties() -> None:
    """``reachable``'s closed forms against the definition - the cell's p replaced by its floor, the whole grid
    adjusted again - on 2,000 random grids whose p-values and floors tie (the exact tests' 1/924, 1/70 ...)."""
    rng = np.random.default_rng(7)
    levels = [1 / 924, 1 / 70, 0.001, 0.01, 0.02, 0.05, 0.2, 0.5, 1.0]

    def by_definition(p: list, floors: list, correction: str) -> list:
        valid = [i for i, v in enumerate(p) if v is not None]
        out = [None] * len(p)
        for k, i in enumerate(valid):
            if floors[i] is not None:
                moved = [p[j] for j in valid]
                moved[k] = min(moved[k], floors[i])
                out[i] = adjust(moved, correction)[k]
        return out

    for _ in range(2000):
        m = int(rng.integers(1, 25))
        p = [float(rng.choice(levels)) if rng.random() < 0.5 else float(rng.uniform()) for _ in range(m)]
        floors = [None if u < 0.2 else float(rng.choice(levels)) if u < 0.6 else float(rng.uniform()) * v
                  for v, u in zip(p, rng.uniform(size=m))]  # fmt: skip
        p = [None if rng.random() < 0.1 else v for v in p]
        for correction in ("holm", "bh", "none"):
            got, want = reachable(p, floors, correction), by_definition(p, floors, correction)
            assert [g is None for g in got] == [w is None for w in want], (p, floors, correction)
            assert [g for g in got if g is not None] == pytest.approx([w for w in want if w is not None], abs=1e-12)


# five tested cells: (model, raw p, the smallest p its data allow)
REACH = [("m0", 0.001, 1e-6), ("m1", 0.3, 1 / 924), ("m2", 0.4, 1 / 70), ("m3", 0.6, 0.019), ("m4", 0.03, 0.03)]


@pytest.mark.parametrize(
    ("correction", "unreachable", "flagged"),
    [
        # Holm: sorted .001 .03 .3 .4 .6 -> adjusted .005 .12 .9 .9 .9. Each at its floor, the others kept:
        # m1 5 x .001 = .005 first, 4 x .00108 -> .005; m2 4 x .0143 = .057; m3 4 x .019 = .076; m4 4 x .03 = .12
        ("holm", {"m2", "m3", "m4"}, {"m0"}),
        # BH: adjusted .005 .075 .5 .5 .6 (m4 .075). At their floors: m2 5/2 x .0143 = .036, m3 5/2 x .019 = .0475,
        # m4 stays .075: only m4 - whose own test said contaminated - is out of reach
        ("bh", {"m4"}, {"m0"}),
        ("none", set(), {"m0", "m4"}),  # every floor <= alpha: the raw test could flag each
    ],
)
def test_a_cell_no_outcome_could_flag_after_the_correction_is_inconclusive(
    tmp_path, correction: str, unreachable: set, flagged: set
) -> None:
    cells = []
    for i, (model, p, floor) in enumerate(REACH):
        table = guided_rows(ARC, 10, 0.0, 20 + i)
        v = verdict("guided_prompting", "guided_prompting", table)
        v.update(p_value=p, min_p=floor, decision="contaminated" if p <= ALPHA else "clean")  # numbers by hand
        cells.append((Cell(model, "arc_challenge", "guided_prompting", "closed"), table, v))
    run = write_run(tmp_path / "run", cells)
    annotated = annotate(load_runs([run]).partitions, correction, ALPHA)
    assert annotated.attrs["n_tests"] == 5  # out of reach or not, every decided test stays in the family
    table = method_tables(annotated)[0]
    by_model = {m: table.cells[(m, ARC)] for m, _, _ in REACH}
    assert {m for m, c in by_model.items() if c.text == "inconclusive"} == unreachable
    assert {m for m, c in by_model.items() if c.flagged} == flagged
    for model in unreachable:
        cell = by_model[model]
        assert cell.status == "inconclusive" and cell.value is None and cell.flagged is None
        assert "out of reach" in cell.tooltip and "no outcome of this cell could have been flagged" in cell.tooltip
    assert by_model["m1"].text.endswith("†")  # not flagged, but 1/924 could have been: a decision, clean
    if "m4" in unreachable:  # its own test flagged it at alpha: said, not hidden
        assert "before the correction: contaminated" in by_model["m4"].tooltip
    out = tmp_path / "report"
    files = build_report([run], out, correction, ALPHA)
    markdown = files.markdown.read_text()
    assert ("## Out of reach after the correction" in markdown) == bool(unreachable)
    for model in unreachable:
        assert f"- {model} / {ARC} / guided_prompting: out of reach" in markdown
    long = pd.read_csv(files.cells_csv).set_index("model")
    assert set(long.index[long["out_of_reach"]]) == unreachable
    assert long.loc["m2", "min_p"] == pytest.approx(1 / 70)
    if correction == "holm":
        assert long.loc["m2", "p_reachable"] == pytest.approx(4 / 70)
        assert long.loc["m0", "p_reachable"] != long.loc["m0", "p_reachable"]  # flagged: not asked (NaN)
    assert ('id="out-of-reach"' in files.html.read_text()) == bool(unreachable)


def test_score_distributions_use_each_methods_score(grid) -> None:
    runs = load_runs(grid["runs"])
    frame = runs.examples("guided_prompting", ("rougeL_guided", "rougeL_general", "rougeL_diff"))
    spec = score_spec("guided_prompting", filled_columns(frame))
    assert spec.columns == ("rougeL_diff",)  # declared by GuidedPrompting.outputs
    scores = example_scores(frame, spec)
    kept = frame.loc[scores.index]
    assert np.allclose(scores, kept["rougeL_guided"] - kept["rougeL_general"])
    # the superseded run-A cell is not read; failed rows (mistral gsm8k has 2) are left out
    assert (kept["model"] + "|" + kept["partition"]).value_counts().to_dict() == {
        f"llama2_7b|{ARC}": 12, f"llama2_7b|{GSM}": 12, f"mistral_7b|{ARC}": 12, f"mistral_7b|{GSM}": 12,
        f"qwen2_7b|{ARC}": 12, f"qwen2_7b|{GSM}": 3,
    }
    ngram = runs.examples("ngram13", ("fraction_matched",))
    spec = score_spec("ngram_overlap", filled_columns(ngram))
    assert spec.columns == ("fraction_matched",)
    assert sorted(example_scores(ngram, spec).round(4).unique()) == [0.0, round(6 / 28, 4)]


def test_plots_show_the_declared_score_never_a_guess() -> None:
    """Every registered method's plot column is the one it declares; undeclared means no plot (issue #13:
    clean_dirty_eval and exact_match plotted ``engine_tokens``, the first float column the report found)."""
    from contamray.methods.base import get_method, method_names

    for name in method_names():
        declared = get_method(name).outputs.score
        filled = {"engine_tokens": "double", "engine_seconds": "double", "score": "double", "n_docs": "int64"}
        spec = score_spec(name, {**filled, **({declared: "double"} if declared else {})})
        if declared is None:
            assert spec is None, name
        else:
            assert spec.columns == (declared,), name
            assert score_spec(name, filled if declared not in filled else {}) is None, name
    assert score_spec("clean_dirty_eval", {"engine_tokens": "double", "correct": "other"}).columns == ("correct",)
    assert score_spec("exact_match", {"engine_tokens": "double", "n_docs": "int64"}).columns == ("n_docs",)
    assert score_spec("no_such_method", {"score": "double"}) is None


def test_report_files(grid, tmp_path) -> None:
    files = build_report(grid["runs"], tmp_path / "out", "holm", ALPHA)
    assert files.html == tmp_path / "out" / "report.html"
    names = sorted(p.name for p in files.pngs)
    assert names == [
        "heatmap_guided_prompting.png", "heatmap_ngram13.png",
        "scores_guided_prompting_arc_challenge_ARC-Challenge_test.png",
        "scores_guided_prompting_gsm8k_main_test.png",
        "scores_ngram13_arc_challenge_ARC-Challenge_test.png", "scores_ngram13_gsm8k_main_test.png",
    ]
    for png in files.pngs:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = files.html.read_text()
    assert page.count("data:image/png;base64,") == 6
    assert "http://" not in page and "https://" not in page and "<script" not in page  # self-contained
    cells = pd.read_csv(files.cells_csv)
    assert len(cells) == 8 and {"p_value", "p_adjusted", "flagged"} <= set(cells.columns)
    md = files.markdown.read_text()
    assert f"| model | {ARC} | {GSM} |" in md and "| corpus:planted | 25.0% | 0.0%† |" in md
    assert "reduce failed: ValueError: engine died" in md


def test_bad_run_directories_get_clear_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_runs([tmp_path / "nope"])
    (tmp_path / "half").mkdir()
    with pytest.raises(FileNotFoundError, match=r"half/partitions.parquet is missing: .* not a finished contamray run"):
        load_runs([tmp_path / "half"])
    (tmp_path / "odd").mkdir()
    pd.DataFrame({"model": ["m"], "partition": ["p"]}).to_parquet(tmp_path / "odd" / "partitions.parquet")
    with pytest.raises(ValueError, match=r"odd/partitions.parquet: column\(s\) method, p_value, rate, contaminated"):
        load_runs([tmp_path / "odd"])


def test_a_sweep_directory_stands_for_its_finished_runs(tmp_path) -> None:
    sweep = tmp_path / "multirun"
    for num, model in [(2, "m2"), (10, "m10"), (1, "m1")]:
        write_run(sweep / str(num), [guided_cell(model, "arc_challenge", 0.0, num)])
    (sweep / "3" / "cells").mkdir(parents=True)  # a grid point interrupted before its tables
    (sweep / ".hydra").mkdir()
    dirs, notes = expand_run_dirs([sweep])
    assert dirs == [sweep / "1", sweep / "2", sweep / "10"]  # Hydra job numbers in numeric order
    assert notes == [f"{sweep / '3'}: no partitions.parquet (an unfinished run of the sweep {sweep}); skipped"]
    runs = load_runs([sweep])
    assert sorted(runs.partitions["model"]) == ["m1", "m10", "m2"] and runs.notes == notes
    with pytest.raises(FileNotFoundError, match="not a finished contamray run"):
        load_runs([sweep / "3"])  # named explicitly, an unfinished run is an error


def test_cli_report(grid, tmp_path) -> None:
    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, "-m", "contamray.cli", "report", *map(str, grid["runs"]), "--out", str(out),
         "--correction", "bh", "--alpha", "0.01"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.html").is_file() and f"report: {out / 'report.html'}" in proc.stdout
    assert "Benjamini–Hochberg" in proc.stdout and "α = 0.01" in proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "contamray.cli", "report", str(tmp_path / "missing")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    bad_alpha = subprocess.run(
        [sys.executable, "-m", "contamray.cli", "report", str(grid["runs"][0]), "--alpha", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert bad_alpha.returncode == 2 and "--alpha: expected a number in (0, 1), got 2.0" in bad_alpha.stderr


def test_write_html_report_defaults_into_the_given_dir(grid) -> None:
    run_b = grid["runs"][1]
    path = write_html_report([run_b], run_b, "holm", ALPHA)
    assert path == run_b / "report.html" and path.is_file()
    assert (run_b / "partitions.parquet").is_file()  # the run's own files are left alone


# ---------------------------------------------------------------------------------------------
# report.html in headless Chromium


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed in CI; .ci/install installs it (apt-get install chromium)")
    pytest.skip("chromium is not installed (apt-get install -y chromium); CI installs it and runs this test")


def run_chromium(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp / 'chromium-profile'}", "--hide-scrollbars", "--force-device-scale-factor=1",
        *args, page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


class CellParser(html.parser.HTMLParser):
    """Collects the text of every ``<td data-model=...>`` and whether heatmap images are present."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str, str], tuple[str, str]] = {}
        self.images: dict[str, str] = {}
        self._open: tuple[tuple[str, str, str], str] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "td" and "data-method" in a:
            self._open = ((a["data-method"], a["data-model"], a["data-partition"]), a.get("class", ""))
            self._text = []
        if tag == "img" and a.get("id", "").startswith("heatmap-"):
            self.images[a["id"]] = a.get("src", "")

    def handle_data(self, data: str) -> None:
        if self._open:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._open:
            self.cells[self._open[0]] = ("".join(self._text), self._open[1])
            self._open = None


def dominant_colours(png: Path, min_pixels: int) -> dict[tuple[int, int, int], int]:
    from matplotlib.image import imread

    rgb = (imread(png)[..., :3] * 255).round().astype(np.uint8).reshape(-1, 3)
    colours, counts = np.unique(rgb, axis=0, return_counts=True)
    out = {}
    for colour, count in zip(colours, counts):
        r, g, b = (int(c) for c in colour)
        if count >= min_pixels and max(r, g, b) - min(r, g, b) > 40:  # saturated: no text, grid or white
            out[(r, g, b)] = int(count)
    return out


def colour_count(png: Path, colour: tuple[int, int, int], tolerance: int = 2) -> int:
    from matplotlib.image import imread

    rgb = (imread(png)[..., :3] * 255).round().astype(int)
    return int((np.abs(rgb - np.array(colour)).max(axis=-1) <= tolerance).sum())


def test_report_html_in_headless_chromium(grid, tmp_path) -> None:
    files = build_report(grid["runs"], tmp_path / "report", "holm", ALPHA)
    dom = run_chromium(files.html, tmp_path, "--dump-dom").stdout
    parsed = CellParser()
    parsed.feed(dom)
    assert "contamray: benchmark contamination report" in dom

    # every expected cell is on the page, with its text and mark
    for (model, partition), p_adj in expected_holm(grid["raw"]).items():
        text, css = parsed.cells[("guided_prompting", model, partition)]
        assert float(text.rstrip("†")) == pytest.approx(p_adj, rel=5e-3)
        assert css == ("flagged" if p_adj <= ALPHA else "not-flagged")
    assert parsed.cells[("guided_prompting", "qwen2_7b", GSM)] == ("error", "error")
    assert parsed.cells[("ngram13", "corpus:planted", ARC)] == ("25.0%", "flagged")
    assert parsed.cells[("ngram13", "corpus:planted", GSM)] == ("0.0%†", "not-flagged")
    assert len(parsed.cells) == 8
    assert set(parsed.images) == {"heatmap-guided_prompting", "heatmap-ngram13"}

    # the heatmap is drawn: its cell colours fill the screenshot as they fill the PNG
    shot = tmp_path / "page.png"
    run_chromium(files.html, tmp_path, "--window-size=1500,3600", f"--screenshot={shot}")
    assert shot.is_file()
    heat = tmp_path / "report" / "plots" / "heatmap_guided_prompting.png"
    others = set()
    for png in files.pngs:
        if png != heat:
            others |= set(dominant_colours(png, min_pixels=50))
    drawn = dominant_colours(heat, min_pixels=2000)
    assert len(drawn) >= 2, drawn  # significant and non-significant cells differ in colour
    colours = {  # the colours only this heatmap has (the other figures share the palette's light end)
        c: n for c, n in drawn.items() if all(max(abs(a - b) for a, b in zip(c, o)) > 6 for o in others)
    }
    assert colours, drawn
    for colour, count in colours.items():
        assert colour_count(shot, colour) >= 0.9 * count, (colour, count)

    # control: the same page without the heatmap image has none of those colour areas
    page = files.html.read_text()
    start = page.index('<img id="heatmap-guided_prompting"')
    end = page.index(">", start)
    blank = tmp_path / "report" / "no_heatmap.html"
    blank.write_text(page[:start] + '<img id="heatmap-guided_prompting" alt="removed">' + page[end + 1:])
    shot2 = tmp_path / "page_without_heatmap.png"
    run_chromium(blank, tmp_path, "--window-size=1500,3600", f"--screenshot={shot2}")
    for colour, count in colours.items():
        assert colour_count(shot2, colour) < 0.2 * count, colour


def test_report_json_details_survive_the_merge(grid) -> None:
    runs = load_runs(grid["runs"])
    row = runs.partitions[(runs.partitions["model"] == "llama2_7b") & (runs.partitions["partition"] == ARC)].iloc[0]
    details = json.loads(row["details"])
    assert details["alg1"]["n"] == 12 and math.isclose(details["alg1"]["p_value"], row["p_value"])

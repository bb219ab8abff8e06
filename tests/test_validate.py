"""The scoreboard and the canary table on real verdict and example tables with a known truth.

The run directory is built from real parts, without Ray: synthetic_facts and ARC-Challenge rows, a
planted corpus (``contamray.corpus.planted``: XSum articles from the mirror with a seeded subset of the
rows planted verbatim, input-only and as near-misses; a second synthetic partition is left out, so it
is clean), the real open-data methods (GPT-3 13-grams, exact match) matched against it, and a real
closed-data method (Min-K%) scored by the real embedded model. The expected numbers are recomputed in
the test from the tables themselves by brute force (pairs for AUC, loops for rates), independently of
``contamray.validate``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from contamray.benchmarks import load_records
from contamray.corpus.planted import build_planted_corpus
from contamray.methods.base import get_method
from contamray.validate.grid import grid_runs
from contamray.validate.metrics import roc_auc, tpr_at_fpr
from contamray.validate.scoreboard import END, START, instance_rows, merge_rows, render, scoreboard, update_readme
from contamray.validate.table import truth_tables, write_truth_table
from contamray.validate.truth import label_run

BENCHMARKS = {
    "sf": {"adapter": "synthetic_facts", "config": None, "split": "test", "limit": 12},
    "sf_clean": {"adapter": "synthetic_facts", "config": "set1", "split": "test", "limit": 12},
    "arc": {"adapter": "arc_challenge", "config": None, "split": "test", "limit": 12},
}
OPEN = {
    "gpt3_13gram": ("ngram_overlap", {"n": 13, "normalization": "gpt3"}),
    "exact_match": ("exact_match", {}),
    "gpt4_substring": ("gpt4_substring", {}),
}


# --- metrics, by hand ----------------------------------------------------------------------------


def test_auc_and_tpr_by_hand() -> None:
    assert roc_auc([True, True, False, False], [0.9, 0.8, 0.7, 0.1]) == 1.0
    assert roc_auc([True, True, False, False], [0.9, 0.3, 0.5, 0.1]) == 0.75  # 3 of 4 pairs ordered
    assert roc_auc([True, False], [0.5, 0.5]) == 0.5  # a tie counts one half
    assert math.isnan(roc_auc([True, True], [0.1, 0.2]))  # one class: undefined, not an error
    # a failed example (no score) is left out, not counted as a low score
    assert roc_auc([True, False, False], [0.2, float("nan"), 0.3]) == 0.0
    assert roc_auc([True, False, False, True], [0.2, None, 0.3, 0.4]) == 0.5
    labels = [False] * 20 + [True] * 4
    scores = [i / 100 for i in range(20)] + [0.50, 0.40, 0.185, 0.05]
    # 5 % of 20 negatives = 1 may be flagged: threshold 0.185 flags the negative 0.19 and 3 positives
    assert tpr_at_fpr(labels, scores, 0.05) == 0.75
    # no negative may be flagged: the threshold must lie above 0.19, which only 0.50 and 0.40 pass
    assert tpr_at_fpr(labels, scores, 0.0) == 0.5
    assert tpr_at_fpr(labels, scores, 0.15) == 0.75  # 0.05 sits below 16 negatives: never reached
    assert tpr_at_fpr([False, True], [0.2, 0.1], 0.0) == 0.0
    with pytest.raises(ValueError, match="max_fpr"):
        tpr_at_fpr(labels, scores, 1.5)


# --- a real run directory ------------------------------------------------------------------------


def _rows_frame(rows: list[dict], model: str, label: str) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    frame.insert(0, "model", model)
    frame["method"] = label
    frame["error"] = frame.get("error", pd.Series("", index=frame.index)).fillna("").astype(str)
    return frame


def _verdict(method, table: pd.DataFrame, cfg, model: str, label: str, name: str) -> dict:
    row = method.reduce(table, cfg).to_row()
    return {**row, "model": model, "method": label, "method_name": name, "error": ""}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, mirror_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("run")
    records = {
        key: load_records(b["adapter"], config=b["config"], split=b["split"], n=b["limit"], seed=0,
                          mirror_dir=mirror_dir).records
        for key, b in BENCHMARKS.items()
    }  # fmt: skip
    filler = [r.input for r in load_records("xsum", n=40, seed=0, mirror_dir=mirror_dir).records]
    planted = {k: v for k, v in records.items() if k != "sf_clean"}  # sf_clean stays out of the corpus
    paths, _ = build_planted_corpus(planted, filler, root / "corpus", seed=0, planted_fraction=0.5,
                                    near_miss_fraction=0.25)
    docs = [{"doc_id": d["id"], "text": d["text"]} for p in paths for d in map(json.loads, open(p))]
    examples, verdicts = [], []
    for label, (name, params) in OPEN.items():
        method = get_method(name)
        cfg = method.make_config(params)
        for recs in records.values():
            index = method.build_index(recs, cfg)
            rows = method.score(recs, method.match(docs, index, cfg), cfg)
            frame = _rows_frame(rows, "corpus:planted", label)
            examples.append(frame)
            verdicts.append(_verdict(method, frame, cfg, "corpus:planted", label, name))
    # closed data: Min-K% on the embedded model, sf tested against the clean sibling partition
    from contamray.engines import EngineSpec, build_engine
    from contamray.pipeline.actors import answer_requests

    engine = build_engine(EngineSpec(source="smollm2-135m", backend="hf", dtype="float32", name="canary"))
    method = get_method("min_k")
    cfg = method.make_config({"reference": "sf_clean"})
    frames = {}
    for key in ("sf", "sf_clean"):
        outputs: dict = {}
        for stage in range(3):
            reqs = method.requests(records[key], cfg, stage, outputs)
            if not reqs:
                break
            outputs.update({o.key: o for o in answer_requests(engine, reqs)})
        frames[key] = _rows_frame(method.score(records[key], outputs, cfg), "canary", "min_k")
    examples += list(frames.values())
    with_ref = pd.concat([frames["sf"].assign(is_reference=False), frames["sf_clean"].assign(is_reference=True)])
    verdicts.append(_verdict(method, with_ref, cfg, "canary", "min_k", "min_k"))
    verdicts.append(_verdict(method, frames["sf_clean"], cfg, "canary", "min_k", "min_k"))
    parts = pd.DataFrame(verdicts)
    parts["details"] = parts["details"].map(json.dumps)
    parts.to_parquet(root / "partitions.parquet")
    pd.concat(examples, ignore_index=True).drop(columns=["doc_ids", "spans"], errors="ignore").to_parquet(
        root / "examples.parquet"
    )
    config = {
        "models": {"canary": {"source": "smollm2-135m", "inject": {
            "partitions": [{"benchmark": "sf", "duplication": 5}], "background": {"docs": 0}}}},
        "benchmarks": BENCHMARKS, "corpus": {"kind": "planted"},
        "methods": {"min_k": {"method": "min_k", "reference": "sf_clean"}},
    }  # fmt: skip
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def test_truth_and_membership_labels(run_dir: Path) -> None:
    run = label_run(run_dir)
    parts = run.partitions.set_index(["model", "method", "partition"])
    manifest = json.loads((run_dir / "corpus" / "manifest.json").read_text())
    planted = {row["partition"] for row in manifest.values() if row["how"] != "near_miss"}
    for (model, _, partition), row in parts.iterrows():
        if model == "corpus:planted":
            assert row["truth"] == (partition in planted) and row["family"] == "open"
        elif partition == "synthetic_facts/set1/test":  # Min-K%'s reference: the yardstick, not judged
            assert row["truth"] is None and row["role"] == "reference"
        else:  # from the config's inject spec: only sf was injected
            assert row["truth"] and row["duplication"] == 5
    assert not parts.loc[("corpus:planted", "exact_match", "synthetic_facts/set1/test"), "truth"]
    ex = run.examples
    for _, row in ex[ex["model"] == "corpus:planted"].iterrows():
        how = manifest.get(row["record_id"], {}).get("how")
        assert row["member"] == (how in ("verbatim", "input_only"))
    canary = ex[ex["model"] == "canary"]
    assert (canary["member"] == canary["partition"].eq("synthetic_facts/default/test")).all()


def _brute_auc(pos: list[float], neg: list[float]) -> float:
    pairs = [1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg]
    return sum(pairs) / len(pairs)


def test_scoreboard_numbers_match_the_tables(run_dir: Path) -> None:
    run = label_run(run_dir)
    board = scoreboard([run]).set_index("method")
    parts = pd.read_parquet(run_dir / "partitions.parquet")
    truth = {p: p != "synthetic_facts/set1/test" for p in parts["partition"]}
    for label in ("gpt3_13gram", "exact_match"):
        mine = parts[parts["method"] == label]
        right = sum(bool(r.contaminated) == truth[r.partition] for r in mine.itertuples())
        clean = [r for r in mine.itertuples() if not truth[r.partition]]
        assert board.loc[label, "accuracy"] == pytest.approx(right / len(mine))
        assert board.loc[label, "fpr"] == pytest.approx(sum(bool(r.contaminated) for r in clean) / len(clean))
        assert board.loc[label, "n_contaminated"] == 2 and board.loc[label, "n_clean"] == 1
    assert set(board.index) == {"gpt3_13gram", "exact_match", "gpt4_substring", "min_k"}
    # instance level, by brute force: members of a partition against non-members of the same benchmark
    ex = pd.read_parquet(run_dir / "examples.parquet")
    manifest = json.loads((run_dir / "corpus" / "manifest.json").read_text())
    inst = instance_rows([run]).set_index(["method", "partition"])
    ngram = ex[ex["method"] == "gpt3_13gram"]
    aucs = []
    for partition in ("synthetic_facts/default/test", "arc_challenge/ARC-Challenge/test"):
        bench = partition.split("/")[0]
        member = ngram["record_id"].map(lambda r: manifest.get(r, {}).get("how") in ("verbatim", "input_only"))
        score = ngram["fraction_matched"].fillna(0.0)
        pos = list(score[member & ngram["partition"].eq(partition)])
        neg = list(score[~member & ngram["partition"].str.startswith(bench + "/")])
        aucs.append(_brute_auc(pos, neg))
        assert inst.loc[("gpt3_13gram", partition), "auc"] == pytest.approx(aucs[-1])
        assert inst.loc[("gpt3_13gram", partition), "n_members"] == len(pos)
    assert board.loc["gpt3_13gram", "auc"] == pytest.approx(sum(aucs) / 2)  # macro average
    # GPT-4 substrings: the score is how many of the sampled substrings were found (a list per row)
    sub = ex[(ex["method"] == "gpt4_substring") & ex["partition"].eq("arc_challenge/ARC-Challenge/test")]
    member = sub["record_id"].map(lambda r: manifest.get(r, {}).get("how") in ("verbatim", "input_only"))
    found = sub["samples_found"].map(len)
    auc = _brute_auc(list(found[member]), list(found[~member]))
    assert inst.loc[("gpt4_substring", "arc_challenge/ARC-Challenge/test"), "auc"] == pytest.approx(auc)
    # a synthetic question alone is shorter than 13 words: input-only plants of it have no 13-gram to find
    short = ngram[ngram["record_id"].map(lambda r: manifest.get(r, {}).get("how")) == "input_only"]
    assert not short[short["partition"].str.startswith("synthetic")]["contaminated"].any()
    # closed data: the base model was not really fine-tuned, so Min-K% ranks members at chance level
    canary = ex[ex["method"] == "min_k"]
    pos = list(canary[canary["partition"] == "synthetic_facts/default/test"]["score"])
    neg = list(canary[canary["partition"] == "synthetic_facts/set1/test"]["score"])
    assert board.loc["min_k", "auc"] == pytest.approx(_brute_auc(pos, neg))
    assert board.loc["min_k", "n_partitions"] == 1 and board.loc["min_k", "n_skipped"] == 1
    assert board.loc["min_k", "family"] == "closed"
    assert math.isnan(board.loc["min_k", "engine_tokens"])  # not recorded in these tables


def test_cells_without_a_verdict_are_skipped(run_dir: Path) -> None:
    from contamray.validate.scoreboard import partition_scores

    run = label_run(run_dir)
    parts = run.partitions.copy()
    exact = parts.index[(parts["method"] == "exact_match")]
    before = partition_scores(parts).set_index("method").loc["exact_match"]
    parts.loc[exact[0], "n_failed"] = parts.loc[exact[0], "n_examples"]  # every row failed: no verdict
    parts.loc[exact[1], "error"] = "reduce failed: ValueError: boom"
    after = partition_scores(parts).set_index("method").loc["exact_match"]
    assert (before["n_partitions"], before["n_skipped"]) == (3, 0)
    # every row failed: the method could not tell (inconclusive, never "clean"); a failed reduce: no verdict
    assert (after["n_partitions"], after["n_inconclusive"], after["n_skipped"]) == (1, 1, 1)


def test_render_table_and_readme(run_dir: Path, tmp_path: Path) -> None:
    run = label_run(run_dir)
    markdown = render([run], note="note line")
    assert markdown.splitlines()[0].startswith("| method | family |")
    assert "| `gpt3_13gram` | open |" in markdown and "note line" in markdown
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{START}\nold table\n{END}\nafter\n")
    update_readme(readme, markdown)
    text = readme.read_text()
    assert "old table" not in text and markdown.strip() in text and text.endswith(f"{END}\nafter\n")
    update_readme(readme, "second")  # regenerated in place, markers kept
    assert readme.read_text().count(START) == 1 and "second" in readme.read_text()
    readme.write_text("no markers")
    with pytest.raises(ValueError, match="scoreboard:start"):
        update_readme(readme, markdown)
    tables = truth_tables(run)
    assert "### Closed-data methods on model `canary`" in tables
    assert "### Open-data methods on `corpus:planted`" in tables
    assert "injected ×5 verbatim/input_and_label/canonical" in tables
    path = write_truth_table(run_dir)
    assert path.name == "truth.md" and path.read_text().count("| `") >= 3
    rows = [line for line in tables.splitlines() if line.startswith("| `")]
    ok, wrong = sum(line.count("✓") for line in rows), sum(line.count("✗") for line in rows)
    board = scoreboard([run])
    assert ok == round((board["accuracy"] * board["n_partitions"]).sum())
    assert ok + wrong == board["n_partitions"].sum()
    assert "| `min_k` |" in tables and "(reference)" in tables


OLD_BOARD = """| method | family | accuracy |
|---|---|---|
| `a` | closed | 50 % |
| `b` | closed | 10 % |
| `b_c` | closed | 20 % |
| `x` | open | 90 % |

Share flagged, by duplication:

| method | ×1 | ×2 |
|---|---|---|
| `a` | 0 % | 20 % |
| `b` | 0 % | 0 % |

AUC, by duplication:

| method | ×1 |
|---|---|
| `a` | 0.70 |
| `b` | 0.50 |

Regenerated on day 1: the whole grid."""

NEW_BOARD = """| method | family | accuracy |
|---|---|---|
| `b` | closed | 60 % |
| `c` | open | 70 % |

Share flagged, by duplication:

| method | ×2 |
|---|---|
| `c` | 40 % |

AUC, by kind:

| method | `verbatim` |
|---|---|
| `b` | 0.91 |

The rows of `b`, `c` regenerated on day 2."""


def test_merge_replaces_only_the_rows_of_the_methods_a_run_scored(tmp_path: Path) -> None:
    merged = merge_rows(OLD_BOARD, NEW_BOARD)
    lines = merged.splitlines()
    main = lines[: lines.index("")]
    # a, b_c and x kept, b replaced, c added; closed before open, then by name as render sorts (b before b_c)
    assert main[2:] == ["| `a` | closed | 50 % |", "| `b` | closed | 60 % |", "| `b_c` | closed | 20 % |",
                        "| `c` | open | 70 % |", "| `x` | open | 90 % |"]  # fmt: skip
    # b's old breakdown row dropped (the new run has none), c's added under the old columns ("–" where it has none)
    share = lines[lines.index("Share flagged, by duplication:") + 2 :][:4]
    assert share == ["| method | ×1 | ×2 |", "|---|---|---|", "| `a` | 0 % | 20 % |", "| `c` | – | 40 % |"]
    assert "AUC, by kind:" in merged and "| `b` | 0.91 |" in merged  # a table only the new run has
    # a table the new run lacks: b's stale row goes (the run has nothing there for it), a's stays
    assert "| `a` | 0.70 |" in merged and "| `b` | 0.50 |" not in merged
    assert merged.index("the whole grid.") < merged.index("The rows of `b`, `c`")  # both notes, old first
    again = merge_rows(merged, NEW_BOARD.replace("day 2", "day 3"))  # the same rows merged again
    assert again.count("The rows of") == 1 and "day 3" in again and "\n\n\n" not in again  # the old note went
    assert again.replace("day 3", "day 2") == merged
    only_c = merge_rows(merged, NEW_BOARD.replace("| `b` | closed | 60 % |\n", "").replace("`b`, `c`", "`c`"))
    assert "The rows of `b`, `c`" in only_c  # b's rows stay from the earlier merge: its note stays
    assert only_c.count("| `b` |") == merged.count("| `b` |")  # and no second b row where the new text had one
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{START}\n{OLD_BOARD}\n{END}\nend\n")
    update_readme(readme, NEW_BOARD, merge=True)
    assert readme.read_text() == f"top\n{START}\n{merged.rstrip()}\n{END}\nend\n"
    wider = NEW_BOARD.replace("| method | ×2 |\n|---|---|", "| method | ×2 | ×5 |\n|---|---|---|")
    with pytest.raises(ValueError, match="×5"):  # a column the README's table lacks: the tables would not line up
        merge_rows(OLD_BOARD, wider)


def test_validate_runs_merge_keeps_the_other_rows(run_dir: Path, tmp_path: Path) -> None:
    """``contamray validate --runs DIR --merge``: the run's methods' rows replace theirs, the note names them and
    the command the grid recorded; a row of a method the run did not score is kept."""
    import shutil

    from contamray.validate.command import main

    grid = tmp_path / "grid"
    shutil.copytree(run_dir, grid / "dup5")
    (grid / "runs.json").write_text(json.dumps({"seconds": {"dup5": 120.0}, "overrides": ["run.limit=5"]}))
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{START}\nold\n{END}\n")
    args = ["--runs", str(grid / "dup5"), "--readme", str(readme), "--out", str(tmp_path / "out")]
    assert main(args) == 0  # the whole table
    text = readme.read_text()
    assert "Regenerated by `contamray validate run.limit=5`" in text and "2 min wall" in text
    min_k = next(line for line in text.splitlines() if line.startswith("| `min_k` | closed |"))
    rows = text.count("| `min_k` |")  # one in each table
    other = min_k.replace("`min_k`", "`other_method`")  # a row an earlier run left
    readme.write_text(text.replace(min_k, f"{min_k.replace('closed', 'stale')}\n{other}"))
    assert main([*args, "--merge"]) == 0
    text = readme.read_text()
    assert other in text and min_k in text and "stale" not in text  # the run's rows replaced, the other kept
    assert "| `gpt3_13gram` | open |" in text and text.count("| `min_k` |") == rows  # once each, not twice
    assert text.index("Regenerated by") < text.index("The rows of `exact_match`, `gpt3_13gram`")


def test_grid_expands_one_model_per_duplication() -> None:
    config = {
        "benchmarks": {"sf": {}, "sf_para": {}, "arc": {}},
        "validate": {"base": "smollm2-135m", "duplications": [1, 5],
                     "injected": {"sf": {}, "sf_para": {"form": "paraphrased"}},
                     "train": {"lr": 3e-4, "background": {"docs": 4}}},
    }  # fmt: skip
    runs = grid_runs(config)
    assert [r.name for r in runs] == ["dup1", "dup5"]
    inject = runs[1].model["inject"]
    assert runs[1].model["source"] == "smollm2-135m" and inject["lr"] == 3e-4
    assert inject["partitions"] == [
        {"benchmark": "sf", "duplication": 5}, {"benchmark": "sf_para", "form": "paraphrased", "duplication": 5}
    ]
    assert runs[0].injected_corpus and runs[1].duplication == 5
    with pytest.raises(ValueError, match=r"validate\.injected\.gsm8k: not a benchmark of this run"):
        grid_runs({**config, "validate": {**config["validate"], "injected": {"gsm8k": {}}}})
    with pytest.raises(ValueError, match=r"validate\.duplications"):
        grid_runs({**config, "validate": {**config["validate"], "duplications": [0]}})


def test_a_heldout_read_from_the_tested_split_takes_its_truth_from_its_own_rows():
    """ARC rows 0-19 half injected and rows 20-39 (``offset``) as their held-out: one partition string, two
    benchmark keys; the held-out's cells are clean (none of their rows trained on), the tested block's
    contaminated, whatever the runner wrote per partition."""
    import pandas as pd

    from contamray.validate.truth import _by_own_rows, reference_keys

    part = "arc_challenge/ARC-Challenge/test"
    parts = pd.DataFrame({
        "model": ["m", "m"], "method": ["min_k", "min_k"], "benchmark": ["arc", "arc_heldout"],
        "partition": [part, part], "truth": [True, True], "duplication": [5, 5], "kind": ["verbatim"] * 2,
    })  # fmt: skip
    examples = pd.DataFrame({
        "model": ["m"] * 4, "method": ["min_k"] * 4, "benchmark": ["arc", "arc", "arc_heldout", "arc_heldout"],
        "member": [True, False, False, False],
    })  # fmt: skip
    labelled = _by_own_rows(parts, examples)
    assert list(labelled["truth"]) == [True, False] and list(labelled["duplication"]) == [5, 0]
    assert list(labelled["kind"]) == ["verbatim", "clean"]
    assert reference_keys({"methods": {"min_k": {"reference": {"arc": "arc_heldout"}}}}) == {"min_k": {"arc_heldout"}}
    # a chain: arc_heldout is arc's reference and is tested against arc_heldout2 - only arc_heldout2 is a yardstick,
    # as the runner files them (Method.served_as_reference); one key for every benchmark is a yardstick
    chain = {"arc": "arc_heldout", "arc_heldout": "arc_heldout2"}
    assert reference_keys({"methods": {"min_k": {"reference": chain}}}) == {"min_k": {"arc_heldout2"}}
    assert reference_keys({"methods": {"min_k": {"reference": "arc_heldout"}}}) == {"min_k": {"arc_heldout"}}
    method = get_method("min_k")
    cfg = method.make_config({"reference": chain})
    served = {k: method.served_as_reference(cfg, k, chain.keys() | {"arc_heldout2"}) for k in ("arc", *chain.values())}
    assert {k for k, v in served.items() if v} == {"arc_heldout2"}

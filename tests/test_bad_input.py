"""Bad input and faults, one test per case of docs/reliability.md (issue #17, item 4) not tested elsewhere.

Each case asserts what a demanding user needs: a message naming the item (file and row, key, path) and
the fix; the run going on where it can (a bad row becomes a failed row, a bad file a reported one); and
nothing already computed lost or corrupted. The cases other test files already cover are listed with
theirs in docs/reliability.md. Everything here is fast (no model, no Ray) except the tests marked slow.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from contamray.benchmarks import BenchmarkRowError, load_records
from contamray.pipeline.plan import Cell, ConfigError

REPO = Path(__file__).resolve().parents[1]


def write_rows(path: Path, lines: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def row(**fields) -> bytes:
    return json.dumps(fields).encode()


def plan_of(*overrides: str):
    from hydra import compose, initialize_config_dir

    from contamray.experiments import CONF_DIR
    from contamray.pipeline.plan import build_plan

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides))
    cfg.run.output_dir = "unused"
    return build_plan(cfg)


AG_NEWS = "fancyzhx/ag_news/default/test.jsonl"


# --------------------------------------------------------------------------- unknown names


def test_an_unknown_benchmark_config_fails_in_the_plan_naming_the_key_and_choices():
    """Like an unknown split, before any work (it used to pass the plan and fail when the rows loaded)."""
    with pytest.raises(ConfigError, match=r"benchmarks\.arc_challenge\.config: 'ARC-Easy' is not a config of "
                       r"arc_challenge; choices: ARC-Challenge"):  # fmt: skip
        plan_of("benchmarks.arc_challenge.config=ARC-Easy")
    plan = plan_of("benchmark=[synthetic_facts]", "benchmarks.synthetic_facts.config=set3")
    assert plan.benchmarks["synthetic_facts"].config == "set3"


def test_an_unknown_experiment_lists_the_experiments(tmp_path: Path):
    out = subprocess.run([sys.executable, "-m", "contamray.run", "+exp=no_such_exp", f"hydra.run.dir={tmp_path}"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode != 0 and "Could not find 'exp/no_such_exp'" in out.stderr
    assert "Available options in 'exp'" in out.stderr and "canary" in out.stderr and "smoke" in out.stderr
    assert not any(tmp_path.iterdir())  # no work, no output


def test_an_api_reference_of_an_unknown_config_is_a_422_naming_the_key():
    from contamray.serve.check import compose_plan
    from contamray.serve.security import ApiError

    with pytest.raises(ApiError) as err:
        compose_plan(["+exp=base", "benchmark=[arc_challenge]", "method=[perplexity]",
                      "benchmarks.arc_challenge.config=ARC-Easy"])  # fmt: skip
    assert err.value.status == 422 and err.value.error == "invalid_config"
    assert "benchmarks.arc_challenge.config" in str(err.value.detail)


# --------------------------------------------------------------------------- rows: null, encodings, duplicates


def test_null_fields_are_failed_rows_naming_file_row_and_field(tmp_path: Path):
    path = write_rows(tmp_path / AG_NEWS, [
        row(text="Stocks rally on earnings.", label=2), row(text=None, label=1), row(text="Vote counted.", label=None),
        row(text="Election results are in.", label=0),
    ])  # fmt: skip
    with pytest.raises(BenchmarkRowError, match=rf"{path}: row 1 \(id 'ag_news/default/test#1'\).*field 'text' is "
                       r"missing\. Fix: restore 'text'"):  # fmt: skip
        load_records("ag_news", mirror_dir=tmp_path)
    result = load_records("ag_news", mirror_dir=tmp_path, strict=False)
    assert [r.order for r in result.records] == [0, 3]
    assert [(f.row_index, f.field) for f in result.failures] == [(1, "text"), (2, "label")]


def test_a_runs_tables_keep_the_failed_rows_with_their_reason(tmp_path: Path):
    """In a run (data.strict=false, the default) the bad rows are rows of every cell's examples table,
    with ``error`` set; the reducer counts them (``n_failed``) and ``Method.settle`` makes a partition with
    more than half failed inconclusive (tests/test_verdicts.py)."""
    from contamray.pipeline.cells import example_table
    from contamray.pipeline.runner import load_benchmarks

    write_rows(tmp_path / AG_NEWS, [row(text="Stocks rally.", label=2), row(text="   ", label=1),
                                    row(label=0), row(text="Vote counted.", label=0)])  # fmt: skip
    plan = plan_of("benchmark=[ag_news]", "method=[ngram13]", f"data.mirror_dir={tmp_path}")
    records, failures = load_benchmarks(plan, ["ag_news"])
    assert [r.id for r in records["ag_news"]] == ["ag_news/default/test#0", "ag_news/default/test#3"]
    table = example_table("cell", [{"record_id": r.id, "score": 0.0} for r in records["ag_news"]], records["ag_news"],
                          failures["ag_news"])  # fmt: skip
    assert len(table) == 4
    failed = table[table["error"] != ""].set_index("record_id")["error"]
    assert "field 'text' is empty" in failed["ag_news/default/test#1"]
    assert "field 'text' is missing" in failed["ag_news/default/test#2"]


def test_invalid_utf8_in_a_row_fails_that_row_and_the_rest_load(tmp_path: Path):
    bad = b'{"text": "caf\xe9 au lait", "label": 1}'  # latin-1 bytes in a UTF-8 file
    path = write_rows(tmp_path / AG_NEWS, [row(text="Stocks rally.", label=2), bad, row(text="Vote counted.", label=0)])
    with pytest.raises(BenchmarkRowError) as err:
        load_records("ag_news", mirror_dir=tmp_path)
    message = str(err.value)
    assert f"{path}: row 1 (id 'ag_news/default/test#1')" in message
    assert "field 'text' is not valid UTF-8 text" in message and "0xe9" in message
    assert "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)" in message
    result = load_records("ag_news", mirror_dir=tmp_path, strict=False)
    assert [r.input for r in result.records] == ["Stocks rally.", "Vote counted."]
    assert [(f.row_index, f.field) for f in result.failures] == [(1, "text")]


def test_a_latin1_file_fails_every_row_it_cannot_decode_naming_the_fix(tmp_path: Path):
    path = tmp_path / AG_NEWS
    path.parent.mkdir(parents=True)
    path.write_bytes('{"text": "café", "label": 1}\n{"text": "plain ascii", "label": 0}\n'.encode("latin-1"))
    with pytest.raises(BenchmarkRowError, match=r"row 0 .*not valid UTF-8.*iconv"):
        load_records("ag_news", mirror_dir=tmp_path)
    result = load_records("ag_news", mirror_dir=tmp_path, strict=False)  # mixed: the ASCII row is fine
    assert [r.input for r in result.records] == ["plain ascii"] and len(result.failures) == 1


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (b'{"text": "ok", "label": 1}\n{"text": "caf\\ud800", "label": 1}\n',
         "surrogate pair in string is invalid. in row 1"),
        ('{"text": "ok", "label": 1}\n'.encode("utf-16"), "can't decode byte 0xff in position 0"),
    ],
    ids=["lone-surrogate-escape", "utf-16-file"],
)
def test_a_file_pyarrow_cannot_parse_is_named_with_the_row_and_why(tmp_path: Path, data: bytes, named: str):
    path = tmp_path / AG_NEWS
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    with pytest.raises(ValueError) as err:
        load_records("ag_news", mirror_dir=tmp_path, strict=False)
    message = str(err.value)
    assert f"{path} could not be read as JSON lines" in message and named in message
    assert "Fix: one JSON object per line in UTF-8" in message


def test_duplicate_ids_keep_the_first_row_and_fail_the_others_under_their_own_id(tmp_path: Path):
    """The first row with an id is kept; each repeat is a failed row named ``<id>@row<n>``, so the ids of a
    run's examples table stay unique and no cost or membership is counted twice."""
    from contamray.pipeline.cells import EngineCosts, example_table
    from contamray.pipeline.runner import load_benchmarks

    path = write_rows(tmp_path / "knkarthick/samsum/default/test.jsonl", [
        row(id="s1", dialogue="A: hi\nB: hi", summary="A and B greet."),
        row(id="s2", dialogue="A: bye\nB: bye", summary="They part."),
        row(id="s1", dialogue="A: yo\nB: yo", summary="Another greeting."),
    ])  # fmt: skip
    with pytest.raises(BenchmarkRowError, match=rf"{path}: row 2 \(id 's1'\).*field 'id' repeats the id of row 0"):
        load_records("samsum", mirror_dir=tmp_path)
    plan = plan_of("benchmark=[samsum]", "method=[ngram13]", f"data.mirror_dir={tmp_path}")
    records, failures = load_benchmarks(plan, ["samsum"])
    assert [r.id for r in records["samsum"]] == ["s1", "s2"] and records["samsum"][0].input.startswith("A: hi")
    (failure,) = failures["samsum"]
    assert failure["record_id"] == "s1@row2" and "data.strict=false" in failure["error"]
    costs = EngineCosts()
    costs.add_shared("cell", ["s1", "s2"], 2.0)
    table = example_table("cell", [{"record_id": r.id} for r in records["samsum"]], records["samsum"],
                          failures["samsum"], costs=costs)  # fmt: skip
    assert table["record_id"].is_unique and table["engine_seconds"].sum() == pytest.approx(2.0)


# --------------------------------------------------------------------------- corpus files


def test_a_corpus_file_gone_before_its_turn_is_reported_and_the_scan_goes_on(tmp_path: Path, caplog):
    from contamray.corpus.readers import iter_documents

    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"text": f"doc {name}"}) + "\n")
    docs = iter_documents(str(tmp_path), errors="keep")  # the files are listed on the first document
    assert next(docs)["text"] == "doc a"
    (tmp_path / "b.jsonl").unlink()
    rest = list(docs)
    assert [(d["doc_id"], d["text"]) for d in rest] == [(f"{tmp_path}/b.jsonl", ""), (f"{tmp_path}/c.jsonl:1", "doc c")]
    assert "listed when the scan started but is gone now" in rest[0]["error"] and "restore it" in rest[0]["error"]
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "doc b"}) + "\n")
    docs = iter_documents(str(tmp_path))  # skip mode: logged, not yielded
    next(docs)
    (tmp_path / "b.jsonl").unlink()
    with caplog.at_level("WARNING", logger="contamray.corpus.readers"):
        assert [d["text"] for d in docs] == ["doc c"]
    assert f"corpus: skipping {tmp_path}/b.jsonl: the file was listed" in caplog.text
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "doc b"}) + "\n")
    docs = iter_documents(str(tmp_path), errors="raise")
    next(docs)
    (tmp_path / "b.jsonl").unlink()
    with pytest.raises(ValueError, match=r"b.jsonl: the file was listed .* gone now"):
        list(docs)


def test_the_ray_read_task_of_a_gone_file_yields_its_error_row(tmp_path: Path):
    """The Ray Data datasource's own open and read (called here without a cluster): the read task of a
    file deleted after the listing yields one error row instead of failing the whole dataset."""
    import pyarrow.fs as pafs
    from ray.data import DataContext

    from contamray.corpus.readers import ReadOptions, _datasource_class

    source = object.__new__(_datasource_class())  # its __init__ would start Ray: only the read path is wanted
    source._opts, source._prefix = ReadOptions("jsonl", errors="keep"), ""
    source._data_context = DataContext.get_current()
    gone = str(tmp_path / "gone.jsonl")
    with source._open_input_source(pafs.LocalFileSystem(), gone) as f:
        (block,) = list(source._read_stream(f, gone))
    (got,) = block.to_pylist()
    assert got["doc_id"] == gone and got["text"] == "" and "gone now" in got["error"]


def test_a_jsonl_file_cut_mid_line_keeps_its_complete_lines(tmp_path: Path):
    """A plain file truncated while written or copied (compressed ones: tests/test_corpus.py)."""
    from contamray.corpus.readers import iter_documents

    whole = b"".join(json.dumps({"text": f"document {i}"}).encode() + b"\n" for i in range(3))
    (tmp_path / "cut.jsonl").write_bytes(whole[:-9])
    docs = list(iter_documents(str(tmp_path / "cut.jsonl"), errors="keep"))
    assert [d["text"] for d in docs[:2]] == ["document 0", "document 1"]
    assert docs[2]["doc_id"] == f"{tmp_path}/cut.jsonl:3" and docs[2]["error"].startswith("not a JSON line")


def test_empty_and_blank_corpus_documents_are_documents_that_match_nothing(tmp_path: Path):
    """Not an error: a training corpus may hold empty documents; they are read (no error row) and no
    benchmark text can overlap them."""
    from contamray.corpus.readers import iter_documents
    from contamray.methods.base import get_method
    from contamray.records import Record

    (tmp_path / "e.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ("", "   \n\t ")))
    docs = list(iter_documents(str(tmp_path / "e.jsonl"), errors="keep"))
    assert [(d["text"].strip(), d["error"]) for d in docs] == [("", ""), ("", "")]
    method = get_method("ngram_overlap")
    cfg = method.make_config({"n": 2})
    record = Record(id="r", partition="p", input="a b c d", label="e", reference="a b c d", task="question_answering")
    index = method.build_index([record], cfg)
    assert method.match(docs, index, cfg) == []
    assert method.match([{"doc_id": "d", "text": "x a b c d y"}], index, cfg)  # a real overlap does match


# --------------------------------------------------------------------------- models and engines


def test_a_corrupt_checkpoint_names_the_key_and_the_fix(tmp_path: Path):
    from contamray.engines import EngineSpec, build_engine, resolve_model_path

    source = Path(resolve_model_path("smollm2-135m"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    with pytest.raises(OSError, match=r"models\.m\.source: cannot load model .*no file named model\.safetensors"):
        build_engine(EngineSpec(source=str(tmp_path), backend="hf", name="m"))
    (tmp_path / "model.safetensors").write_bytes(b"\x00not a checkpoint" * 64)
    with pytest.raises(ValueError, match=r"models\.m\.source: cannot load model .*SafetensorError.*download or "
                       r"convert the checkpoint again"):  # fmt: skip
        build_engine(EngineSpec(source=str(tmp_path), backend="hf", name="m"))


def test_a_checkpoint_missing_a_layers_weights_is_refused_not_started_at_random(tmp_path: Path):
    """Weights for every tensor but one layer's (a shard lost in a copy): transformers loads it, starting the layer
    at random with a logged table, and the model's scores are noise. The engine refuses it, naming the tensors."""
    from safetensors.torch import load_file, save_file

    from contamray.engines import EngineSpec, build_engine, resolve_model_path
    from contamray.engines.checkpoint_files import CheckpointError

    source = Path(resolve_model_path("smollm2-135m"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    weights = load_file(source / "model.safetensors")
    kept = {name: tensor for name, tensor in weights.items() if not name.startswith("model.layers.29.")}
    assert len(kept) == len(weights) - 9
    save_file(kept, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"models\.m\.source: the checkpoint .* has no weights for 9 of the "
                       r"model's tensors \(model\.layers\.29\..*would start them at random"):  # fmt: skip
        build_engine(EngineSpec(source=str(tmp_path), backend="hf", name="m"))


# what vLLM 0.32's processes printed when a checkpoint without layer 29's norms was started (2026-12-03): the
# worker's error on stdout, the engine core's wrapper on stderr, and this process only "see root cause above"
VLLM_STDOUT = """\
(Worker pid=22619) INFO 12-03 14:13:26 [default_loader.py:501] Loading weights took 1.48 seconds
(Worker pid=22619) ERROR 12-03 14:13:26 [multiproc_executor.py:953] WorkerProc failed to start.
(Worker pid=22619) ERROR 12-03 14:13:26 [multiproc_executor.py:953]     raise ValueError(
(Worker pid=22619) ERROR 12-03 14:13:26 [multiproc_executor.py:953] ValueError: Following weights were not \
initialized from checkpoint: {'model.layers.29.input_layernorm.weight'}
(EngineCore pid=22594) ERROR 12-03 14:13:31 [core.py:1510] EngineCore failed to start.
(EngineCore pid=22594) ERROR 12-03 14:13:31 [core.py:1510] Exception: WorkerProc initialization failed due to an \
exception in a background process. See stack trace for root cause.
"""
VLLM_STDERR = """\
Process EngineCore:
Traceback (most recent call last):
Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root \
cause.
"""


def test_vllms_start_failure_names_its_engine_process_error_not_see_root_cause_above(tmp_path: Path):
    """vLLM raises "Engine core initialization failed. See root cause above" in the process that starts it; the
    cause is what its engine processes wrote to the outputs they share with it (a Serve replica's log files). Only
    what was written since the start counts: an older error in the same file is not this start's."""
    from contamray.engines.vllm_start import EngineStartError, explained_start

    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    out.write_text("(Worker pid=1) ERROR 12-01 10:00:00 [x.py:1] KeyError: 'an older failure'\n")
    err.write_text("")
    marks = {str(out): out.stat().st_size, str(err): 0}
    from contamray.engines import vllm_start

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vllm_start, "output_files", lambda: [str(out), str(err)])
        with pytest.raises(EngineStartError) as raised, explained_start("models.target"):
            with out.open("a") as fh_out, err.open("a") as fh_err:
                fh_out.write(VLLM_STDOUT)
                fh_err.write(VLLM_STDERR)
            raise RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
        message = str(raised.value)
        assert message.startswith("models.target: vLLM's engine did not start: ValueError: Following weights were "
                                  "not initialized from checkpoint: {'model.layers.29.input_layernorm.weight'}")
        assert str(out) in message and "older failure" not in message
        assert vllm_start.cause(marks) == message.split("did not start: ")[1].split(" (its engine")[0]
        with pytest.raises(RuntimeError, match="^something else$"), explained_start("models.target"):
            raise RuntimeError("something else")  # not vLLM's start failure: as it was


@pytest.mark.slow
def test_a_checkpoint_vllm_refuses_says_why_in_the_engines_error(tmp_path: Path):
    """The same checkpoint as above (layer 29's weights missing) on the vllm backend, started as a Ray worker runs
    (stdout and stderr to files): vLLM refuses it in its worker process; the error names the missing weights."""
    from safetensors.torch import load_file, save_file

    from contamray.engines import resolve_model_path

    source = Path(resolve_model_path("smollm2-135m"))
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (model / name).write_bytes((source / name).read_bytes())
    weights = load_file(source / "model.safetensors")
    kept = {k: v for k, v in weights.items() if not k.startswith("model.layers.29.")}
    save_file(kept, str(model / "model.safetensors"), metadata={"format": "pt"})
    script = (
        "from contamray.engines.vllm import VLLMEngine\n"
        "if __name__ == '__main__':\n"
        "    try:\n"
        f"        VLLMEngine({str(model)!r}, dtype='float32', max_model_len=256, kv_cache_gib=1,\n"
        "                   where='models.broken')\n"
        "    except Exception as err:\n"
        "        open('raised.txt', 'w').write(f'{type(err).__name__}: {err}')\n"
    )
    (tmp_path / "start.py").write_text(script)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with (tmp_path / "out.log").open("w") as out, (tmp_path / "err.log").open("w") as err:
        proc = subprocess.run([sys.executable, "start.py"], cwd=tmp_path, env=env, stdout=out, stderr=err, timeout=600)
    raised = (tmp_path / "raised.txt").read_text() if (tmp_path / "raised.txt").exists() else ""
    assert proc.returncode == 0 and raised, (tmp_path / "err.log").read_text()[-3000:]
    assert raised.startswith("EngineStartError: models.broken: vLLM's engine did not start: ValueError: Following "
                             "weights were not initialized from checkpoint: {'model.layers.29."), raised  # fmt: skip


@pytest.mark.slow
def test_a_model_that_cannot_be_loaded_stops_the_run_naming_it_and_the_other_models_cells_are_kept(
    tmp_path: Path, mirror_dir: Path
):
    """Two models in one run, one of them a checkpoint that cannot be loaded: its Serve deployment fails, the
    run stops with an error naming the model key and the fix, and the cells of the model that loaded are
    finished (stored with their verdicts): the re-run after the fix reuses them. The broken checkpoint is a
    whole safetensors file whose tensor does not fit the model's config (the plan reads headers and sizes, so a
    file cut short or not safetensors at all is refused before any work: ``test_checkpoint_files.py``); only
    loading it can tell. Loading it again would fail alike (a ``CheckpointError``): the run stops at the replica's
    first failed start, not after Serve's three."""
    import torch
    from safetensors.torch import save_file

    from contamray.engines import resolve_model_path

    bad = tmp_path / "broken-model"
    bad.mkdir()
    source = Path(resolve_model_path("smollm2-135m"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (bad / name).write_bytes((source / name).read_bytes())
    save_file({"model.embed_tokens.weight": torch.zeros(10, 576)}, str(bad / "model.safetensors"))  # 10 rows of 49,152
    out = tmp_path / "run"
    args = ["+exp=base", "model=[smollm2_135m,smollm2_135m_fp32]", f"models.smollm2_135m.source={bad}",
            "benchmark=[synthetic_facts]", "method=[perplexity]", "corpus=none", "run.limit=6", "ray.num_cpus=3",
            f"data.mirror_dir={mirror_dir}", f"hydra.run.dir={out}"]  # fmt: skip
    env = dict(os.environ, CONTAMRAY_LOG="INFO")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "contamray.run", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1200)  # fmt: skip
    log = proc.stdout + proc.stderr
    assert proc.returncode == 4, log[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("model error:")]
    assert line.startswith("model error: model smollm2_135m: its replica could not start: CheckpointError: "
                           "models.smollm2_135m.source: cannot load model")  # fmt: skip
    # the first failed start stopped it: Serve had two more tries of the same load to go
    assert "Retrying 2 more time(s)" in log and "failed to start 3 times" not in log, log[-3000:]
    assert "download or convert the checkpoint again" in line and f"with hydra.run.dir={out} reuses them" in line
    finished = [json.loads(p.read_text()) for p in (out / "cells").glob("*/verdict.json")]
    assert [v["model"] for v in finished] == ["smollm2_135m_fp32"], log[-3000:]


def test_a_failed_deployment_is_reported_by_its_replicas_own_error():
    """Serve's report of a deployment whose constructor raised ends with the engine's error, which names
    the model key and the fix; that line is the run's message."""
    from contamray.serve.hosting import _last_error

    report = (
        "Failed to update the deployments ['engine']. The deployment failed to start 3 times in a row. This may "
        "be due to a problem with its constructor or initial health check failing. See controller logs for "
        "details. Error:\nTraceback (most recent call last):\n  File \"hf.py\", line 160, in __init__\n"
        "safetensors._safetensors_rust.SafetensorError: Error while deserializing header: header too large\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "ValueError: models.m.source: cannot load model '/x' with transformers (SafetensorError: ...); its files "
        "are corrupt or incomplete: download or convert the checkpoint again\n"
    )
    assert _last_error(report).startswith("ValueError: models.m.source: cannot load model '/x'")
    qualified = report.replace("\nValueError: ", "\ncontamray.engines.checkpoint_files.CheckpointError: ")
    assert _last_error(qualified).startswith("CheckpointError: models.m.source: cannot load model '/x'")
    assert _last_error("Deploying: waiting for resources") == "Deploying: waiting for resources"
    assert _last_error("") == "Serve gave no reason"


class OOM:
    """A forward pass that runs out of memory on batches above ``most`` and on any text longer than ``huge``."""

    def __init__(self, most: int, huge: int) -> None:
        self.most, self.huge, self.calls = most, huge, []

    def __call__(self, seqs: list[list[int]]) -> None:
        self.calls.append(len(seqs))
        if len(seqs) > self.most or any(len(s) > self.huge for s in seqs):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")


def test_out_of_memory_halves_the_batch_then_fails_the_one_request_with_the_reason(caplog):
    from contamray.engines.base import halving, is_out_of_memory

    assert is_out_of_memory(torch.cuda.OutOfMemoryError("x")) and is_out_of_memory(MemoryError())
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory")) and not is_out_of_memory(ValueError("x"))
    try:  # the CPU allocator's own error (10 TB, refused at once unless the kernel overcommits always)
        torch.empty(10**13, dtype=torch.uint8)
    except RuntimeError as real:
        assert is_out_of_memory(real)
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    oom = OOM(most=2, huge=100)
    items = [[1] * 5, [1] * 5, [1] * 500, [1] * 5, [1] * 5, [1] * 5]

    def run(part):
        oom(part)
        return [len(s) for s in part]

    with caplog.at_level("WARNING"):
        got = halving(run, items, lambda s, reason: reason, "hf:test")
    assert got[:2] + got[3:] == [5] * 5
    assert got[2].startswith("out of memory even alone in a batch of 1 (OutOfMemoryError: CUDA out of memory")
    assert "lower the model's max_model_len" in got[2]
    assert oom.calls == [6, 3, 1, 2, 1, 1, 3, 1, 2]  # halves, down to the one request that does not fit
    assert "a batch of 6 ran out of memory" in caplog.text
    with pytest.raises(ValueError):  # any other error is not the engine's to hide
        halving(lambda part: [int("x")], [1], lambda s, r: r, "hf:test")


def test_an_engine_batch_out_of_memory_reaches_the_one_request_as_its_error():
    """HFEngine's scoring loop (its model replaced by a forward pass that runs out of memory) through
    ``answer_requests``, as a Serve replica calls it: one failed Output with the reason, the others scored."""
    from contamray.engines.base import TokenScores
    from contamray.engines.hf import HFEngine
    from contamray.engines.wire import Request, Sampling
    from contamray.pipeline.actors import answer_requests

    engine = object.__new__(HFEngine)
    engine.name, engine.batch_size, engine.max_context = "hf:fake", 8, 4096
    engine._share_prefixes = True  # the default: these texts share no prefix, so they are batched by length
    engine.encode = lambda texts: [[ord(c) for c in t] for t in texts]
    oom = OOM(most=2, huge=200)

    def score_batch(seqs, with_stats):
        oom(seqs)
        return [TokenScores(token_logprobs=[-1.0] * (len(s) - 1), token_ids=s[1:]) for s in seqs]

    engine._score_batch = score_batch
    texts = ["a short text", "x" * 300, "another short one", "and a third", "one more"]
    reqs = [Request(key=f"k{i}", record_ids=(f"r{i}",), kind="score", text=t, sampling=Sampling())
            for i, t in enumerate(texts)]  # fmt: skip
    outs = answer_requests(engine, reqs)
    assert [o.key for o in outs] == [r.key for r in reqs]
    assert "out of memory even alone" in outs[1].error and outs[1].token_logprobs == []
    assert all(not o.error and o.num_tokens == len(t) - 1 for o, t in zip(outs, texts) if o.key != "k1")


def test_any_other_engine_error_fails_only_the_request_that_raises_it():
    """A batch whose engine call raises for another reason is answered again one request at a time
    (``answer_requests``): the request that really fails carries the error, its neighbours are answered."""
    from contamray.engines.base import TokenScores
    from contamray.engines.wire import Request
    from contamray.pipeline.actors import answer_requests

    class Picky:
        name, calls = "picky", []

        def score(self, texts, with_vocab_stats=False, context_len=0, stride=0):
            self.calls.append(len(texts))
            if "\x00" in "".join(texts):
                raise ValueError("the tokenizer refuses NUL characters")
            return [TokenScores(token_logprobs=[-1.0] * len(t.split())) for t in texts]

    engine = Picky()
    texts = ["one two", "bad\x00text", "three four five"]
    outs = answer_requests(engine, [Request(key=f"k{i}", record_ids=(f"r{i}",), kind="score", text=t)
                                    for i, t in enumerate(texts)])  # fmt: skip
    assert outs[1].error == "ValueError: the tokenizer refuses NUL characters"
    assert [o.num_tokens for o in outs] == [2, 0, 3] and engine.calls == [3, 1, 1, 1]


def test_a_scoring_chunk_or_a_reduce_that_raises_fails_its_rows_or_its_cell_not_the_run(monkeypatch):
    """A method's ``score`` raising on a chunk: one error row per example of the chunk. Its ``reduce``
    raising: the cell's verdict is ``error`` with the reason, its rows kept (the other cells go on)."""
    from contamray.engines.wire import Output
    from contamray.methods.base import get_method
    from contamray.pipeline.actors import ScoreWorker
    from contamray.pipeline.cells import reduce_verdict
    from contamray.records import Record

    records = [Record(id=f"r{i}", partition="p", input=f"text {i}", label="", reference=f"text {i}",
                      task="question_answering") for i in range(3)]  # fmt: skip
    cls = type(get_method("min_k"))

    def broken(self, *args, **kwargs):
        raise ZeroDivisionError("a bug in the method")

    monkeypatch.setattr(cls, "score", broken)
    worker = ScoreWorker({"min_k": ("min_k", {})})
    payload = json.dumps({"records": [r.to_row() for r in records], "outputs": [Output(key="x").to_row()]})
    rows = json.loads(worker._score("min_k", payload))
    assert [r["record_id"] for r in rows] == ["r0", "r1", "r2"]
    assert all(r["error"].startswith("ZeroDivisionError: a bug in the method") for r in rows)
    monkeypatch.setattr(cls, "reduce", broken)
    verdict = reduce_verdict("min_k", "min_k", {}, pd.DataFrame(rows).assign(partition="p"))
    assert verdict["decision"] == "error"
    assert verdict["error"] == "reduce failed: ZeroDivisionError: a bug in the method"
    assert verdict["n_examples"] == 3 and verdict["n_failed"] == 3


@pytest.mark.slow
def test_the_real_engine_halves_on_out_of_memory_and_answers_as_without_it(caplog):
    """The embedded model in float32, its forward passes made to run out of memory on batches above 1
    and on one long text: scores and greedy completions equal an engine that never ran out, and the
    long text alone fails with the reason."""
    from contamray.engines import resolve_model_path
    from contamray.engines.hf import HFEngine
    from contamray.engines.wire import Sampling

    class Tight(HFEngine):
        limit = 1

        def _score_batch(self, seqs, with_stats):
            if any(len(s) > 60 for s in seqs):  # the CPU allocator's own failure (10 TB), else a simulated one
                torch.empty(10**13, dtype=torch.uint8)
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
            if len(seqs) > self.limit:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
            return super()._score_batch(seqs, with_stats)

        def _generate_ids(self, seqs, gen_config, extra, repeats=1):
            if len(seqs) * repeats > self.limit:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
            return super()._generate_ids(seqs, gen_config, extra, repeats)

    path = resolve_model_path("smollm2-135m")
    tight = Tight(path, dtype="float32", batch_size=4)
    roomy = HFEngine(path, dtype="float32", batch_size=4)
    texts = ["The capital of France is Paris.", "Water boils at 100 degrees.", "word " * 80, "Cats sleep a lot."]
    with caplog.at_level("WARNING"):
        got = tight.score(texts)
    want = roomy.score([t for i, t in enumerate(texts) if i != 2])
    assert "out of memory even alone" in got[2].error and got[2].token_logprobs == []
    for g, w in zip([got[0], got[1], got[3]], want):
        assert not g.error and g.token_ids == w.token_ids
        assert torch.allclose(torch.tensor(g.token_logprobs), torch.tensor(w.token_logprobs), atol=1e-4)
    prompts = ["The capital of France is", "Two plus two equals", "The sky is"]
    sampling = Sampling(max_tokens=5)
    alone = [roomy.complete([p], sampling)[0].text for p in prompts]  # what batches halved down to 1 give
    assert [c.text for c in tight.complete(prompts, sampling)] == alone and all(alone)
    assert "ran out of memory" in caplog.text


# --------------------------------------------------------------------------- a full disk


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch):
    """Writes of local files fail with ENOSPC while ``full["on"]`` is true (the store's own write path)."""
    import fsspec.implementations.local as local

    state = {"on": False}
    original = local.LocalFileOpener.write

    def write(self, data):
        if state["on"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(self, data)

    monkeypatch.setattr(local.LocalFileOpener, "write", write)
    return state


def test_a_full_disk_stops_with_the_path_and_keeps_every_stored_cell_whole(tmp_path: Path, full_disk):
    from contamray.pipeline.store import PROGRESS_FILE, ResultStore, StoreWriteError

    cells = [Cell("m", "b", f"method{i}", "closed") for i in range(3)]
    frame = pd.DataFrame({"record_id": list("abc"), "score": [0.1, 0.2, 0.3]})
    store = ResultStore(tmp_path / "run", cells_root=str(tmp_path / "cells"))
    store.track(["h0", "h1", "h2"])
    store.put(cells[0], "h0", frame, {"decision": "clean"})
    stored = (tmp_path / "cells/h0/examples.parquet").read_bytes()
    full_disk["on"] = True
    with pytest.raises(StoreWriteError) as err:
        store.put_examples(cells[1], "h1", frame)
    message = str(err.value)
    assert err.value.errno == errno.ENOSPC and f"{tmp_path}/cells/h1/examples.parquet" in message
    assert "No space left on device" in message and "every cell stored before is intact" in message
    assert "Fix: free space" in message
    full_disk["on"] = False
    store.put_examples(cells[2], "h2", frame)  # examples stored, then the disk fills before the verdict
    full_disk["on"] = True
    with pytest.raises(StoreWriteError, match=r"cells/h2/verdict\.json"):
        store.put_verdict(cells[2], "h2", {"decision": "clean"})
    full_disk["on"] = False
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]  # no half-written file left behind
    again = ResultStore(tmp_path / "run", cells_root=str(tmp_path / "cells"))  # what a re-run finds
    assert again.has("h0") and (tmp_path / "cells/h0/examples.parquet").read_bytes() == stored
    assert hashlib.sha256(stored).hexdigest() == (tmp_path / "cells/h0/examples.sha256").read_text()
    assert not again.has_examples("h1") and not again.has("h1")  # scored again
    assert again.has_examples("h2") and not again.has("h2")  # reduced again, not scored again
    progress = json.loads((tmp_path / "run" / PROGRESS_FILE).read_text())  # still whole JSON
    assert progress["cells_done"] == 1


@pytest.mark.slow
def test_a_run_on_a_full_disk_stops_with_a_clear_message_and_its_rerun_goes_on(tmp_path: Path, mirror_dir: Path):
    """A real run (entry point, local Ray, no model: the 13-gram scan of a planted corpus) whose disk fills
    when its second cell's table is written: exit status 3, one line naming the path and the fix, the
    first cell stored whole; the re-run on the same folder completes and keeps the first cell's table."""
    out = tmp_path / "run"
    script = (
        "import errno, os, sys\n"
        "import fsspec.implementations.local as local\n"
        "original, seen = local.LocalFileOpener.write, []\n"
        "def write(self, data):\n"
        "    if '/examples.parquet.tmp-' in self.path and '/cells/' in self.path:\n"
        "        seen.append(self.path)\n"
        "        if len(seen) == 2:\n"
        "            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
        "    return original(self, data)\n"
        "local.LocalFileOpener.write = write\n"
        "from contamray.run import cli_main\n"
        "cli_main()\n"
    )
    args = ["+exp=base", "benchmark=[arc_challenge,gsm8k]", "method=[ngram13]", "run.limit=4", "ray.num_cpus=2",
            f"data.mirror_dir={mirror_dir}", f"hydra.run.dir={out}"]  # fmt: skip
    env = dict(os.environ, CONTAMRAY_LOG="INFO")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-5000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("store error:")]
    assert "No space left on device" in line and "/cells/" in line and "Fix: free space" in line
    assert "Traceback" not in proc.stderr
    tables = list((out / "cells").glob("*/examples.parquet"))
    assert len(tables) == 1 and not [p for p in out.rglob("*") if ".tmp-" in p.name]
    first = tables[0].read_bytes()
    proc = subprocess.run([sys.executable, "-m", "contamray.run", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert tables[0].read_bytes() == first and len(list((out / "cells").glob("*/verdict.json"))) == 2
    assert len(pd.read_parquet(out / "partitions.parquet")) == 2


# --------------------------------------------------------------------------- the HTTP API


def test_api_items_blank_or_with_repeated_ids_are_a_422_naming_them():
    from contamray.serve.check import Item, items_to_records
    from contamray.serve.security import ApiError

    with pytest.raises(ApiError) as err:
        items_to_records([Item(text="A real sentence."), Item(text="   \n\t"), Item(text="")])
    assert err.value.status == 422 and err.value.error == "invalid_items"
    assert "items [1, 2]: text is empty or only whitespace" in str(err.value.detail)
    with pytest.raises(ApiError) as err:
        items_to_records([Item(text="one", id="x"), Item(text="two", id="x")])
    assert err.value.status == 422 and "ids ['x'] appear more than once" in str(err.value.detail)
    assert [r.id for r in items_to_records([Item(text="one"), Item(text="two")])] == ["item0", "item1"]


def test_api_bodies_of_the_wrong_shape_are_refused_field_by_field():
    """The request models the API validates bodies with (FastAPI answers 422 ``invalid_request`` with
    these fields, tests/test_serve_api.py::test_limits_and_allow_lists over HTTP)."""
    from pydantic import ValidationError

    from contamray.serve.api import CheckIn, JobIn

    bad = [
        ({"methods": ["min_k"], "items": [{"text": "x"}]}, "model"),
        ({"model": "m", "methods": "min_k", "items": [{"text": "x"}]}, "methods"),
        ({"model": "m", "methods": ["min_k"], "items": "x"}, "items"),
        ({"model": "m", "methods": ["min_k"], "items": [{"text": ""}]}, "items.0.text"),
        ({"model": "m", "methods": ["min_k"], "items": [{"text": "x", "colour": 1}]}, "items.0.colour"),
        ({"model": "m", "methods": ["min_k"], "items": [{"text": 5}]}, "items.0.text"),
        ({"model": "m", "methods": ["min_k"], "items": [{"text": "x", "id": "i" * 129}]}, "items.0.id"),
        ({"model": "m", "methods": ["min_k"], "items": [{"text": "x"}], "reference": {"benchmark": "b",
          "sample": "last"}}, "reference.sample"),
    ]  # fmt: skip
    for body, field in bad:
        with pytest.raises(ValidationError) as err:
            CheckIn.model_validate(body)
        assert field in {".".join(str(p) for p in e["loc"]) for e in err.value.errors()}, (body, err.value)
    with pytest.raises(ValidationError):
        JobIn.model_validate({"models": ["m"], "benchmarks": ["b"], "methods": ["x"], "overrides": "run.limit=1"})


def test_a_result_uri_on_a_filesystem_fsspec_cannot_open_is_refused_before_any_work_naming_the_key():
    """``run.output_root`` / ``cells_uri`` / ``artifacts_uri`` on an unknown scheme, or one whose package is not
    installed, stop the run before Ray starts (before: the first stored cell failed, after the first cells)."""
    from omegaconf import OmegaConf

    from contamray.output_root import check_uris

    with pytest.raises(ConfigError, match=r"run.cells_uri: 'nosuch://bucket/cells' .*Protocol not known.*local path"):
        check_uris(OmegaConf.create({"output_root": "outputs", "cells_uri": "nosuch://bucket/cells"}))
    with pytest.raises(ConfigError, match=r"run.output_root: 'hdfsx://h/x'"):
        check_uris({"output_root": "hdfsx://h/x"})
    check_uris({"output_root": "file:///tmp/x", "cells_uri": "memory://cells", "artifacts_uri": None})

"""The cluster files and the jobs/ scripts.

- ``cluster.yaml`` and ``cluster-onprem.yaml`` go through Ray's own launcher checks (``prepare_config`` +
  ``validate_config``, what ``ray up`` runs before touching a machine);
- the scripts' ``ray job submit`` command lines (dry run): quoting of Hydra overrides, entrypoint
  resources, runtime env, the zoo file's two line forms and its errors;
- for real, on a local Ray head started here with a dashboard (the Jobs API): ``jobs/report.sh`` on run
  directories written by the real ResultStore, and ``jobs/zoo.sh`` running the real pipeline for one
  model of the embedded zoo; both pull the report back.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from contamray.pipeline.plan import Cell
from tests.ray_head import ray_head as local_ray_head
from tests.test_report import ARC, GSM, expected_holm, guided_cell, ngram_rows, verdict, write_run

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "jobs"


# ---------------------------------------------------------------------------------------------
# cluster files


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-onprem.yaml"])
def test_cluster_files_pass_rays_launcher_checks(name: str) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load((REPO / name).read_text()))
    validate_config(config)
    head = " ".join(config["head_start_ray_commands"])
    assert '--resources=\'{"contamray_driver": 8}\'' in head  # jobs/common.sh pins drivers to the head
    assert any('-e ".[vllm]"' in c for c in config["setup_commands"])  # the project with its vLLM extra


def test_aws_cluster_has_gpu_nodes_that_fit_the_70b_engine() -> None:
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    model = yaml.safe_load((REPO / "conf" / "model" / "llama2_70b.yaml").read_text())
    assert model["num_gpus"] == model["tensor_parallel_size"]  # one engine actor owns all its TP GPUs
    types = config["available_node_types"]
    assert types["gpu_large"]["node_config"]["InstanceType"] == "g6e.12xlarge"  # 4 x 48 GB >= 138 GB bf16
    assert types["head"]["resources"] == {"contamray_driver": 8}


# ---------------------------------------------------------------------------------------------
# the scripts' commands (dry run)


def dry_run(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "CONTAMRAY_JOBS_DRY_RUN": "1", "CONTAMRAY_OUTPUT_ROOT": "/srv/out", **(env or {})}
    full_env.pop("RAY_ADDRESS", None)
    return subprocess.run(["bash", str(JOBS / script), *args], cwd=REPO, env=full_env,
                          capture_output=True, text=True, timeout=60)


def submissions(stdout: str) -> list[dict]:
    """The `ray job submit` commands printed by a dry run: options and the entrypoint's argv."""
    out = []
    for line in stdout.splitlines():
        if not line.startswith("+ ray job submit"):
            continue
        argv = shlex.split(line[2:])
        sep = argv.index("--")
        assert argv[3] == "--no-wait"  # submit, then follow / wait separately
        opts = dict(zip(argv[4:sep:2], argv[5:sep:2]))
        assert all(k.startswith("--") for k in opts) and len(argv[4:sep]) == 2 * len(opts)
        entry = argv[sep + 1:]
        assert entry[:2] == ["sh", "-c"], entry
        out.append({"opts": opts, "script": entry[2]})
    return out


def test_zoo_submits_one_job_per_model_then_the_report(tmp_path) -> None:
    models = tmp_path / "zoo.txt"
    models.write_text(
        "# the zoo\n"
        "llama2_7b\n"
        "\n"
        "mistral_7b  mistralai/Mistral-7B-v0.1  num_gpus=1 backend=vllm   # defined here\n"
    )
    proc = dry_run("zoo.sh", "--name", "z1", "--correction", "bh", str(models), "+exp=llama2_openllm",
                   "corpus.paths=[/data/*.jsonl.gz]")
    assert proc.returncode == 0, proc.stderr
    jobs = submissions(proc.stdout)
    assert len(jobs) == 3
    for job in jobs:
        assert json.loads(job["opts"]["--entrypoint-resources"]) == {"contamray_driver": 1}
        assert job["opts"]["--entrypoint-num-cpus"] == "1"
        assert job["opts"]["--working-dir"] == str(REPO)
        assert ".git" in json.loads(job["opts"]["--runtime-env-json"])["excludes"]
    first, second, report = (shlex.split(j["script"]) for j in jobs)
    assert first == [
        "python", "-m", "contamray.run", "hydra.run.dir=/srv/out/z1/llama2_7b", "run.cells_uri=/srv/out/cells",
        "model=[llama2_7b]", "+exp=llama2_openllm", "corpus.paths=[/data/*.jsonl.gz]",
    ]
    assert second[3:] == [
        "hydra.run.dir=/srv/out/z1/mistral_7b", "run.cells_uri=/srv/out/cells", "model=[]",
        "+models.mistral_7b.source=mistralai/Mistral-7B-v0.1", "+models.mistral_7b.num_gpus=1",
        "+models.mistral_7b.backend=vllm", "+exp=llama2_openllm", "corpus.paths=[/data/*.jsonl.gz]",
    ]
    assert report == ["python", "-m", "contamray.cli", "report", "/srv/out/z1", "--out", "/srv/out/z1/report",
                      "--correction", "bh", "--alpha", "0.05"]
    assert "+ pull /srv/out/z1/report -> ./reports/z1" in proc.stdout
    assert jobs[0]["opts"]["--submission-id"].startswith("contamray-z1-llama2_7b-")


def test_zoo_file_errors_name_the_line(tmp_path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("llama2_7b\nmistral-7b mistralai/Mistral-7B-v0.1\n")
    proc = dry_run("zoo.sh", str(bad))
    assert proc.returncode == 2
    assert f"{bad}:2: model name 'mistral-7b' must be a config key" in proc.stderr
    bad.write_text("qwen Qwen/Qwen2-7B gpus\n")
    proc = dry_run("zoo.sh", str(bad))
    assert proc.returncode == 2 and f"{bad}:1: 'gpus' is not key=value" in proc.stderr
    proc = dry_run("zoo.sh", str(tmp_path / "missing.txt"))
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_sweep_and_submit_commands(tmp_path) -> None:
    proc = dry_run("sweep.sh", "--name", "s1", "+exp=llama2_openllm", "model=[llama2_7b],[llama2_70b]", "run.seed=0,1")
    assert proc.returncode == 0, proc.stderr
    (job,) = submissions(proc.stdout)
    sweep, report = job["script"].split("; rc=$?; ")
    assert shlex.split(sweep) == ["python", "-m", "contamray.run", "-m", "hydra.sweep.dir=/srv/out/s1",
                                  "+exp=llama2_openllm", "model=[llama2_7b],[llama2_70b]", "run.seed=0,1"]
    assert report.endswith("; exit $rc")  # the report is written even if a grid point failed
    report_argv = shlex.split(report.removesuffix("; exit $rc"))
    assert report_argv[:5] == ["python", "-m", "contamray.cli", "report", "/srv/out/s1"]

    proc = dry_run("submit.sh", "--name", "r1", "+exp=smoke", "run.limit=5",
                   env={"CONTAMRAY_ENTRYPOINT_RESOURCES": "{}"})
    assert proc.returncode == 0, proc.stderr
    (job,) = submissions(proc.stdout)
    run, report = job["script"].split(" && ")
    assert shlex.split(run) == [
        "python", "-m", "contamray.run", "hydra.run.dir=/srv/out/r1", "+exp=smoke", "run.limit=5",
    ]
    assert "--out /srv/out/r1/report" in report
    assert job["opts"]["--entrypoint-resources"] == "{}"


def test_scripts_need_a_cluster_address_and_an_absolute_output_root() -> None:
    env = dict(os.environ, CONTAMRAY_OUTPUT_ROOT="/srv/out")
    env.pop("RAY_ADDRESS", None)
    env.pop("CONTAMRAY_JOBS_DRY_RUN", None)
    proc = subprocess.run(["bash", str(JOBS / "submit.sh"), "+exp=smoke"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "set RAY_ADDRESS" in proc.stderr
    proc = dry_run("report.sh", "/x", env={"CONTAMRAY_OUTPUT_ROOT": "relative/out"})
    assert proc.returncode == 2 and "must be an absolute path" in proc.stderr
    for script in ("submit.sh", "sweep.sh", "zoo.sh", "report.sh"):
        helped = subprocess.run(["bash", str(JOBS / script), "--help"], capture_output=True, text=True, timeout=60)
        assert helped.returncode == 0 and "RAY_ADDRESS=http://<head>:8265" in helped.stdout, script


def test_a_head_without_its_job_agent_yet_is_submitted_to_again_and_other_refusals_are_final(tmp_path) -> None:
    """``cr_submit`` against a ``ray`` that refuses as a head just started does (Ray's "No available agent to submit
    job, please try again later"): tried again after 5 s, then submitted; any other refusal is reported at once,
    and the agent's absence past ``CONTAMRAY_SUBMIT_WAIT_S`` too."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    (fake / "ray").write_text(
        "#!/usr/bin/env bash\n"
        f"echo x >> {calls}\n"
        f'n=$(wc -l < {calls})\n'
        'if [ "$n" -le "$REFUSALS" ]; then echo "RuntimeError: Request failed with status code 500: $WHY"; exit 1; fi\n'
        'echo "Job submitted"\n'
    )
    (fake / "ray").chmod(0o755)

    def submit(refusals: int, why: str, wait: str = "120") -> subprocess.CompletedProcess:
        calls.write_text("")
        env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", REFUSALS=str(refusals), WHY=why,
                   CONTAMRAY_SUBMIT_WAIT_S=wait)  # fmt: skip
        env.pop("CONTAMRAY_JOBS_DRY_RUN", None)
        return subprocess.run(["bash", "-c", f"set -euo pipefail; source {JOBS / 'common.sh'}; cr_submit id 'true'"],
                              env=env, capture_output=True, text=True, timeout=60)  # fmt: skip

    agent = "No available agent to submit job, please try again later.."
    proc = submit(1, agent)
    assert proc.returncode == 0 and "Job submitted" in proc.stdout, proc.stderr
    assert "no job agent yet" in proc.stderr and len(calls.read_text().splitlines()) == 2
    proc = submit(1, "Job with submission_id id already exists.")
    assert proc.returncode != 0 and "already exists" in proc.stderr and len(calls.read_text().splitlines()) == 1
    proc = submit(9, agent, wait="5")
    assert proc.returncode != 0 and agent in proc.stderr and len(calls.read_text().splitlines()) == 2


# ---------------------------------------------------------------------------------------------
# for real, on a local Ray head with the Jobs API


@pytest.fixture(scope="module")
def ray_head():
    """A local Ray head with a ``contamray_driver`` resource (where job drivers run)."""
    with local_ray_head(2, '--resources={"contamray_driver": 2}') as head:
        yield {"address": head.dashboard, "temp": head.temp}


def run_script(
    ray_head: dict, out_root: Path, pulled: Path, *args: str, timeout: int = 600
) -> subprocess.CompletedProcess:
    env = dict(os.environ, RAY_ADDRESS=ray_head["address"], CONTAMRAY_OUTPUT_ROOT=str(out_root),
               CONTAMRAY_PULL_DIR=str(pulled), CONTAMRAY_ZOO_PARALLEL="1")
    env.pop("CONTAMRAY_JOBS_DRY_RUN", None)
    return subprocess.run(["bash", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_report_job_on_a_local_cluster_pulls_the_report(ray_head, tmp_path) -> None:
    sweep = tmp_path / "sweep"
    write_run(sweep / "0", [
        guided_cell("llama2_7b", "arc_challenge", 0.35, 1),
        guided_cell("llama2_7b", "gsm8k", 0.0, 2),
    ])
    rows = ngram_rows(ARC, 12, 3)
    write_run(sweep / "1", [(Cell("corpus:planted", "arc_challenge", "ngram13", "open"), rows,
                             verdict("ngram_overlap", "ngram13", rows))])
    (sweep / "2" / "cells").mkdir(parents=True)  # a grid point that never finished
    proc = run_script(ray_head, tmp_path / "out", tmp_path / "pulled", str(JOBS / "report.sh"), "--name", "r1",
                      str(sweep))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pulled = tmp_path / "pulled" / "r1"
    assert (pulled / "report.html").is_file() and (pulled / "plots" / "heatmap_guided_prompting.png").is_file()
    md = (pulled / "tables.md").read_text()
    raw = pd.read_parquet(sweep / "0" / "partitions.parquet").set_index("partition")["p_value"]
    adjusted = expected_holm({ARC: raw[ARC], GSM: raw[GSM]})  # the grid's two tests
    assert adjusted[ARC] == pytest.approx(2 / 2**12)  # every guided completion beats the general one (sign-flip: 2^-12)
    line = next(x for x in md.splitlines() if x.startswith("| llama2_7b |"))
    shown = [c.strip() for c in line.strip("|").split("|")[1:]]
    for text, partition in zip(shown, [ARC, GSM]):
        assert float(text.rstrip("†")) == pytest.approx(adjusted[partition], rel=5e-3)
        assert text.endswith("†") == (adjusted[partition] > 0.05)
    assert "| corpus:planted | 25.0% |" in md
    assert "no partitions.parquet (an unfinished run of the sweep" in md
    cells = pd.read_csv(pulled / "cells.csv")
    assert sorted(cells["partition"].unique()) == [ARC, GSM]


@pytest.mark.slow
def test_zoo_runs_the_real_pipeline_per_model_and_pulls_the_report(ray_head, tmp_path, mirror_dir) -> None:
    models = tmp_path / "zoo.txt"
    models.write_text("tiny  smollm2-135m  num_cpus=1\n")
    proc = run_script(
        ray_head, tmp_path / "out", tmp_path / "pulled", str(JOBS / "zoo.sh"), "--name", "zoo", str(models),
        "+exp=smoke", "method=[guided_prompting]", "benchmark=[arc_challenge]", "run.limit=2",
        f"data.mirror_dir={mirror_dir}", "methods.guided_prompting.judge=false", timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    run_dir = tmp_path / "out" / "zoo" / "tiny"
    partitions = pd.read_parquet(run_dir / "partitions.parquet")
    assert partitions[["model", "partition", "method"]].values.tolist() == [["tiny", ARC, "guided_prompting"]]
    assert (partitions["error"] == "").all()
    assert any((tmp_path / "out" / "cells").iterdir())  # the zoo's shared cell store
    pulled = tmp_path / "pulled" / "zoo"
    html = (pulled / "report.html").read_text()
    assert 'data-model="tiny"' in html and f'data-partition="{ARC}"' in html


# ---------------------------------------------------------------------------------------------
# a bare `ray job submit` (the design card's command): where the results land (issue 17, item 6)


def submit_bare(ray_head: dict, tmp_path: Path, mirror_dir: Path, *overrides: str) -> str:
    """``ray job submit --working-dir <checkout> -- python -m contamray.run +exp=smoke ...`` (cut to the
    13-gram scan of 4 rows: no model), HOME pointed into ``tmp_path``; returns the job's log."""
    env_vars = {"HOME": str(tmp_path / "home"), "CONTAMRAY_MIRROR_DIR": str(mirror_dir)}
    cmd = ["ray", "job", "submit", "--address", ray_head["address"], "--working-dir", str(REPO),
           "--runtime-env-json", json.dumps({"env_vars": env_vars}), "--",
           "python", "-m", "contamray.run", "+exp=smoke", "method=[ngram13]", "run.limit=4", *overrides]  # fmt: skip
    env = dict(os.environ)
    env.pop("CONTAMRAY_OUTPUT_ROOT", None)
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout + proc.stderr


def _run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.glob("smoke/*/partitions.parquet"))


@pytest.mark.slow
def test_a_bare_ray_job_writes_outside_rays_working_dir_and_says_where(ray_head, tmp_path, mirror_dir) -> None:
    log = submit_bare(ray_head, tmp_path, mirror_dir)
    runs = _run_dirs(tmp_path / "home" / "contamray" / "outputs")
    assert len(runs) == 1, log[-3000:]  # ~/contamray/outputs/smoke/<time>/ on the driver's node, not _ray_pkg_*
    assert f"results: {runs[0]} (on " in log
    assert "_ray_pkg_" not in str(runs[0]) and "runtime_resources" not in log.split("results: ")[-1].splitlines()[0]
    partitions = pd.read_parquet(runs[0] / "partitions.parquet")
    assert set(partitions["method"]) == {"ngram13"} and (partitions["error"] == "").all()

    # the same job again: a run of the same name (run.reuse_earlier) copies the first run's finished cells into its
    # own folder and computes none of them
    submit_bare(ray_head, tmp_path, mirror_dir)
    first, second = _run_dirs(tmp_path / "home" / "contamray" / "outputs")
    log = (second / "run.log").read_text()
    assert f"reusing 2 cell(s) an earlier run of this name finished ({first};" in log, log[-3000:]
    assert log.count("reusing finished cell") == 2
    assert (second / "partitions.parquet").read_bytes() == (first / "partitions.parquet").read_bytes()
    assert len(list((second / "cells").glob("*/verdict.json"))) == 2

    bucket = tmp_path / "bucket"  # an fsspec URI: cells stream there, the tables follow at the end
    log = submit_bare(ray_head, tmp_path, mirror_dir, f"run.output_root=file://{bucket}")
    runs = _run_dirs(bucket)
    assert len(runs) == 1, log[-3000:]
    assert f"results: file://{runs[0]}" in log
    assert (runs[0] / "report.md").is_file() and any((runs[0] / "cells").glob("*/verdict.json"))
    again = pd.read_parquet(runs[0] / "partitions.parquet")
    keys = ["model", "partition", "method", "decision", "rate"]
    assert again[keys].sort_values(keys).values.tolist() == partitions[keys].sort_values(keys).values.tolist()

"""The on-demand HTTP API (``contamray/serve/``), over real HTTP on 127.0.0.1.

One local Ray head (``ray start``, with its dashboard: the Jobs API) and one Serve application for the
module; the embedded
model in float32 (``smollm2_135m_fp32``) answers the checks. Known answers:

- a check's per-item scores and its verdict equal a batch run's (``pipeline.runner.execute``) on the
  same rows, model and methods: five ``synthetic_facts`` rows tested against five ``synthetic_structured``
  rows as another distribution (``mode: distribution``);
- a job submitted through ``/v1/jobs`` with the same selection is a run of its own (its own cell store),
  and its partitions equal the batch run's;
- security: 401 without or with a wrong token, 413 for a body or an item count above the limits, 422
  for an unknown method (listing the methods) and for overrides outside the allow-list, 403 for a model
  or benchmark outside it, 429 with Retry-After past a token's rate, JSON errors without tracebacks,
  and a server that refuses to start without a token.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import requests

from contamray.serve.config import load_settings
from contamray.serve.jobs import JobSpec, job_overrides
from contamray.serve.security import ApiError, SecurityError, TokenBucket, token_digests
from tests.ray_head import free_ports
from tests.ray_head import ray_head as local_ray_head

REPO = Path(__file__).resolve().parents[1]
TOKEN = "test-token-a-0123456789abcdef"
OTHER = "test-token-b-0123456789abcdef"  # its own rate bucket and its own jobs
MODEL = "smollm2_135m_fp32"
METHODS = ["min_k", "perplexity"]
ROWS = 5
# the batch run's selection, and the job's overrides: synthetic facts tested against synthetic_structured
# as another distribution (no held-out of the same benchmark in conf/benchmark)
REFERENCE = "{synthetic_facts: synthetic_structured}"
JOB_OVERRIDES = [f"run.limit={ROWS}"] + [
    o for m in METHODS for o in (f"methods.{m}.reference={REFERENCE}", f"methods.{m}.mode=distribution")
]
SCORES = ["score", "mean_logprob", "n_tokens", "min_k_5", "min_k_20", "min_k_60"]


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# ---------------------------------------------------------------------------------------------
# without a server


def test_no_token_refuses_to_start_unless_insecure_on_loopback() -> None:
    with pytest.raises(SecurityError, match="CONTAMRAY_API_TOKENS"):
        token_digests("127.0.0.1", insecure_local=False, environ={})
    with pytest.raises(SecurityError, match="only on 127.0.0.1"):
        token_digests("0.0.0.0", insecure_local=True, environ={})
    assert token_digests("127.0.0.1", insecure_local=True, environ={}) == ()
    with pytest.raises(SecurityError, match="shorter than"):
        token_digests("127.0.0.1", False, environ={"CONTAMRAY_API_TOKENS": "short"})
    env = dict(os.environ)
    env.pop("CONTAMRAY_API_TOKENS", None)
    env.pop("CONTAMRAY_API_TOKENS_FILE", None)
    proc = subprocess.run([sys.executable, "-m", "contamray.cli", "serve", "--host", "0.0.0.0"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no API token configured" in proc.stderr, proc.stderr


def test_tokens_file_and_rate_bucket(tmp_path: Path) -> None:
    file = tmp_path / "tokens"
    file.write_text(f"# api tokens\n{TOKEN}\n\n{OTHER}  # second\n")
    digests = token_digests("0.0.0.0", False, environ={"CONTAMRAY_API_TOKENS_FILE": str(file)})
    assert len(digests) == 2 and TOKEN not in "".join(digests)
    bucket = TokenBucket(per_minute=60, burst=2)
    assert bucket.take("a", now=0.0) == 0 and bucket.take("a", now=0.0) == 0
    assert bucket.take("a", now=0.0) == pytest.approx(1.0)  # one request a second
    assert bucket.take("b", now=0.0) == 0  # per key
    assert bucket.take("a", now=1.0) == 0


def test_app_import_path_and_cluster_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve run contamray.serve:app`` and ``deploy/serve_config.yaml`` (Serve's own schema) build the app."""
    import yaml
    from ray.serve.deployment import Application
    from ray.serve.schema import ServeDeploySchema

    import contamray.serve

    monkeypatch.setenv("CONTAMRAY_API_TOKENS", TOKEN)
    monkeypatch.setenv("CONTAMRAY_SERVE_OVERRIDES", "port=8123 limits.max_items=4")
    assert isinstance(contamray.serve.app, Application)
    config = yaml.safe_load((REPO / "deploy" / "serve_config.yaml").read_text())
    ServeDeploySchema.model_validate(config)
    (application,) = config["applications"]
    assert application["import_path"] == "contamray.serve:app_builder"
    assert isinstance(contamray.serve.app_builder(application["args"]), Application)
    settings = load_settings(values=application["args"])
    assert settings.jobs["entrypoint_resources"] == {"contamray_driver": 1} and settings.host == "0.0.0.0"
    monkeypatch.delenv("CONTAMRAY_API_TOKENS")
    with pytest.raises(SecurityError):
        contamray.serve.app_builder(application["args"])  # on 0.0.0.0 without a token: refused


def test_job_overrides_only_from_the_allow_lists(mirror_dir: Path) -> None:
    settings = load_settings([f"data.mirror_dir={mirror_dir}"])
    spec = JobSpec((MODEL,), ("synthetic_facts",), ("perplexity",), overrides=("run.limit=4",
                   "methods.perplexity.mode=distribution", "benchmarks.synthetic_facts.split=validation"))
    assert job_overrides(spec, settings)[-3:] == list(spec.overrides)

    def refused(status: int, **changes) -> str:
        with pytest.raises(ApiError) as err:
            job_overrides(JobSpec(**{**spec.__dict__, **changes}), settings)
        assert err.value.status == status, err.value.detail
        return str(err.value.detail)

    assert "llama2_7b" in refused(403, models=("llama2_7b",))
    assert "samsum" in refused(403, benchmarks=("samsum",))
    assert "min_k" in refused(422, methods=("nope",))
    assert "canary" in refused(403, experiment="canary")
    for bad in ("models.smollm2_135m_fp32.trust_remote_code=true", "models.smollm2_135m_fp32.source=/etc",
                "data.mirror_dir=/etc", "hydra.run.dir=/tmp/x", "methods.min_k.k=0.1"):  # min_k not selected
        assert "not allowed" in refused(422, overrides=(bad,))
    assert "+/~" in refused(422, overrides=("+models.x.source=gpt2",))
    assert "interpolation" in refused(422, overrides=("methods.perplexity.mode=${oc.env:HOME}",))
    assert "no paths" in refused(422, overrides=("benchmarks.synthetic_facts.split=../../etc",))
    assert "not a name" in refused(422, overrides=("benchmarks.synthetic_facts.split=..",))
    assert "limits.max_job_limit" in refused(422, overrides=("run.limit=100000",))


# ---------------------------------------------------------------------------------------------
# one server for the module


@pytest.fixture(scope="module")
def ray_head():
    """A local Ray head of our own (the Jobs API needs its dashboard)."""
    with local_ray_head(4, prefix="crsrv") as head:
        yield head.gcs


@pytest.fixture(scope="module")
def server(ray_head: str, tmp_path_factory: pytest.TempPathFactory, mirror_dir: Path):
    import ray
    from ray import serve

    from contamray.serve.api import APP_NAME, build_app

    out = tmp_path_factory.mktemp("api")
    (port,) = free_ports(1)
    settings = load_settings([
        f"port={port}", f"data.mirror_dir={mirror_dir}", f"jobs.output_root={out}", f"jobs.python={sys.executable}",
        "limits.max_body_bytes=20000", "limits.max_items=8", "limits.burst=60", "limits.requests_per_minute=60",
    ])
    app = build_app(settings, environ={"CONTAMRAY_API_TOKENS": f"{TOKEN},{OTHER}"})
    if ray.is_initialized():  # an earlier test's Ray (and its Serve) in this process: leave it first
        serve.shutdown()
        ray.shutdown()
    ray.init(address=ray_head, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(app, name=APP_NAME, route_prefix="/")
        yield {"url": f"http://127.0.0.1:{port}", "settings": settings, "out": out}
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def batch(server, ray_head: str, tmp_path_factory: pytest.TempPathFactory, mirror_dir: Path):
    """The batch pipeline on the same selection, on the same cluster (so on the same hosted model): its
    records, examples and partitions. It runs as `python -m contamray.run` in a process of its own, as a
    user's batch run would; this test process has seen other tests' Ray sessions."""
    from contamray.pipeline.plan import build_plan
    from contamray.pipeline.runner import load_benchmarks
    from contamray.validate.compose import compose_config, to_dict

    out = tmp_path_factory.mktemp("batch")
    overrides = ["+exp=base", f"model=[{MODEL}]", "benchmark=[synthetic_facts,synthetic_structured]",
                 f"method=[{','.join(METHODS)}]", f"data.mirror_dir={mirror_dir}", *JOB_OVERRIDES]
    env = dict(os.environ, RAY_ADDRESS=ray_head, RAY_AUTH_MODE="disabled")  # as the head was started
    proc = subprocess.run([sys.executable, "-m", "contamray.run", *overrides, f"hydra.run.dir={out}"], env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    plan = build_plan(to_dict(compose_config(overrides, out)))
    records, _ = load_benchmarks(plan, ["synthetic_facts"])
    return {
        "records": records["synthetic_facts"],
        "examples": pd.read_parquet(out / "examples.parquet"),
        "partitions": pd.read_parquet(out / "partitions.parquet"),
    }


@pytest.mark.slow
def test_health_docs_and_catalog_open_or_authenticated(server) -> None:
    url = server["url"]
    assert requests.get(f"{url}/healthz", timeout=30).json() == {"status": "ok"}
    assert requests.get(f"{url}/docs", timeout=30).status_code == 200
    paths = requests.get(f"{url}/openapi.json", timeout=30).json()["paths"]
    assert {"/v1/check", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/methods", "/v1/benchmarks"} <= set(paths)
    methods = requests.get(f"{url}/v1/methods", headers=auth(), timeout=60).json()
    min_k = next(m for m in methods["methods"] if m["name"] == "min_k")
    assert min_k["parameters"]["k"] == 0.2 and min_k["family"] == "closed" and "Shi et al" in min_k["citation"]
    assert min_k["parameters"]["chat"] == "both"  # the preset's value, over the Config's (the papers') default
    assert methods["models"] == list(server["settings"].allow.models)
    assert "methods.*.n_samples" in methods["check_keys"] and "run.limit" in methods["job_keys"]
    benchmarks = requests.get(f"{url}/v1/benchmarks", headers=auth(), timeout=60).json()["benchmarks"]
    facts = next(b for b in benchmarks if b["name"] == "synthetic_facts")
    assert "test" in facts["splits"] and "set1" in facts["configs"]


@pytest.mark.slow
def test_missing_or_wrong_token_is_401(server) -> None:
    url = server["url"]
    for headers in ({}, auth("not-a-token-of-this-server"), {"Authorization": f"Basic {TOKEN}"}):
        r = requests.get(f"{url}/v1/methods", headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
        assert r.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.slow
def test_limits_and_allow_lists(server) -> None:
    url = server["url"]

    def check(body: dict, token: str = TOKEN, **kw) -> requests.Response:
        return requests.post(f"{url}/v1/check", json=body, headers=auth(token), timeout=60, **kw)

    one = [{"text": "A short sentence."}]
    r = check({"model": MODEL, "methods": ["perplexity"], "items": [{"text": "x" * 30000}]})
    assert r.status_code == 413 and r.json()["error"] == "body_too_large" and "limits.max_body_bytes" in r.text
    chunked = requests.post(f"{url}/v1/check", data=iter([b'{"items": "', b"y" * 30000, b'"}']),
                            headers={**auth(), "Content-Type": "application/json"}, timeout=60)
    assert chunked.status_code == 413  # no Content-Length: counted while read
    r = check({"model": MODEL, "methods": ["perplexity"], "items": one * 9})
    assert r.status_code == 413 and r.json()["error"] == "too_many_items"
    r = check({"model": MODEL, "methods": ["perplexity", "no_such_method"], "items": one})
    assert r.status_code == 422 and r.json()["error"] == "unknown_method"
    assert r.json()["detail"]["methods"] == list(server["settings"].allow.methods)
    r = check({"model": "llama2_7b", "methods": ["perplexity"], "items": one})
    assert r.status_code == 403 and r.json()["error"] == "model_not_allowed" and MODEL in r.text
    r = check({"model": "/etc/passwd", "methods": ["perplexity"], "items": one})
    assert r.status_code == 403
    r = check({"model": MODEL, "methods": ["perplexity"], "items": one, "reference": {"benchmark": "samsum"}})
    assert r.status_code == 403 and r.json()["error"] == "benchmark_not_allowed"
    r = check({"model": MODEL, "methods": ["perplexity"], "items": one,
               "reference": {"benchmark": "synthetic_facts", "split": "../../etc"}})
    assert r.status_code == 422 and "reference.split" in r.text
    r = check({"model": MODEL, "methods": ["perplexity"], "items": one, "trust_remote_code": True})
    assert r.status_code == 422 and r.json()["error"] == "invalid_request"
    assert r.json()["detail"][0]["field"] == "body.trust_remote_code"
    r = requests.post(f"{url}/v1/check", data=b"{not json", headers={**auth(), "Content-Type": "application/json"},
                      timeout=30)
    assert r.status_code == 422 and "Traceback" not in r.text
    r = requests.get(f"{url}/v1/nowhere", headers=auth(), timeout=30)
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = requests.post(f"{url}/v1/jobs", headers=auth(), timeout=60, json={
        "models": [MODEL], "benchmarks": ["synthetic_facts"], "methods": ["perplexity"],
        "overrides": ["models.smollm2_135m_fp32.trust_remote_code=true"]})
    assert r.status_code == 422 and r.json()["error"] == "override_not_allowed"
    # a check's overrides: a method's own parameters only, of a method the check names, with a plain value
    for bad in ("models.smollm2_135m_fp32.source=/etc", "run.limit=3", "methods.min_k.k=0.1", "data.mirror_dir=/x"):
        r = check({"model": MODEL, "methods": ["perplexity"], "items": one, "overrides": [bad]})
        assert r.status_code == 422 and r.json()["error"] == "override_not_allowed", (bad, r.text)
        assert "methods.*.n_samples" in r.json()["detail"]["allowed_keys"]
    r = check({"model": MODEL, "methods": ["cdd"], "items": one, "overrides": ["methods.cdd.n_samples=${oc.env:HOME}"]})
    assert r.status_code == 422 and "interpolation" in r.text
    r = check({"model": MODEL, "methods": ["perplexity"], "items": one, "overrides": ["methods.perplexity.k=0.2"]})
    assert r.status_code == 422 and r.json()["error"] == "invalid_config" and "methods.perplexity" in r.text, r.text
    r = check({"model": MODEL, "methods": ["cdd"], "items": one, "overrides": ["methods.cdd.n_samples=0"]})
    assert r.status_code == 422 and "n_samples" in r.text, r.text
    r = requests.get(f"{url}/v1/jobs/contamray-api-000000000000", headers=auth(), timeout=60)
    assert r.status_code == 404 and r.json()["error"] == "job_not_found"


@pytest.mark.slow
def test_rate_limit_is_429_with_retry_after(server) -> None:
    url = server["url"]
    codes = []
    for _ in range(80):  # burst 60, then one a second
        r = requests.get(f"{url}/v1/benchmarks", headers=auth(OTHER), timeout=30)
        codes.append(r.status_code)
        if r.status_code == 429:
            assert int(r.headers["Retry-After"]) >= 1 and r.json()["error"] == "rate_limited"
            break
    assert codes[-1] == 429 and set(codes[:-1]) == {200}, codes
    assert requests.get(f"{url}/v1/benchmarks", headers=auth(), timeout=30).status_code == 200  # other token


@pytest.mark.slow
def test_check_scores_equal_the_batch_pipeline(server, batch) -> None:
    records = batch["records"]
    assert len(records) == ROWS
    body = {
        "model": MODEL, "methods": METHODS, "benchmark": "synthetic_facts",
        "items": [{"text": r.input, "label": r.label, "id": r.id} for r in records],
        "reference": {"benchmark": "synthetic_structured", "rows": ROWS},
    }
    started = time.perf_counter()
    r = requests.post(f"{server['url']}/v1/check", json=body, headers=auth(), timeout=600)
    assert r.status_code == 200, r.text
    result = r.json()
    assert time.perf_counter() - started < 600
    assert result["reference"]["rows"] == ROWS and result["reference"]["adapter"] == "synthetic_structured"
    # the items are named for the reference's split (a prompt naming the split asks both sides alike)
    assert result["partition"] == "synthetic_facts/api/" + result["reference"]["partition"].rsplit("/", 1)[1]
    examples = batch["examples"]
    partitions = batch["partitions"]
    for entry in result["methods"]:
        method = entry["method"]
        assert entry["comparison"] == "distribution"
        mine = pd.DataFrame(entry["items"]).set_index("record_id")
        theirs = examples[(examples["method"] == method) & examples["partition"].str.startswith("synthetic_facts")]
        theirs = theirs.set_index("record_id").loc[[r.id for r in records]]
        assert (mine["error"] == "").all()
        for column in [c for c in SCORES if c in mine.columns]:
            assert mine.loc[theirs.index, column].tolist() == pytest.approx(theirs[column].tolist(), rel=1e-6,
                                                                            abs=1e-6), (method, column)
        verdict = entry["verdict"]
        row = partitions[(partitions["method"] == method)
                         & partitions["partition"].str.startswith("synthetic_facts")].iloc[0]
        assert verdict["statistic"] == pytest.approx(row["statistic"], rel=1e-6)
        assert verdict["p_value"] == pytest.approx(row["p_value"], rel=1e-6)
        assert (verdict["decision"], verdict["n_examples"]) == (row["decision"], row["n_examples"])
        assert "distribution comparison" in verdict["details"]["summary"]
    # the batch run's reference partition is the yardstick, not a question: not tested, and says of what
    yardsticks = partitions[partitions["partition"].str.startswith("synthetic_structured")]
    assert sorted(yardsticks["method"]) == sorted(METHODS), yardsticks[["method", "decision"]]
    assert (yardsticks["decision"] == "not_applicable").all() and yardsticks["p_value"].isna().all()
    assert yardsticks["reason"].str.contains("the held-out reference of synthetic_facts for").all()
    assert (yardsticks["n_examples"] == ROWS).all()  # its rows were scored: the partitions it serves need them


@pytest.mark.slow
def test_black_box_methods_answer_per_item_over_http(server, mirror_dir: Path) -> None:
    """TS-Guessing (both variants), DCQ and CDD on an ARC item, name cloze on an XSum passage: each item gets
    its row, scored (the probe answered) or with the method's reason to leave it out; none fails. CDD asked
    through the check's ``overrides`` for 10 samples of 24 tokens (the paper's 50 of 100 take minutes on a CPU
    replica): the item's row says it was scored on 10."""
    from contamray.benchmarks import load_records

    def check(benchmark: str, methods: list[str], items: list[dict], overrides: tuple[str, ...] = ()) -> list[dict]:
        body = {"model": MODEL, "methods": methods, "benchmark": benchmark, "items": items,
                "overrides": list(overrides)}
        r = requests.post(f"{server['url']}/v1/check", json=body, headers=auth(), timeout=900)
        assert r.status_code == 200, r.text
        # no reference: the items are named for their benchmark's split (what DCQ's and guided prompting's
        # prompts name), not "items"
        assert r.json()["partition"] == f"{benchmark}/api/test", r.json()["partition"]
        return r.json()["methods"]

    (arc,) = load_records("arc_challenge", n=1, mirror_dir=mirror_dir).records
    item = {"id": arc.id, "text": arc.input, "choices": list(arc.choices), "label": arc.label}  # label: the answer
    entries = check("arc_challenge", ["ts_guessing", "ts_guessing_mc", "dcq", "cdd"], [item],
                    ("methods.cdd.n_samples=10", "methods.cdd.max_tokens=24"))
    (xsum,) = load_records("xsum", n=1, mirror_dir=mirror_dir).records
    entries += check("xsum", ["name_cloze"], [{"id": xsum.id, "text": xsum.input}])
    assert [e["method"] for e in entries] == ["ts_guessing", "ts_guessing_mc", "dcq", "cdd", "name_cloze"]
    scored = {"cdd": "peakedness", "dcq": "score"}
    for entry in entries:
        (row,) = entry["items"]
        assert row["error"] == "", (entry["method"], row)
        if entry["method"] in ("ts_guessing_mc", "cdd", "name_cloze"):  # this item is asked, not left out
            assert not row.get("filtered"), (entry["method"], row)
        if not row.get("filtered"):
            assert 0.0 <= row[scored.get(entry["method"], "exact_match")] <= 1.0, (entry["method"], row)
        assert entry["verdict"]["decision"] == "inconclusive"  # one item, no reference partition
    (cdd,) = [e["items"][0] for e in entries if e["method"] == "cdd"]
    assert cdd["n_samples"] == 10 and cdd["greedy_tokens"] <= 24, cdd  # the check's overrides, not the paper's


@pytest.mark.slow
def test_job_results_equal_a_batch_run(server, batch) -> None:
    url = server["url"]
    body = {"models": [MODEL], "benchmarks": ["synthetic_facts", "synthetic_structured"], "methods": METHODS,
            "overrides": JOB_OVERRIDES}
    r = requests.post(f"{url}/v1/jobs", json=body, headers=auth(), timeout=120)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["cells_total"] == 4 and job["output_dir"].startswith(str(server["out"]))
    other = requests.get(f"{url}/v1/jobs/{job['job_id']}", headers=auth(OTHER), timeout=60)
    assert other.status_code == 404  # a job is its submitter's
    deadline = time.time() + 900
    seen = []
    while time.time() < deadline:
        status = requests.get(f"{url}/v1/jobs/{job['job_id']}", headers=auth(), timeout=120).json()
        seen.append((status["status"], status["progress"]["cells_done"]))
        if status["status"] in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(3)
    assert status["status"] == "SUCCEEDED", (status, seen)
    assert status["progress"] == {"cells_done": 4, "cells_total": 4}
    assert all(done in (None, 0, 1, 2, 3, 4) for _, done in seen)
    mine = pd.DataFrame(status["results"]).set_index(["model", "partition", "method"]).sort_index()
    theirs = batch["partitions"].set_index(["model", "partition", "method"]).sort_index()
    assert mine.index.tolist() == theirs.index.tolist()
    for column in ("decision", "n_examples", "n_failed", "reason"):
        assert mine[column].tolist() == theirs[column].tolist(), column
    for column in ("statistic", "p_value"):
        for a, b in zip(mine[column], theirs[column]):
            assert (a is None or (isinstance(a, float) and math.isnan(a))) == pd.isna(b) or a == pytest.approx(b)
            if not pd.isna(b):
                assert a == pytest.approx(float(b), rel=1e-6)
    assert (Path(job["output_dir"]) / "partitions.parquet").is_file()
    assert (server["out"] / "cells").is_dir()  # the shared cell store of every job

"""Models hosted as Ray Serve deployments (``contamray/serve/hosting.py``), on a real local Ray.

- A run of two target models sharing one judge and one reference model loads each of the four models
  exactly once: every Serve replica ever started is read back from Ray's state API (dead ones too).
  The two targets, needed at once by their first stages, load side by side (their deployments overlap), and each
  target and the reference model its first stage asks answer side by side; on a cluster without room for both
  they are asked one after the other, with the same scores.
- A deployment kept up by a run (``serve.keep``) is reused by the next run of the same model spec
  (``serve.reuse``): no new replica.
- A replica killed mid-run (by its actor id) is replaced by Serve, the batches it held are sent again,
  and the run's scores and verdicts equal those of the undisturbed run.
- A model asked for while the only resources are held by another model busy in a stage (a zoo's targets, each in
  its thread, on a cluster that fits one at a time) waits for that stage to end and takes its place.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import ray
from ray import serve
from ray.util.state import list_actors

from contamray.run import run
from contamray.serve.command import NoProxyError
from contamray.serve.command import start as start_api
from contamray.serve.config import load_settings
from contamray.serve.hosting import HOSTS, running_apps
from tests.test_config import composed

FP32 = "source:smollm2-135m,backend:hf,dtype:float32"
STATE: dict[str, str] = {}


@pytest.fixture(scope="module")
def roomy_ray():
    """A local Ray with room for four CPU replicas plus a scorer (logical CPUs), alone in this module."""
    if ray.is_initialized():
        ray.shutdown()
    context = ray.init(num_cpus=6, include_dashboard=True, log_to_driver=False)
    STATE["address"] = f"http://{context.dashboard_url}"  # this Ray's, whatever else runs on the machine
    yield
    serve.shutdown()
    ray.shutdown()


def replica_starts() -> Counter:
    """Serve replicas ever started per engine application (alive or dead)."""
    actors = list_actors(address=STATE["address"], detail=False, limit=10_000, raise_on_missing_output=False)
    return Counter(a.class_name for a in actors if (a.class_name or "").startswith("ServeReplica:contamray-"))


def deploy_windows(records: list) -> dict[str, tuple[float, float]]:
    """(started, up) times of every deployment a run's log reports, by Serve application."""
    def times(pattern: str) -> dict[str, float]:
        return {m.group(1): r.created for r in records if (m := re.search(pattern, r.getMessage()))}

    started, up = times(r"as Serve application (\S+)"), times(r"deployment (\S+) up in")
    return {app: (started[app], up[app]) for app in started if app in up}


def test_two_targets_share_one_judge_and_one_reference_model_each_loaded_once(roomy_ray, tmp_path, mirror_dir, caplog):
    caplog.set_level(logging.INFO, logger="contamray")
    before = replica_starts()
    cfg = composed(
        "model=[smollm2_135m_fp32,smollm2_135m]", "models.smollm2_135m.dtype=float32",
        "models.smollm2_135m.batch_size=8", "benchmark=[synthetic_facts]", "run.limit=4", "corpus=none",
        "method=[guided_prompting,reference_ratio]", "methods.guided_prompting.max_tokens=6",
        "methods.guided_prompting.judge=true", "methods.guided_prompting.self_judge=true",
        f"judge={{{FP32},batch_size:4}}", f"reference_model={{{FP32},batch_size:2}}", f"data.mirror_dir={mirror_dir}",
    )  # fmt: skip
    cfg.run.output_dir = str(tmp_path / "zoo")
    run(cfg)
    # the run reaches its deployments through handles: Serve started without an HTTP proxy (one would take port
    # 8000, and on a busy machine could miss its readiness checks and fail the run)
    actors = list_actors(address=STATE["address"], detail=False, limit=10_000, raise_on_missing_output=False)
    assert not [a for a in actors if a.class_name == "ProxyActor"] and not serve.status().proxies
    # so the on-demand API cannot open its port through this Serve instance: it says so instead of serving nowhere
    with pytest.raises(NoProxyError, match="without an HTTP proxy .* Start the API before runs"):
        start_api(load_settings(["insecure_local=true", "port=8123"]), app=None)
    # (the one embedded model plays all four parts, each its own spec: self_judge acknowledges that the
    # judge has the targets' weights)
    started = replica_starts() - before
    # two targets, one judge, one reference model: four deployments, one replica start each
    assert len(started) == 4 and set(started.values()) == {1}, started
    # the two targets' first stages need them at once, and the cluster has room: they load side by side
    windows = sorted(deploy_windows(caplog.records).values())
    assert any(b_start < a_up for (_, a_up), (b_start, _) in zip(windows, windows[1:], strict=False)), windows
    # each target's first stage asks it and the reference model (the reference-model ratio): with room for both,
    # they answer side by side, not one after the other
    messages = [r.getMessage() for r in caplog.records]
    for target in ("smollm2_135m_fp32", "smollm2_135m"):
        side = f"model {target} stage 0: models {target}, reference_model answer side by side"
        assert side in messages, [m for m in messages if "side by side" in m]
    partitions = pd.read_parquet(tmp_path / "zoo" / "partitions.parquet")
    assert set(partitions["model"]) == {"smollm2_135m_fp32", "smollm2_135m"}
    assert not running_apps()  # the run deleted what it deployed (serve.keep is false)


def test_a_stage_whose_models_cannot_be_up_together_asks_them_one_after_the_other(
    roomy_ray, tmp_path, mirror_dir, caplog
):
    """A target and its reference model of 4 CPUs each on 6: one at a time, the idle one deleted to make room for
    the other (asked side by side, the second would wait for resources the first holds until the stage ends). The
    scores equal those of the same models asked side by side (1 CPU each)."""
    caplog.set_level(logging.INFO, logger="contamray")
    common = (
        "model=[smollm2_135m_fp32]", "benchmark=[synthetic_facts]", "run.limit=6", "corpus=none",
        "method=[reference_ratio]", f"data.mirror_dir={mirror_dir}",
    )  # fmt: skip
    outs = {}
    for cpus in (4, 1):
        caplog.clear()
        cpu_keys = (f"models.smollm2_135m_fp32.num_cpus={cpus}", f"reference_model={{{FP32},num_cpus:{cpus}}}")
        cfg = composed(*common, *cpu_keys)
        cfg.run.output_dir = outs[cpus] = str(tmp_path / f"cpus{cpus}")
        run(cfg)
        messages = [r.getMessage() for r in caplog.records]
        side_by_side = [m for m in messages if "answer side by side" in m]
        if cpus == 4:
            assert not side_by_side, side_by_side
            assert any("deleting its idle deployment" in m for m in messages), messages
        else:
            assert side_by_side, messages
    tight, roomy = (_scores(Path(outs[c])) for c in (4, 1))
    pd.testing.assert_frame_equal(tight[0], roomy[0])
    pd.testing.assert_frame_equal(tight[1], roomy[1])
    assert not running_apps()


def _scores(out) -> tuple[pd.DataFrame, pd.DataFrame]:
    examples = pd.read_parquet(out / "examples.parquet")
    keep = [c for c in examples.columns if c in ("record_id", "method", "score", "mean_logprob", "error")]
    partitions = pd.read_parquet(out / "partitions.parquet")[["method", "statistic", "p_value", "decision"]]
    return examples[keep].sort_values(["method", "record_id"]).reset_index(drop=True), partitions


def test_a_kept_deployment_is_reused_and_a_killed_replica_is_replaced(roomy_ray, tmp_path, mirror_dir):
    overrides = (
        "model=[smollm2_135m_fp32]", "benchmark=[synthetic_facts]", "run.limit=16", "corpus=none",
        "method=[perplexity,min_k]", "ray.request_batch_size=2", f"data.mirror_dir={mirror_dir}",
    )  # fmt: skip
    before = replica_starts()  # replicas of the same spec an earlier test started (and deleted) stay listed
    first = composed(*overrides, "serve.keep=true")
    first.run.output_dir = str(tmp_path / "undisturbed")
    run(first)
    (app,) = running_apps()  # kept up for the next run
    name = f"ServeReplica:{app}:engine"
    assert replica_starts()[name] - before[name] == 1

    killed: list[str] = []

    def kill_mid_pass() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            hosted = HOSTS.apps.get(app)
            if hosted is not None and hosted.busy > 0:
                time.sleep(0.5)  # a few batches in
                (replica,) = list_actors(
                    address=STATE["address"], filters=[("class_name", "=", name), ("state", "=", "ALIVE")]
                )
                ray.kill(ray.get_actor(replica.name, namespace="serve"))
                killed.append(replica.actor_id)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_mid_pass)
    killer.start()
    second = composed(*overrides)
    second.run.output_dir = str(tmp_path / "disturbed")
    run(second)
    killer.join()
    assert killed, "the pass ended before the replica could be killed"
    # the reused replica (no new load until it was killed) and its replacement
    assert replica_starts()[name] - before[name] == 2
    undisturbed, disturbed = _scores(tmp_path / "undisturbed"), _scores(tmp_path / "disturbed")
    pd.testing.assert_frame_equal(undisturbed[0], disturbed[0])
    pd.testing.assert_frame_equal(undisturbed[1], disturbed[1])
    assert app in running_apps()  # reused, not deployed by the second run: left for its owner
    serve.delete(app)


def test_a_vllm_replica_answers_a_run_as_transformers_does(roomy_ray, tmp_path, mirror_dir):
    """The GPU path on this CPU: the target on ``backend: vllm`` (vLLM's CPU build) runs as a Serve
    replica with vLLM's async engine (``streaming``), two batches in flight; its per-example scores equal
    the transformers replica's within the engines' per-token tolerance, and the verdicts are the same.
    ~1.5 min: vLLM start-up in the replica."""
    pytest.importorskip("vllm")
    overrides = (
        "model=[smollm2_135m_fp32]", "benchmark=[synthetic_facts]", "run.limit=12", "corpus=none",
        "method=[perplexity]", "ray.request_batch_size=3", "models.smollm2_135m_fp32.max_model_len=1024",
        "methods.perplexity.context_len=512", "methods.perplexity.stride=256",
        f"data.mirror_dir={mirror_dir}",
    )  # fmt: skip
    results = {}
    for backend in ("hf", "vllm"):
        cfg = composed(*overrides, f"models.smollm2_135m_fp32.backend={backend}")
        cfg.run.output_dir = str(tmp_path / backend)
        run(cfg)
        results[backend] = _scores(tmp_path / backend)
    hf, vllm = results["hf"], results["vllm"]
    assert (hf[0]["error"] == "").all() and (vllm[0]["error"] == "").all()
    assert list(hf[0]["record_id"]) == list(vllm[0]["record_id"])
    assert (hf[0]["score"] - vllm[0]["score"]).abs().max() <= 1e-3  # a mean of per-token log-probabilities
    assert list(hf[1]["decision"]) == list(vllm[1]["decision"])


def test_a_stopped_run_stops_waiting_for_a_deployment_and_deletes_it(roomy_ray):
    """Ctrl-C while a model's deployment cannot come up (``num_gpus: 1`` on this CPU-only Ray): the wait ends at
    once - it used to last ``serve.deploy_timeout_s`` (30 minutes by default) - with ``RunInterrupted``, and the
    application is deleted (nothing of the stopped run holds resources)."""
    from contamray.interrupts import RunInterrupted
    from contamray.pipeline.plan import ModelPlan
    from contamray.serve.hosting import Hosts

    pool = ModelPlan(name="big", engine={"source": "smollm2-135m", "backend": "hf", "dtype": "float32"},
                     num_gpus=1.0, num_cpus=1.0)  # fmt: skip
    stopping, raised = threading.Event(), []

    def wait() -> None:
        try:
            with Hosts().use("run", pool, {"deploy_timeout_s": 1800}, {}, stopping):
                pass
        except RunInterrupted as err:
            raised.append(err)

    def deploying() -> bool:
        try:
            return any(a.startswith("contamray-") for a in serve.status().applications)
        except Exception:  # noqa: BLE001 - Serve not started yet
            return False

    waiter = threading.Thread(target=wait)
    waiter.start()
    gone = time.monotonic() + 60
    while not deploying():
        assert time.monotonic() < gone, "the deployment never started"
        time.sleep(0.2)
    stopping.set()
    waiter.join(timeout=120)
    assert not waiter.is_alive() and len(raised) == 1 and "the run was stopped" in str(raised[0])
    while deploying():
        assert time.monotonic() < gone + 60, serve.status().applications
        time.sleep(0.5)


def test_a_deployment_waits_for_a_busy_model_to_end_its_stage_instead_of_timing_out(roomy_ray, caplog):
    """Two models of 4 CPUs on this 6-CPU Ray, each asked for by a thread of its own (a zoo's targets run
    concurrently): the second, asked for while the first is busy in a stage, waits for that stage to end, deletes the
    first then and comes up. It used to start at once and wait for resources nothing freed (the first was never idle
    when a deployment made room) until ``serve.deploy_timeout_s`` stopped the run - 40 s here, far more than the
    first's stage and the second's load take."""
    from contamray.pipeline.plan import ModelPlan
    from contamray.serve.hosting import Hosts, app_name

    caplog.set_level(logging.INFO, logger="contamray")
    first, second = (ModelPlan(name=name, engine={"source": "smollm2-135m", "backend": "hf", "dtype": "float32",
                                                  "batch_size": size}, num_cpus=4.0)
                     for name, size in (("first", 2), ("second", 4)))  # fmt: skip
    hosts, serve_cfg = Hosts(), {"deploy_timeout_s": 40}
    busy, stage_ended, errors = threading.Event(), [], []

    def stage() -> None:  # the first model's stage: it holds the model busy for 8 s
        try:
            with hosts.use("run1", first, serve_cfg, {}):
                busy.set()
                time.sleep(8)
                stage_ended.append(time.monotonic())
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)
            busy.set()

    thread = threading.Thread(target=stage)
    thread.start()
    assert busy.wait(timeout=120)
    try:
        with hosts.use("run2", second, serve_cfg, {}) as app:
            up = time.monotonic()
            assert app in running_apps() and app_name(first) not in running_apps()
    finally:
        thread.join(timeout=120)
        hosts.release("run1", keep=False)
        hosts.release("run2", keep=False)
    assert not errors and stage_ended and up > stage_ended[0]
    messages = [r.getMessage() for r in caplog.records]
    assert any("model second: waiting for room" in m and "model(s) first hold it in a stage" in m for m in messages)
    assert any("model first: deleting its idle deployment" in m for m in messages), messages
    assert not running_apps()


def test_a_model_no_node_can_host_stops_with_an_error_naming_it(roomy_ray, caplog):
    """``num_gpus: 1`` on this CPU-only Ray: the replica can never be scheduled. Within
    ``serve.deploy_timeout_s`` the deployment says why it waits; then it is deleted and the error names the
    model, what a replica asks for and the settings to change (before, ``serve.run`` waited forever)."""
    from contamray.pipeline.plan import ModelPlan
    from contamray.serve.hosting import Hosts

    pool = ModelPlan(name="big", engine={"source": "smollm2-135m", "backend": "hf", "dtype": "float32"},
                     num_gpus=1.0, num_cpus=1.0)  # fmt: skip
    hosts = Hosts()
    with pytest.raises(RuntimeError, match=r"model big: its Serve deployment was not up after 10 s") as err:
        hosts.hold("run", pool, {"deploy_timeout_s": 10}, {})
    assert "'num_gpus': 1.0" in str(err.value) and "models.big.num_gpus" in str(err.value)
    assert "serve.deploy_timeout_s" in str(err.value)
    _wait_gone = time.monotonic() + 60
    while running_apps() or any(a.startswith("contamray-") for a in serve.status().applications):
        assert time.monotonic() < _wait_gone, serve.status().applications
        time.sleep(0.5)

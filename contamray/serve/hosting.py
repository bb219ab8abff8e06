"""Models hosted once, as Ray Serve deployments, shared by every stage of a run and by the on-demand API.

One Serve *application* per model spec hosts the model: a deployment of ``EngineReplica`` with
``concurrency`` replicas, each with the model's ``num_gpus`` / ``num_cpus`` (and ``accelerator_type`` and
custom ``resources`` when the model config names them). Its name is ``contamray-<digest>``, the digest of
the engine spec and its resources, so two models of a run with the same spec (the canary's target serving as its own
open-data judge, a judge shared by a zoo of targets) are one deployment, and a deployment left up by
an earlier run or by ``contamray serve`` is found again (``serve.reuse``).

Batch stages reach a replica through the application's ``DeploymentHandle`` (``EnginePool.answer`` in
``contamray.pipeline.engine_pool``), with ``ray.batches_in_flight`` batches per replica: the next batch
is already at the replica while it computes (batches that arrive together are answered in one engine
call, on a thread, so the replica's event loop stays free for Serve's health checks and the next ones).

``Hosts`` is the process's registry of what it deployed. A run holds its models from their first use to
its end (``Hosts.hold`` / ``Hosts.release``): each model loads once per run. It deletes what it
deployed when the last run holding it ends, unless ``serve.keep`` is set (the deployment then outlives
the run, for the next run or the API to reuse). When the cluster has not the resources for a model the
run needs (a CPU machine hosting a target, a judge and a reference model), the least recently used
model no stage is using is deleted first (and reloaded if a later stage needs it, logged as such): a run
never waits on resources its own idle models hold. When only models busy in a stage hold them (a zoo's targets
run concurrently, each in its own thread, on a cluster that fits one of them at a time), the deployment waits
for one of them to finish its stage and deletes it then, instead of starting at once and waiting for
resources nobody frees until ``serve.deploy_timeout_s`` stops the run. ``make_room`` also makes way for the
CPU scoring actors (those do not wait for busy models: Ray queues them until resources free).

A replica that dies (out of memory, a lost node, killed) is replaced by Serve; the batches it held are
sent again (``EnginePool.answer``), and answers do not depend on which replica computed them (greedy
decoding, per-request seeds). A replica that cannot start is tried again by Serve (3 times a replica) before
the deployment is called failed and the run stops naming the model and the engine's error; a checkpoint whose
files cannot make the model (``engines.checkpoint_files.CheckpointError``) fails every try alike, so the run
stops at its first failed start.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ray import serve
from ray.serve.schema import ApplicationStatus

from contamray.engines.checkpoint_files import CheckpointError
from contamray.engines.wire import Request
from contamray.interrupts import RunInterrupted
from contamray.pipeline.plan import RESULTS_VERSION, ModelPlan
from contamray.serve.router_loop import forget_shared_clients

log = logging.getLogger("contamray")

APP_PREFIX = "contamray-"
DEPLOYMENT = "engine"
# Serve replaces a replica whose health check fails; a replica answers on a thread, so its loop stays
# responsive, but a model's first load on a busy CPU node can take minutes.
HEALTH_CHECK_PERIOD_S = 10.0
HEALTH_CHECK_TIMEOUT_S = 120.0
RESOURCE_WAIT_S = 30.0  # how long to wait for freed resources to show after deleting a deployment
MERGE_BATCHES = 8  # batches arriving together at a replica taken together (answered one by one, in one thread)
MERGE_WAIT_S = 0.005  # how long a batch waits for others to join it
DEPLOY_TIMEOUT_S = 1800.0  # serve.deploy_timeout_s: a replica not up by then (no resources) stops the run
WAIT_LOG_S = 30.0  # how often a deployment that is not up yet says why
STATUS_POLL_S = 0.5  # how often a deployment that is not up yet is looked at
# in a replica's start error, a failure no retry can mend (``engines.checkpoint_files.CheckpointError``)
PERMANENT = f"{CheckpointError.__name__}: "
PLACE_WAIT_S = 10.0  # how long a deployment just started may take to show its replicas' resources as taken


class EngineReplica:
    """One replica of a model: builds the engine once, answers batches of requests (JSON rows).

    A vLLM engine is built streaming (vLLM's async engine, ``engines/vllm.py``): every batch that
    arrives is answered at once on its own thread, and its requests join the engine's running batch
    (continuous batching), so the ``ray.batches_in_flight`` batches a stage keeps per replica, and API
    checks beside them, are all in the engine together. Transformers has no such engine: batches that
    arrive together (a stage's next ones, several API checks at once) are taken together (``serve.batch``:
    up to ``MERGE_BATCHES`` of them, waiting at most ``MERGE_WAIT_S`` for company) and answered one after
    another on one engine thread, each batch its own engine call: merged into one call, the same texts
    would be scored in batches that depend on timing, and a forward pass's last bits depend on its batch
    (the same config gives the same bytes only if a batch's answers do not depend on its neighbours).
    Either way the engine runs on threads: the event loop stays free for health checks.
    """

    def __init__(self, engine_spec: dict[str, Any], model: str, threads: int | None = None) -> None:
        from contamray.engines import EngineSpec, build_engine

        if threads:  # more compute threads than the CPUs the replica reserves (``models.<name>.threads``)
            import torch

            torch.set_num_threads(threads)
        started = time.perf_counter()
        self.engine = build_engine(EngineSpec(**engine_spec), streaming=True)
        self.model = model
        log.info("engine replica of %s loaded in %.1f s", model, time.perf_counter() - started)

    async def answer(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        """``batch``: columns ``cell`` and ``request`` (JSON rows); returns ``cell`` and ``output`` (JSON)."""
        rows = list(batch["request"])
        if getattr(self.engine, "concurrent", False):  # streaming engine: no merging, no waiting in line
            outputs = await asyncio.to_thread(_answer_rows, self.engine, rows)
        else:
            outputs = await self._answer_together(rows)
        return {"cell": list(batch["cell"]), "output": outputs}

    @serve.batch(max_batch_size=MERGE_BATCHES, batch_wait_timeout_s=MERGE_WAIT_S)
    async def _answer_together(self, batches: list[list[str]]) -> list[list[str]]:
        # each batch its own engine call: a forward pass's last bits depend on the batch it runs in, so a
        # batch merged with whatever else arrived at the same time would score the same texts differently
        # from run to run (timing decides what arrives together)
        return await asyncio.to_thread(lambda: [_answer_rows(self.engine, batch) for batch in batches])


def _answer_rows(engine: Any, rows: list[str]) -> list[str]:
    """JSON request rows -> JSON output rows, answered on ``engine``."""
    from contamray.pipeline.actors import answer_requests

    outputs = answer_requests(engine, [Request.from_row(json.loads(r)) for r in rows])
    return [json.dumps(o.to_row()) for o in outputs]


def app_name(pool: ModelPlan) -> str:
    """The Serve application hosting ``pool``'s model: a digest of what makes two hosts interchangeable
    (the engine spec and the replicas' resources), not of the model's name in this run."""
    return APP_PREFIX + _digest(_host_spec(pool))


def answers_key(pool: ModelPlan) -> str:
    """What decides the answers of ``pool``'s model to a batch of requests: ``app_name``'s spec without the replica
    count and custom resources (the engine spec, checkpoint files, the device and threads a replica computes on), so
    the batches a run on one replica answered serve a re-run on two (``pipeline/answers.py``), with the results
    version, as the cells' hashes (an engine changed in the code answers otherwise)."""
    spec = {k: v for k, v in _host_spec(pool).items() if k not in ("concurrency", "resources")}
    return _digest({"results": RESULTS_VERSION, **spec})


def _host_spec(pool: ModelPlan) -> dict[str, Any]:
    return {
        "engine": pool.engine,
        "num_gpus": pool.num_gpus,
        "num_cpus": pool.num_cpus,
        "concurrency": pool.concurrency,
        "accelerator_type": pool.accelerator_type,
        **({"resources": pool.resources} if pool.resources else {}),  # names of earlier specs unchanged
        **({"threads": pool.threads} if pool.threads else {}),
        **({"files": pool.files} if pool.files else {}),  # a local checkpoint retrained in place is another model
    }


def _digest(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def replica_options(pool: ModelPlan) -> dict[str, Any]:
    """Ray actor options of one replica of ``pool``."""
    options: dict[str, Any] = {"num_cpus": pool.num_cpus, "num_gpus": pool.num_gpus}
    if pool.accelerator_type:
        options["accelerator_type"] = pool.accelerator_type
    if pool.resources:
        options["resources"] = dict(pool.resources)
    return options


def running_apps() -> set[str]:
    """Names of the contamray engine applications up and running on the cluster."""
    try:
        status = serve.status()
    except Exception:  # noqa: BLE001 - no Serve instance yet: nothing is running
        return set()
    return {
        name for name, app in status.applications.items() if name.startswith(APP_PREFIX) and app.status == "RUNNING"
    }


def start_serve() -> None:
    """Connect to the cluster's Serve instance, starting one without HTTP proxies if there is none.

    A run talks to its deployments through handles; an HTTP proxy would take port 8000 and, on a busy machine, can
    miss its readiness checks and fail the run's first deployment. ``serve.start`` connects to a running instance
    (the on-demand API's, with its proxies) and starts one only when there is none. (``serve.status()`` is no test:
    with no instance it answers an empty status, and the first ``serve.run`` then started Serve with a proxy.)"""
    serve.start(proxy_location="Disabled")


@dataclass
class Hosted:
    """What the registry knows of one application."""

    app: str
    pool: ModelPlan
    created: bool  # deployed by this process (it may delete it); False when reused
    holders: set[str] = field(default_factory=set)  # runs holding it
    busy: int = 0  # passes using it right now
    last_used: float = 0.0
    ready: threading.Event = field(default_factory=threading.Event)  # up (or its deployment failed: ``error``)
    error: BaseException | None = None
    placed: bool = True  # its replicas hold their resources (a deployment just started may not show yet)
    since: float = 0.0  # when its deployment started (perf_counter)

    def wait(self) -> None:
        """Until the application is up; a deployment that failed raises its error (in every waiting run)."""
        self.ready.wait()
        if self.error is not None:
            raise DeployError(str(self.error)) from self.error


@dataclass
class Hosts:
    """The engine applications this process uses; one registry per process (``HOSTS``).

    Deployments start under ``deploy_lock`` (what to evict, what to deploy) and load outside it, so the
    models of a run (a zoo's targets, a judge, a reference model) load side by side when the cluster has
    room for them: a run's start-up is its slowest model's load, not the sum of them all. A stage that
    needs a model another stage is deploying waits for that deployment (``Hosted.wait``).
    """

    apps: dict[str, Hosted] = field(default_factory=dict)
    loads: dict[str, int] = field(default_factory=dict)  # deployments made by this process, per application
    session: str = ""  # the Ray session the applications live in
    deploy_lock: threading.RLock = field(default_factory=threading.RLock)
    count_lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self, run: str, pool: ModelPlan, serve_cfg: dict[str, Any], ray_cfg: dict[str, Any]) -> str:
        """The application of ``pool``, up (deployed if it is not); ``run`` holds it until ``release``."""
        with self.deploy_lock:
            hosted, deploying = self._claim(run, pool, serve_cfg, ray_cfg)
        self._until_up(hosted, deploying, serve_cfg)
        return hosted.app

    def _claim(
        self,
        run: str,
        pool: ModelPlan,
        serve_cfg: dict[str, Any],
        ray_cfg: dict[str, Any],
        stopping: threading.Event | None = None,
    ) -> tuple[Hosted, bool]:
        """(``pool``'s application, held by ``run``; whether this call started its deployment - the caller
        then waits for it: ``_until_up``). Under ``deploy_lock``."""
        app = app_name(pool)
        self._follow_session()
        hosted = self.apps.get(app)
        deploying = False
        if hosted is None or (hosted.ready.is_set() and app not in running_apps()):
            hosted, deploying = self._start(app, pool, serve_cfg, ray_cfg, reuse=hosted is None, stopping=stopping)
        hosted.holders.add(run)
        return hosted, deploying

    def _until_up(
        self, hosted: Hosted, deploying: bool, serve_cfg: dict[str, Any], stopping: threading.Event | None = None
    ) -> None:
        """Wait for ``hosted`` to be up: the caller that started its deployment polls Serve (outside the
        deploy lock, so other models deploy meanwhile), every other caller waits for it."""
        if not deploying:
            hosted.wait()
            return
        try:
            _wait_running(hosted.app, hosted.pool, float(serve_cfg.get("deploy_timeout_s", DEPLOY_TIMEOUT_S)),
                          stopping)  # fmt: skip
        except BaseException as err:
            hosted.error = err
            with self.count_lock:
                if self.apps.get(hosted.app) is hosted:
                    del self.apps[hosted.app]
            raise
        finally:
            hosted.placed = True
            hosted.ready.set()
        took = time.perf_counter() - hosted.since
        log.info("model %s: deployment %s up in %.1f s", hosted.pool.name, hosted.app, took)

    def _follow_session(self) -> None:
        """Forget what was known of another Ray session's Serve (a process that shut Ray down and joined or
        started another one, as a test suite does): its applications are gone, and Serve's process-wide
        cache of controller long-poll clients (keyed by the controller's actor handle, whose id a new
        cluster can repeat) would route this session's requests to the old controller's replica table,
        where they wait forever. The cache is cleared (``router_loop.forget_shared_clients``)."""
        session = _session()
        if session == self.session:
            return
        if self.session:
            self.apps.clear()
            forget_shared_clients()
        self.session = session

    def _start(
        self,
        app: str,
        pool: ModelPlan,
        serve_cfg: dict[str, Any],
        ray_cfg: dict[str, Any],
        reuse: bool,
        stopping: threading.Event | None = None,
    ) -> tuple[Hosted, bool]:
        """Reuse ``app`` if it is up (``serve.reuse``), else make room for it and start its deployment
        (not waiting for it to load); True when a deployment was started."""
        start_serve()
        if reuse and bool(serve_cfg.get("reuse", True)) and app in running_apps():
            log.info("model %s: reusing the running deployment %s (serve.reuse)", pool.name, app)
            hosted = Hosted(app=app, pool=pool, created=False)
            hosted.ready.set()
            self.apps[app] = hosted
            return hosted, False
        replicas = max(1, pool.concurrency)
        cpus, gpus = _held(pool)  # idle models make way (Serve would wait for their resources); busy ones finish first
        self.make_room(cpus=cpus, gpus=gpus, keep=app, wait_busy=pool.name, stopping=stopping)
        in_flight = max(1, int(ray_cfg.get("batches_in_flight", 2)))
        deployment = serve.deployment(
            EngineReplica,
            name=DEPLOYMENT,
            num_replicas=replicas,
            ray_actor_options=replica_options(pool),
            max_ongoing_requests=max(in_flight, MERGE_BATCHES),  # API checks queue here, merged
            health_check_period_s=HEALTH_CHECK_PERIOD_S,
            health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
        )
        loads = self.loads[app] = self.loads.get(app, 0) + 1
        verb = "loading" if loads == 1 else f"reloading (load {loads} of this process)"
        log.info("model %s: %s as Serve application %s (%d replica(s))", pool.name, verb, app, pool.concurrency)
        before, since = _available(), time.perf_counter()
        # Not blocking: ``serve.run`` waits for the application on a thread that would outlive a deployment
        # given up on (and call into a Ray shut down under it); Serve's status is polled instead (``_until_up``).
        serve._run(
            deployment.bind(dict(pool.engine), pool.name, pool.threads),
            _blocking=False,
            name=app,
            route_prefix=None,
            logging_config={"enable_access_log": False},  # one line per batch otherwise
        )
        hosted = Hosted(app=app, pool=pool, created=True, placed=False, since=since)
        with self.count_lock:
            self.apps[app] = hosted
        # Its replicas take their resources within moments when the cluster has them; until the drop shows,
        # ``make_room`` counts them as taken (so the next model deployed beside it does not count them free).
        hosted.placed = _wait_for(lambda: _dropped(before, _available(), cpus, gpus), PLACE_WAIT_S)
        return hosted, True

    def room_for(self, pools: list[ModelPlan]) -> bool:
        """Whether every model of ``pools`` can be up at once without deleting a deployment: the replicas of those
        not up (nor starting) fit the cluster's free resources (``_unclaimed``). Idle deployments are not counted
        as free: a stage that would delete them to fit asks its models one after the other."""
        with self.deploy_lock:
            self._follow_session()
            with self.count_lock:
                starting = {app for app, hosted in self.apps.items() if not hosted.ready.is_set()}
            up = starting | running_apps()
            missing = [_held(p) for app, p in {app_name(p): p for p in pools}.items() if app not in up]
            return _fits(self._unclaimed(), sum(c for c, _ in missing), sum(g for _, g in missing))

    def make_room(
        self,
        cpus: float = 0.0,
        gpus: float = 0.0,
        keep: str = "",
        wait_busy: str = "",
        stopping: threading.Event | None = None,
    ) -> None:
        """Free ``cpus`` / ``gpus`` by deleting idle deployments this process made (least recently used
        first); a later stage that needs one deploys it again. Resources a deployment just started will take
        count as taken (``_unclaimed``); when only such deployments stand in the way, they are waited for.
        ``wait_busy`` (the name of the model to deploy): when only deployments busy in a stage stand in the way
        and deleting them would make room, wait for one to finish its stage (``stopping`` ends the wait) -
        otherwise return and let the caller's request wait for resources."""
        with self.deploy_lock:
            while not _fits(self._unclaimed(), cpus, gpus):
                with self.count_lock:
                    mine = [h for h in self.apps.values() if h.created and h.app != keep]
                idle = [h for h in mine if h.busy == 0 and h.ready.is_set()]
                if not idle:
                    starting = [h for h in mine if not h.ready.is_set()]
                    if starting:
                        for hosted in starting:  # their replicas' resources show once they are up
                            hosted.ready.wait()
                        continue
                    busy = [h for h in mine if h.busy > 0]
                    if not wait_busy or not busy or not self._fits_without(busy, cpus, gpus):
                        return
                    self._wait_idle(busy, wait_busy, cpus, gpus, stopping)
                    continue
                victim = min(idle, key=lambda h: h.last_used)
                log.info(
                    "model %s: deleting its idle deployment %s to free %s CPU / %s GPU (it is loaded again if a later "
                    "stage needs it; a cluster with room for every model of the run loads each once)",
                    victim.pool.name, victim.app, cpus, gpus,
                )  # fmt: skip
                self._delete(victim)
                _wait_for(lambda: _fits(self._unclaimed(), cpus, gpus), RESOURCE_WAIT_S)

    def _fits_without(self, hosted: list[Hosted], cpus: float, gpus: float) -> bool:
        """Whether ``cpus`` / ``gpus`` would fit once the deployments ``hosted`` were deleted."""
        free = self._unclaimed()
        for h in hosted:
            held_cpus, held_gpus = _held(h.pool)
            free["CPU"] += held_cpus
            free["GPU"] += held_gpus
        return _fits(free, cpus, gpus)

    def _wait_idle(
        self, busy: list[Hosted], model: str, cpus: float, gpus: float, stopping: threading.Event | None
    ) -> None:
        """Until one of ``busy`` finishes its stage (or is gone), saying every ``WAIT_LOG_S`` who waits for what;
        ``stopping`` set: ``RunInterrupted``. Under ``deploy_lock``: the waiting deployment is next."""
        names = ", ".join(sorted({h.pool.name for h in busy}))
        log.info(
            "model %s: waiting for room (%s CPU / %s GPU): model(s) %s hold it in a stage; the one done first is "
            "deleted then (a cluster with room for every model of the run loads each once)", model, cpus, gpus, names,
        )  # fmt: skip
        started = said = time.monotonic()
        while True:
            with self.count_lock:
                if any(h.busy == 0 or self.apps.get(h.app) is not h for h in busy):
                    return
            if stopping is not None and stopping.is_set():
                raise RunInterrupted(f"model {model}: the run was stopped while it waited for room to deploy")
            now = time.monotonic()
            if now - said >= WAIT_LOG_S:
                said = now
                log.info("model %s: still waiting for room after %.0f s: model(s) %s busy", model, now - started, names)
            time.sleep(STATUS_POLL_S)

    def _unclaimed(self) -> dict[str, float]:
        """The cluster's free CPUs / GPUs, less what the replicas of deployments just started will take and
        do not hold yet."""
        free = _available()
        with self.count_lock:
            unplaced = [h for h in self.apps.values() if not h.placed]
        for hosted in unplaced:
            cpus, gpus = _held(hosted.pool)
            free["CPU"] -= cpus
            free["GPU"] -= gpus
        return free

    def _delete(self, hosted: Hosted) -> None:
        serve.delete(hosted.app)
        with self.count_lock:
            self.apps.pop(hosted.app, None)

    def release(self, run: str, keep: bool) -> None:
        """``run`` is done with its models: delete those this process deployed that no run holds any more,
        unless ``keep``."""
        with self.deploy_lock:
            gone: list[Hosted] = []
            for hosted in list(self.apps.values()):
                hosted.holders.discard(run)
                if hosted.holders or not hosted.created:
                    continue
                if keep:
                    log.info("model %s: deployment %s kept up (serve.keep)", hosted.pool.name, hosted.app)
                    self.apps.pop(hosted.app)
                    continue
                serve.delete(hosted.app, _blocking=False)  # all at once: their replicas stop in parallel
                self.apps.pop(hosted.app, None)
                gone.append(hosted)
            _wait_for(lambda: not _still_listed({h.app for h in gone}), RESOURCE_WAIT_S)
            for hosted in gone:
                log.info("model %s: deployment %s deleted", hosted.pool.name, hosted.app)

    @contextmanager
    def use(
        self,
        run: str,
        pool: ModelPlan,
        serve_cfg: dict[str, Any],
        ray_cfg: dict[str, Any],
        stopping: threading.Event | None = None,
    ) -> Iterator[str]:
        """The application of ``pool``, up (deployed again if it was made to make room) and kept from
        eviction until the block ends: claiming it and marking it busy is one step under the deploy lock,
        so another thread's ``make_room`` cannot delete it in between; its load is waited for outside the
        lock (``_until_up``), so the other models of the run deploy meanwhile. ``stopping`` set (Ctrl-C)
        ends the wait for a deployment this call started: it is deleted and ``RunInterrupted`` raised."""
        with self.deploy_lock:
            hosted, deploying = self._claim(run, pool, serve_cfg, ray_cfg, stopping)
            with self.count_lock:
                hosted.busy += 1
        try:
            self._until_up(hosted, deploying, serve_cfg, stopping)
            yield hosted.app
        finally:
            with self.count_lock:
                hosted.busy -= 1
                hosted.last_used = time.monotonic()


def _wait_running(app: str, pool: ModelPlan, timeout_s: float, stopping: threading.Event | None = None) -> None:
    """Wait for ``app`` to be up, logging Serve's word on it every ``WAIT_LOG_S`` (a replica that waits for
    resources says which). A deployment that fails stops the run with Serve's reason; past ``timeout_s``
    the application is deleted and the run stops with an error naming the model, what one replica asks
    for and the setting to change. ``stopping`` set (the run was stopped): the application is deleted and
    ``RunInterrupted`` raised."""
    started = time.monotonic()
    said = started
    while True:
        status, message = _app_state(app)
        if status == ApplicationStatus.RUNNING:
            return
        if stopping is not None and stopping.is_set():
            _delete_quietly(app)
            raise RunInterrupted(f"model {pool.name}: the run was stopped while its deployment {app} came up")
        # Serve tries a replica's constructor again (up to 3 times a replica) before it calls the deployment
        # failed; a checkpoint that cannot make the model fails every try alike, so its first failure stops the run
        if status == ApplicationStatus.DEPLOY_FAILED or PERMANENT in message:
            _delete_quietly(app)
            log.error("model %s: Serve's report of the failed deployment %s: %s", pool.name, app, message)
            raise DeployError(f"model {pool.name}: its replica could not start: {_last_error(message)} "
                              f"(Serve application {app}; Serve's full report is in the log above)")  # fmt: skip
        now = time.monotonic()
        if now - started > timeout_s:
            _delete_quietly(app)
            raise DeployError(
                f"model {pool.name}: its Serve deployment was not up after {timeout_s:.0f} s "
                f"(serve.deploy_timeout_s). One replica asks for {replica_options(pool)}, "
                f"{max(1, pool.concurrency)} replica(s); the cluster has {_cluster_resources()}. "
                f"Serve says: {message or 'nothing'}. Lower models.{pool.name}.num_gpus / num_cpus / concurrency, "
                "add nodes that have them, or raise serve.deploy_timeout_s for a model that loads slowly"
            )
        if now - said >= WAIT_LOG_S:
            said = now
            log.info("model %s: deployment %s not up after %.0f s: %s", pool.name, app, now - started,
                     message or "loading")  # fmt: skip
        time.sleep(STATUS_POLL_S)


class DeployError(RuntimeError):
    """A model's deployment failed (its replica's constructor raised: a model that cannot be loaded) or was
    not up in time (no node has its resources): the run stops with this message."""


def _last_error(message: str) -> str:
    """The last ``SomeError: ...`` line of Serve's report (the replica constructor's own error, which names
    the model key and the fix), or the report's first line."""
    lines = [line.strip() for line in (message or "").splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception): ", line)]
    if not errors:
        return lines[0] if lines else "Serve gave no reason"
    return re.sub(r"^(?:[A-Za-z_]\w*\.)+(?=\w+: )", "", errors[-1])  # the class's name, not its module's


def _app_state(app: str) -> tuple[ApplicationStatus | None, str]:
    """Serve's status of ``app`` (None while the controller does not list it yet) and its message and its
    deployments' (why it is not running; "" when there is none), from one status call."""
    status = serve.status().applications.get(app)
    if status is None:
        return None, ""
    words = [status.message] + [d.message for d in status.deployments.values()]
    return ApplicationStatus(status.status), " ".join(w.strip() for w in words if w and w.strip())


def _delete_quietly(app: str) -> None:
    try:
        serve.delete(app, _blocking=False)
    except Exception:  # noqa: BLE001 - the error raised next is what matters
        log.debug("could not delete %s", app)


def _still_listed(apps: set[str]) -> bool:
    """Whether any of ``apps`` is still known to Serve (being deleted counts)."""
    if not apps:
        return False
    try:
        return bool(apps & set(serve.status().applications))
    except Exception:  # noqa: BLE001 - no Serve any more: nothing is listed
        return False


def _cluster_resources() -> dict[str, float]:
    import ray

    total = ray.cluster_resources()
    return {k: v for k, v in total.items() if k not in ("memory", "object_store_memory") and not k.startswith("node:")}


def _session() -> str:
    """The Ray session this process is connected to (unique per cluster start)."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    return str(getattr(node, "session_name", "") or ray.get_runtime_context().gcs_address)


def _available() -> dict[str, float]:
    """The cluster's free CPUs and GPUs."""
    import ray

    free = ray.available_resources()
    return {"CPU": float(free.get("CPU", 0.0)), "GPU": float(free.get("GPU", 0.0))}


def _dropped(before: dict[str, float], now: dict[str, float], cpus: float, gpus: float) -> bool:
    """Whether ``cpus`` / ``gpus`` more are taken ``now`` than ``before``: a new deployment's replicas hold them."""
    return now["CPU"] <= before["CPU"] - cpus + 1e-9 and now["GPU"] <= before["GPU"] - gpus + 1e-9


def _held(pool: ModelPlan) -> tuple[float, float]:
    """The CPUs and GPUs ``pool``'s deployment holds: its replicas' together."""
    replicas = max(1, pool.concurrency)
    return pool.num_cpus * replicas, pool.num_gpus * replicas


def _fits(available: dict[str, float], cpus: float, gpus: float) -> bool:
    return available.get("CPU", 0.0) + 1e-9 >= cpus and available.get("GPU", 0.0) + 1e-9 >= gpus


def _wait_for(condition: Any, timeout_s: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout_s`` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


HOSTS = Hosts()

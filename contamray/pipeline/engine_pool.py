"""The batch stages' client of the hosted models: requests in, outputs out, through Serve handles.

Each model is a Ray Serve deployment (``contamray.serve.hosting``), loaded once per run (or reused from
an earlier run or the on-demand API) and shared by every stage and every target that needs it: the
judge of a zoo of targets, the reference model, a target that is also its own judge. ``EnginePools``
is a run's hold on the models it uses; ``EnginePool.answer`` sends one stage's requests to a model.

Why Serve and not one Ray Data ``map_batches`` pass per stage (the first design), nor a run-private
``ActorPool`` (the second): every Dataset execution built its own actors, so a method with two engine
stages loaded the model twice; a private pool could not be shared between the targets of a zoo, nor
with the HTTP API, nor outlive its run. Serve keeps replicas alive, replaces a dead one, and queues
several batches per replica (``ray.batches_in_flight``) so the next one is there when a batch ends.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

from contamray import interrupts
from contamray.engines.dedup import Dedup
from contamray.engines.wire import Output, Request, guess_tokens
from contamray.interrupts import STOPPED, RunInterrupted
from contamray.pipeline.answers import AnswerJournal, batch_digest
from contamray.pipeline.plan import ModelPlan
from contamray.pipeline.progress import Progress
from contamray.serve.hosting import HOSTS, Hosts, answers_key

log = logging.getLogger("contamray")

# A batch whose replica died is sent again, after 1, 2, 4, ... 30 s: Serve notices the death at its next
# health check and starts a replica, which loads the model again; about 90 s in all before giving up.
RETRIES = 6
MAX_RETRY_WAIT_S = 30.0
# ray.request_batch_tokens: about this much work per batch (``guessed_tokens``), so that long requests (a sharded test's
# shard of long rows, many samples of a long prompt) come back, and show as progress, every minute or so on a CPU
BATCH_TOKENS = 8192
# how often a stage waiting for a model looks whether the run was told to stop (Ctrl-C)
POLL_S = 0.5


def guessed_tokens(request: Request) -> float:
    """A request's cost in tokens, guessed: its text's tokens, plus those it generates (samples x max_tokens)."""
    generated = request.sampling.n * request.sampling.max_tokens if request.kind == "generate" else 0
    return guess_tokens(request.text + request.reply, generated)


def batched(items: list[tuple[str, Request]], size: int, tokens: int) -> list[list[tuple[str, Request]]]:
    """Consecutive runs of ``items``, each ending at ``size`` requests or once its ``guessed_tokens`` reach ``tokens``
    (a request longer than that is a batch alone). Decided by the requests alone, so a config always sends the
    same batches: a forward pass's last bits depend on its batch, and reruns must give the same bytes."""
    batches: list[list[tuple[str, Request]]] = []
    batch: list[tuple[str, Request]] = []
    spent = 0.0
    for item in items:
        batch.append(item)
        spent += guessed_tokens(item[1])
        if len(batch) >= size or spent >= tokens:
            batches.append(batch)
            batch, spent = [], 0.0
    return batches + ([batch] if batch else [])


class EnginePool:
    """A hosted model as one stage sees it; ``answer`` sends it batches of requests."""

    def __init__(self, pool: ModelPlan, pools: EnginePools) -> None:
        self.name = pool.name
        self.pool = pool
        self.pools = pools
        ray_cfg = pools.ray_cfg
        self.batch_size = max(1, int(ray_cfg.get("request_batch_size", 32)))
        self.batch_tokens = max(1, int(ray_cfg.get("request_batch_tokens", BATCH_TOKENS)))
        self.in_flight = max(1, int(ray_cfg.get("batches_in_flight", 2))) * max(1, pool.concurrency)

    def answer(self, items: list[tuple[str, Request]], label: str = "") -> list[tuple[str, Output, int]]:
        """(cell key, Output, how many requests shared its answer) for every (cell key, Request); order is
        not kept. Identical requests of different cells are sent once (``engines/dedup.py``).

        Batches an earlier run of the same requests had answered when it stopped are read from the run's
        ``AnswerJournal`` (``pipeline/answers.py``) instead of asked again; each batch answered here is written
        there as it comes back. Progress (requests done / total, tokens/s, an ETA from the guessed tokens left) is
        reported under ``label`` as batches come back.
        A batch whose replica died is sent again (``RETRIES`` times); a batch that still fails gives each
        of its requests an error output, so its examples are recorded as failed and the run goes on.
        When the run is told to stop (``EnginePools.stop``: Ctrl-C), no batch is sent or waited for any more and
        ``RunInterrupted`` is raised; the batches answered by then are kept.
        """
        label = label or f"model {self.name}"
        work = Dedup(items)
        if work.saved:
            log.info("%s: %d of %d requests shared with another cell", label, work.saved, len(items))
        batches = batched(work.unique, self.batch_size, self.batch_tokens)
        out: list[tuple[str, Output]] = []
        todo = []
        kept_digests = self.pools.kept_digests(self.pool)
        for batch in batches:
            digest = batch_digest(batch)
            kept = self.pools.kept_answers(self.pool, batch, digest) if digest in kept_digests else None
            if kept is None:
                todo.append(batch)
            else:
                out.extend(kept)
        if len(todo) < len(batches):
            log.info("%s: %d of %d batches (%d requests) answered before this run stopped last time; not asked again",
                     label, len(batches) - len(todo), len(batches), len(out))  # fmt: skip
        if todo:
            out.extend(self._ask(todo, label))
        return work.expand(out)

    def _ask(self, batches: list[list[tuple[str, Request]]], label: str) -> list[tuple[str, Output]]:
        from ray import serve

        out: list[tuple[str, Output]] = []
        # requests differ in cost by orders of magnitude (a short score, 50 samples of 100 tokens): the ETA goes by
        # the guessed tokens left, not the requests left
        cost = [sum(guessed_tokens(req) for _, req in batch) for batch in batches]
        requests = sum(len(batch) for batch in batches)
        with self.pools.use(self.pool) as app, Progress(label, requests, "requests", work=sum(cost)) as progress:
            handle = serve.get_app_handle(app)
            pool = ThreadPoolExecutor(max_workers=self.in_flight, thread_name_prefix="engine")
            try:
                futures = {pool.submit(self._send, handle, app, batch, label): i for i, batch in enumerate(batches)}
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_COMPLETED)
                    for future in done:
                        answered = future.result()
                        out.extend(answered)
                        progress.update(len(answered), tokens=sum(o.num_tokens for _, o in answered),
                                        work=cost[futures[future]])
                    self.pools.check_stop(label)
            except (*STOPPED, RunInterrupted):  # Ctrl-C here, or a stop: the sending threads end in POLL_S
                self.pools.stop()
                raise
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
        return out

    def _send(self, handle: Any, app: str, batch: list[tuple[str, Request]], label: str) -> list[tuple[str, Output]]:
        rows = {"cell": [cell for cell, _ in batch], "request": [json.dumps(req.to_row()) for _, req in batch]}
        error: BaseException | None = None
        for attempt in range(RETRIES + 1):
            self.pools.check_stop(label)
            response = handle.answer.remote(rows)
            try:
                result = self._wait(response, label)
            except RunInterrupted:
                raise
            except Exception as err:  # noqa: BLE001 - a replica lost mid-batch: Serve replaces it, we resend
                error = err
                log.warning(
                    "%s: a batch of %d requests failed on %s (%s: %s); attempt %d of %d",
                    label, len(batch), app, type(err).__name__, str(err).splitlines()[0][:200], attempt + 1,
                    RETRIES + 1,
                )  # fmt: skip
                if attempt < RETRIES:
                    self.pools.stopping.wait(min(2.0**attempt, MAX_RETRY_WAIT_S))
                continue
            answered = [(cell, Output.from_row(json.loads(row))) for cell, row in zip(result["cell"], result["output"])]
            if not any(o.error for _, o in answered):
                self.pools.keep_answers(self.pool, batch, list(result["output"]))
            return answered
        reason = f"engine {self.name} failed the batch {RETRIES + 1} times: {type(error).__name__}: {error}"
        return [(cell, Output(key=req.key, error=reason[:2000])) for cell, req in batch]

    def _wait(self, response: Any, label: str) -> Any:
        """The response's result, polled every ``POLL_S`` so that a stop does not wait for the batch: the request is
        then cancelled (best effort: a replica mid-forward-pass finishes it) and ``RunInterrupted`` raised."""
        while True:
            try:
                return response.result(timeout_s=POLL_S)
            except TimeoutError:
                if self.pools.stopping.is_set():
                    response.cancel()
                    self.pools.check_stop(label)


class EnginePools:
    """A run's hold on the models it uses; use as a context manager around the run.

    ``get`` deploys a model on first use (or finds its deployment up); the models stay loaded until the
    run ends, then the ones this process deployed are deleted unless ``serve.keep``.
    """

    def __init__(
        self,
        ray_cfg: dict[str, Any],
        serve_cfg: dict[str, Any] | None = None,
        hosts: Hosts = HOSTS,
        answers: AnswerJournal | None = None,
    ) -> None:
        self.ray_cfg = ray_cfg
        self.serve_cfg = dict(serve_cfg or {})
        self.hosts = hosts
        self.run = uuid.uuid4().hex
        self.answers = answers  # answered batches kept for a re-run (``pipeline/answers.py``); None: not kept
        self.stopping = threading.Event()

    def stop(self) -> None:
        """Tell every stage asking a model to stop (the driver was interrupted): each raises ``RunInterrupted``
        within ``POLL_S``, keeping the batches answered by then."""
        self.stopping.set()

    def check_stop(self, label: str) -> None:
        if self.stopping.is_set():
            raise RunInterrupted(f"{label}: stopped")

    def kept_digests(self, pool: ModelPlan) -> set[str]:
        """The digests of ``pool``'s model's batches kept by an earlier run."""
        return self.answers.digests(answers_key(pool)) if self.answers is not None else set()

    def kept_answers(
        self, pool: ModelPlan, batch: list[tuple[str, Request]], digest: str
    ) -> list[tuple[str, Output]] | None:
        """``batch``'s (of ``digest``: ``batch_digest``) answers from ``pool``'s model kept by an earlier run, or
        None."""
        if self.answers is None:
            return None
        rows = self.answers.get(answers_key(pool), digest, len(batch))
        if rows is None:
            return None
        return [(cell, Output.from_row(json.loads(row))) for (cell, _), row in zip(batch, rows)]

    def keep_answers(self, pool: ModelPlan, batch: list[tuple[str, Request]], rows: list[str]) -> None:
        if self.answers is not None:
            self.answers.put(answers_key(pool), batch_digest(batch), rows)

    def get(self, pool: ModelPlan) -> EnginePool:
        """``pool``'s model for a stage; each pass deploys it if it is not up (``use``)."""
        return EnginePool(pool, self)

    def use(self, pool: ModelPlan) -> Any:
        """A context in which ``pool``'s deployment is up and safe from eviction (``Hosts.use``)."""
        return self.hosts.use(self.run, pool, self.serve_cfg, self.ray_cfg, self.stopping)

    def room_for(self, pools: list[ModelPlan]) -> bool:
        """Whether ``pools``' models can all be up at once now: those not up fit the cluster's free resources
        (``Hosts.room_for``)."""
        return self.hosts.room_for(pools)

    def make_room(self, cpus: float, gpus: float = 0.0) -> None:
        """Free ``cpus`` / ``gpus`` for other work (the scoring actors, a fine-tune) from idle models when the
        cluster is short."""
        self.hosts.make_room(cpus=cpus, gpus=gpus)

    def close(self) -> None:
        self.hosts.release(self.run, keep=bool(self.serve_cfg.get("keep", False)))

    def __enter__(self) -> EnginePools:
        interrupts.watch(self.stopping)  # a sweep's stop (``interrupts.stop_all``) reaches it
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            interrupts.unwatch(self.stopping)

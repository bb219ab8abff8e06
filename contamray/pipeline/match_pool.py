"""The match actors of a corpus pass that read their own files: an autoscaling pool of Ray actors fed by ``ray.wait``.

A pass's files are cut into tasks (``corpus_scan.file_tasks``); each task goes to a ``FileMatchWorker`` actor (one
CPU, and the placement it is given), which reads, matches and folds its files into what it holds from its earlier
tasks (``FileMatchWorker.scan_into``). The driver keeps one task in flight per actor and hands the next one out as
soon as an actor answers (``ray.wait``), so no actor waits behind another's queue.

- **The combine is spread over the actors.** Each actor folds its own tasks together as it goes (a few rows per
  example, ``FOLD_CONTRACT``), in parallel with the others; when every task is done, each hands over what it holds
  as one output (``flush``: ``actors.match_output`` rows), so the driver folds one output per actor, not one per
  task: on the 1 TB plan of ``docs/cluster.md``, a few hundred per pass instead of ~4,000 in all, each of which
  the driver folded serially at ~0.3 ms per row it carried. What an actor holds lives in its process only: every
  answer carries the actor's ``incarnation`` (new in each process Ray starts for it), and when it changes - the
  actor was restarted, after a kill or a lost node - the tasks it had folded go back to the queue and are scanned
  again (logged, and added to the progress' total).

- **Autoscaling.** The pool starts at ``low`` actors and adds one whenever every actor is busy, none is still
  starting and tasks wait, up to ``high`` (and never more than the tasks): an actor the cluster cannot place yet
  stays "starting" (Ray's autoscaler sees its demand) and blocks no work. Actors are spread over the nodes
  (``SPREAD``), as Ray Data spreads its pools. Ray Data's actor pool (``ActorPoolStrategy``) grows the same way
  and ran this stage until 2026-11-25; on the same tasks, folded by the same ``corpus_scan.fold_stream``
  (``bench/open_data_scan.py``'s 183 MB scan with two workers on 2 cores, five alternated runs), this pool starts
  ~1.5-2 s sooner per pass (no executor to build; a task costs an actor call of ~1-2 ms, where Ray Data's
  scheduling round took ~45 ms) and its driver uses ~0.6 s less CPU per 10 s scan; the scan rate after
  start-up is the same within the noise.
- **Lost workers.** Actors restart (``max_restarts=-1``) and Ray retries their task (``max_task_retries``,
  ``TASK_RETRIES``): a killed worker process or lost node costs the tasks that actor had folded, not the scan. A
  task whose actor dies on every try (a file that runs the worker out of memory) is not retried forever: its files
  are reported as failed corpus rows, naming them and the error, and the pass goes on. An error the match code
  raises is a bug, not bad input: it stops the scan (as it did under Ray Data).
- **Progress.** Files done / total, rate and ETA (``pipeline.progress``); the pool's size at debug level as it grows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import ray
from ray.exceptions import RayActorError

from contamray.corpus.readers import FILE_SKIPPED
from contamray.pipeline.actors import FileMatchWorker, match_output
from contamray.pipeline.progress import Progress

log = logging.getLogger("contamray")

TASK_RETRIES = 3  # tries of a task after its actor died (a restarted actor runs it again)


def pooled_matches(
    tasks: list[list[str]],
    worker_kwargs: dict[str, Any],
    low: int,
    high: int,
    placement: dict[str, Any],
    name: str = "corpus match",
    worker_class: type[FileMatchWorker] = FileMatchWorker,
) -> Iterator[dict[str, list[Any]]]:
    """The match actors' outputs for ``tasks`` (groups of file paths): one per actor that matched any, once the tasks
    are done, from a pool of ``low`` .. ``high`` ``FileMatchWorker`` actors built with ``worker_kwargs``, each
    holding one CPU and ``placement``'s resources (see the module docstring); ``worker_class``: a
    ``FileMatchWorker`` (or a subclass). The actors are killed when the outputs are out or the caller stops."""
    high = max(1, min(high, len(tasks)))
    low = max(1, min(low, high))
    # SPREAD: a new actor goes to another node (their files' reading and matching spread over the cluster)
    options = {"num_cpus": 1, "max_restarts": -1, "max_task_retries": TASK_RETRIES, "scheduling_strategy": "SPREAD"}
    worker = ray.remote(worker_class).options(**{**options, **placement})
    queue = list(reversed(tasks))  # popped from the end: the first task first
    actors: list[Any] = []
    starting: dict[Any, Any] = {}  # ready ref -> actor still being built
    free: list[Any] = []
    busy: dict[Any, tuple[Any, list[str]]] = {}  # task ref -> (actor, its files)
    held: dict[Any, tuple[str, list[list[str]]]] = {}  # actor -> (incarnation, the tasks folded into what it holds)

    def add() -> None:
        actor = worker.remote(**worker_kwargs)
        actors.append(actor)
        starting[actor.__ray_ready__.remote()] = actor

    def lost(actor: Any) -> None:
        """The actor restarted: what it held is gone, its tasks go back to the queue."""
        _, again = held.pop(actor, ("", []))
        if again:
            log.warning("%s: a match actor was restarted; %d task(s) it had folded are scanned again", name, len(again))
            queue.extend(again)
            progress.grow(sum(len(t) for t in again))

    def done(actor: Any, incarnation: str, files: list[str]) -> None:
        if actor in held and held[actor][0] != incarnation:
            lost(actor)
        held.setdefault(actor, (incarnation, []))[1].append(files)

    for _ in range(low):
        add()
    try:
        with Progress(name, sum(len(t) for t in tasks), unit="files") as progress:
            while queue or busy or held:
                if not queue and not busy:  # every task folded somewhere: the actors hand over what they hold
                    flushes = {actor.flush.remote(): actor for actor in held}
                    for ref, actor in flushes.items():
                        incarnation, outputs = _flushed(ref, name)
                        if incarnation != held[actor][0]:
                            lost(actor)
                            continue
                        del held[actor]
                        yield from outputs
                    continue
                while free and queue:
                    actor = free.pop()
                    files = queue.pop()
                    busy[actor.scan_into.remote(files)] = (actor, files)
                if queue and not free and not starting and len(actors) < high:
                    add()
                    log.debug("%s: %d match actor(s) (at most %d)", name, len(actors), high)
                (ref,), _ = ray.wait([*busy, *starting], num_returns=1)
                if ref in starting:
                    ray.get(ref)  # an actor whose constructor failed: its error
                    free.append(starting.pop(ref))
                    continue
                actor, files = busy.pop(ref)
                free.append(actor)
                try:
                    done(actor, ray.get(ref), files)
                except RayActorError as err:  # died, or unavailable, on every try
                    lost(actor)
                    yield _failed(files, err)
                progress.update(len(files))
    finally:
        for actor in actors:
            ray.kill(actor)


def _flushed(ref: Any, name: str) -> tuple[str, list[dict[str, list[Any]]]]:
    """An actor's incarnation and outputs from ``flush``; an actor lost meanwhile answers as a new incarnation."""
    try:
        return ray.get(ref)
    except RayActorError as err:
        log.warning("%s: a match actor was lost handing over its matches: %s", name, err)
        return "", []


def _failed(files: list[str], err: Exception) -> dict[str, list[Any]]:
    """One output listing a task's files as failed corpus rows: its actor died on every try."""
    error = (
        f"the match actor died on these files {TASK_RETRIES + 1} times (out of memory? a document too long for "
        f"ray.corpus_batch_bytes?): {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}; "
        f"{FILE_SKIPPED}"
    )
    log.error("corpus files %s: %s", ", ".join(files), error)
    return match_output([{"where": path, "error": error} for path in files], [])

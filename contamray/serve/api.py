"""The on-demand HTTP API: a FastAPI app served by a Ray Serve ingress deployment.

Endpoints (OpenAPI at ``/docs``; every ``/v1`` route needs ``Authorization: Bearer <token>``):

- ``POST /v1/check``: items + model + methods (+ the benchmark the items come from, + a reference
  partition, + ``overrides`` of the methods' parameters, keys from ``allow.check_keys``) -> per-item scores
  and each method's verdict (``serve/check.py``);
- ``POST /v1/jobs``: a partition-level check as a Ray Job -> job id; ``GET /v1/jobs/{id}``: status,
  progress (cells done / total) and, when finished, the partitions table (``serve/jobs.py``);
- ``GET /v1/methods``: the allow-listed methods with parameters, defaults and citations, the models, and the
  override keys a check and a job may set;
  ``GET /v1/benchmarks``: the allow-listed benchmarks; ``GET /healthz``: liveness (no token).

``build_app(settings)`` checks the tokens (``serve/security.py``: the server refuses to start without one
unless insecure on 127.0.0.1) and binds the deployment with the server's settings; ``contamray serve``
and ``serve run contamray.serve:app`` both go through it. Errors are JSON ``{error, detail}``.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from contamray.serve.check import Checker, Item, ReferenceSpec
from contamray.serve.config import ServerSettings, load_settings
from contamray.serve.jobs import Jobs, JobSpec
from contamray.serve.security import (
    LOCAL_HOST,
    ApiError,
    Guard,
    GuardMiddleware,
    SecurityError,
    install,
    token_digests,
)

log = logging.getLogger("contamray")
APP_NAME = "contamray"


# -- request bodies ---------------------------------------------------------------------------------
class ItemIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(min_length=1, description="the text a model is shown (a benchmark row's input)")
    label: str = Field("", description="the gold output as text (scored after the text by default)")
    reference: str = Field("", description="the part to reproduce in guided prompting (default: the text)")
    choices: list[str] = Field(default_factory=list, max_length=26)
    answer: str = ""
    id: str = Field("", max_length=128, description="your id for the item (default item<i>)")


class ReferenceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    benchmark: str = Field(description="an allow-listed benchmark (GET /v1/benchmarks)")
    config: str | None = None
    split: str | None = None
    rows: int | None = Field(None, description="rows of the reference partition (limits.default_reference_rows)")
    sample: Literal["random", "first"] = "random"


class CheckIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="an allow-listed model (GET /v1/methods lists them)")
    methods: list[str] = Field(description="allow-listed closed-data methods")
    items: list[ItemIn]
    benchmark: str | None = Field(None, description="the benchmark the items come from: a reference of the same "
                                  "benchmark is then a held-out comparison, else a distribution comparison")
    reference: ReferenceIn | None = Field(None, description="the partition the items are tested against")
    overrides: list[str] = Field(default_factory=list, max_length=16,
                                 description="key=value of a method's parameters, keys from allow.check_keys "
                                             "(e.g. methods.cdd.n_samples=10)")


class JobIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    models: list[str]
    benchmarks: list[str]
    methods: list[str]
    experiment: str = "base"
    overrides: list[str] = Field(default_factory=list, description="key=value, keys from allow.job_keys")


# -- the app ----------------------------------------------------------------------------------------
fastapi_app = FastAPI(
    title="contamray",
    description="Benchmark contamination checks on demand: per-item membership scores and partition verdicts "
    "from the models this server hosts, and partition-level runs as Ray Jobs.",
    version="1",
)
fastapi_app.add_middleware(GuardMiddleware)


def _error(status: int, error: str, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


@fastapi_app.exception_handler(ApiError)
async def _api_error(_: Request, err: ApiError) -> JSONResponse:
    return _error(err.status, err.error, err.detail, err.headers)


@fastapi_app.exception_handler(RequestValidationError)
async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
    problems = [{"field": ".".join(str(p) for p in e.get("loc", ())), "problem": e.get("msg", "")}
                for e in err.errors()]
    return _error(422, "invalid_request", problems)


@fastapi_app.exception_handler(StarletteHTTPException)
async def _http(_: Request, err: StarletteHTTPException) -> JSONResponse:
    name = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code, "http_error")
    return _error(err.status_code, name, str(err.detail))


@fastapi_app.exception_handler(Exception)
async def _internal(request: Request, err: Exception) -> JSONResponse:
    log.exception("contamray api: %s %s failed", request.method, request.url.path)
    return _error(500, "internal_error", "the server failed on this request; the server log has the details")


def _caller(request: Request) -> str:
    return str(getattr(request.state, "caller", "local"))


@serve.deployment(name="contamray_api")
@serve.ingress(fastapi_app)
class ContamrayAPI:
    """One API replica: the request guard, the checker (plans, engine pools, reference rows) and the jobs."""

    def __init__(self, settings: ServerSettings) -> None:
        if not settings.token_digests and not (settings.insecure_local and settings.host == LOCAL_HOST):
            raise SecurityError("no API token configured and not --insecure-local on 127.0.0.1: refusing to start")
        self.settings = settings
        limits = settings.limits
        install(Guard(settings.token_digests, settings.insecure_local, limits.max_body_bytes,
                      limits.requests_per_minute, limits.burst))
        self.checker = Checker(settings)
        self.jobs = Jobs(settings)
        self._methods: list[dict[str, Any]] | None = None
        self._benchmarks: list[dict[str, Any]] | None = None

    def __del__(self) -> None:
        """Serve calls this when the replica stops: release the models this replica holds."""
        checker = getattr(self, "checker", None)
        if checker is not None:
            try:
                checker.close()
            except Exception:  # noqa: BLE001 - shutting down; the models' own deployments outlive a failure here
                log.warning("contamray api: releasing the hosted models failed at shutdown", exc_info=True)

    @fastapi_app.get("/healthz")
    def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @fastapi_app.get("/v1/methods")
    def methods(self) -> dict[str, Any]:
        from contamray.serve.catalog import method_entry

        if self._methods is None:
            self._methods = [method_entry(m) for m in self.settings.allow.methods]
        allow = self.settings.allow
        # the override keys a check (``overrides``) and a job may set: ``*`` = one of the methods or benchmarks named
        return {"methods": self._methods, "models": list(allow.models), "check_keys": list(allow.check_keys),
                "job_keys": list(allow.job_keys)}

    @fastapi_app.get("/v1/benchmarks")
    def benchmarks(self) -> dict[str, Any]:
        from contamray.serve.catalog import benchmark_entry

        if self._benchmarks is None:
            self._benchmarks = [benchmark_entry(b) for b in self.settings.allow.benchmarks]
        return {"benchmarks": self._benchmarks}

    @fastapi_app.post("/v1/check")
    def check(self, body: CheckIn) -> dict[str, Any]:
        limits = self.settings.limits
        if len(body.items) > limits.max_items:
            raise ApiError(413, "too_many_items", f"items: {len(body.items)} given, the limit is {limits.max_items} "
                           "(limits.max_items); split the check, or submit a job (POST /v1/jobs)")
        if not body.items:
            raise ApiError(422, "invalid_items", "items: empty; send at least one item {text: ...}")
        long = [i for i, item in enumerate(body.items) if len(item.text) > limits.max_text_chars]
        if long:
            raise ApiError(422, "text_too_long", f"items {long}: text longer than {limits.max_text_chars} characters "
                           "(limits.max_text_chars); shorten them")
        reference = None
        if body.reference is not None:
            r = body.reference
            reference = ReferenceSpec(r.benchmark, r.config, r.split, r.rows or limits.default_reference_rows,
                                      r.sample)
        items = [Item(text=i.text, label=i.label, reference=i.reference, choices=tuple(i.choices), answer=i.answer,
                      id=i.id) for i in body.items]
        result = self.checker.check(body.model, body.methods, items, body.benchmark, reference,
                                    tuple(body.overrides))
        return result.to_json()

    @fastapi_app.post("/v1/jobs", status_code=202)
    def submit_job(self, body: JobIn, request: Request) -> dict[str, Any]:
        spec = JobSpec(tuple(body.models), tuple(body.benchmarks), tuple(body.methods), body.experiment,
                       tuple(body.overrides))
        return self.jobs.submit(spec, _caller(request))

    @fastapi_app.get("/v1/jobs/{job_id}")
    def job(self, job_id: str, request: Request) -> dict[str, Any]:
        return self.jobs.status(job_id, _caller(request))


def build_app(settings: ServerSettings | None = None, overrides: list[str] | None = None,
              environ: dict[str, str] | None = None) -> Any:
    """The Serve application: settings checked, tokens read (refusing to start without one unless
    insecure on 127.0.0.1) and passed to the replicas as digests."""
    settings = settings or load_settings(overrides)
    settings = settings.replace(token_digests=token_digests(settings.host, settings.insecure_local, environ))
    deployment = settings.deployment
    return ContamrayAPI.options(
        num_replicas=int(deployment.get("num_replicas", 1)),
        max_ongoing_requests=int(deployment.get("max_ongoing_requests", 32)),
        ray_actor_options={"num_cpus": float(deployment.get("num_cpus", 0))},
    ).bind(settings)

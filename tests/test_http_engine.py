"""The HTTP engine (``contamray/engines/http.py``) against a real OpenAI-compatible server.

One vLLM server (its own OpenAI API server on the CPU build, hosting the embedded model in float32) is
started on 127.0.0.1 for the module; a small real HTTP proxy of the test's own (``FaultProxy``) sits in
front of it where a test needs to see or disturb the traffic.

- Greedy completions (raw, chat through the server's chat template, per-request lengths, and guided
  prompting's own requests and rows) equal the local transformers engine's (float32).
- Prompt log-probabilities through the API (vLLM's ``prompt_logprobs``, and ``echo`` + ``logprobs``),
  whole and in rolling windows, equal the local engine's within ``CROSS_TOL`` per token.
- A server that answers 429 (with ``Retry-After``), 500, or does not answer before the timeout is retried
  and the request succeeds; with more failures than retries the request is a failed output whose error
  names the statuses and the attempts. A repeated request is answered from the response cache.
- The API key, read from the variable the config names, reaches the server and appears in no file a
  run writes (outputs, logs, the response cache) nor in its console output.
- The plan refuses Min-K%++ on an http model, naming the method and the reason.
- A second server hosts a copy of the model without a chat template (a base model's server): it refuses chat turns,
  and the engine then sends them as raw text, the same ids, log-probabilities and completions as the local engine
  on that copy (which falls back alike); a chat-only API keeps the server's error.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from contamray.engines import EngineSpec, build_engine, resolve_model_path
from contamray.engines.wire import Request, Sampling
from contamray.pipeline.plan import ConfigError
from tests.test_config import plan_of

REPO = Path(__file__).resolve().parents[1]
CROSS_TOL = 1e-3  # as tests/test_engines.py: float32 on both sides
SERVED = "smollm2"
SECRET_ENV = "CONTAMRAY_TEST_HTTP_KEY"
PROMPTS = ["The capital of France is", "Q: How many legs does a spider have?\nA:", "def fibonacci(n):"]
TEXTS = [
    "The capital of France is Paris.",
    "Water boils at 100 degrees Celsius at sea level, and it freezes at zero degrees.",
    "A short one.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def vllm_server() -> Iterator[str]:
    """vLLM's OpenAI-compatible server on the CPU build, hosting the embedded model; its base URL."""
    with serving(resolve_model_path("smollm2-135m")) as url:
        yield url


@contextmanager
def serving(model_path: str) -> Iterator[str]:
    """vLLM's OpenAI-compatible server on 127.0.0.1 hosting ``model_path`` in float32 as ``SERVED``; its base URL."""
    port = free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    args = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
        "--served-model-name", SERVED, "--dtype", "float32", "--max-model-len", "1024",
        "--enforce-eager",  # as contamray's own vLLM engine: no torch.compile (~1.5 min of a CPU start)
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"contamray-vllm-server-{port}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 900  # ~1 min on quiet cores; the CPU is shared
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the vLLM server exited ({proc.returncode}); see {log.name}"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            pytest.fail(f"the vLLM server was not up after 900 s; see {log.name}")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its engine-core process, started above
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def templateless(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """The embedded model without its chat template (a base model's checkpoint: the weights linked, the template file
    gone, none in the tokenizer's config) behind its own vLLM server; (base URL, checkpoint path)."""
    source, copy = Path(resolve_model_path("smollm2-135m")), tmp_path_factory.mktemp("templateless")
    for item in source.iterdir():
        if item.name == "chat_template.jinja":
            continue
        if item.name == "tokenizer_config.json":
            config = json.loads(item.read_text())
            config.pop("chat_template", None)
            (copy / item.name).write_text(json.dumps(config))
        else:
            (copy / item.name).symlink_to(item)
    with serving(str(copy)) as url:
        yield url, str(copy)


@pytest.fixture(scope="module")
def hf32():
    from contamray.engines.hf import HFEngine

    return HFEngine(resolve_model_path("smollm2-135m"), dtype="float32", batch_size=4)


def http_engine(url: str, tmp_path: Path | None = None, **params):
    """An http engine for the served model (the response cache off unless ``tmp_path`` holds it)."""
    spec = EngineSpec(source=SERVED, backend="http", base_url=url, name="served", cache=tmp_path is not None,
                      **params)  # fmt: skip
    engine = build_engine(spec)
    if tmp_path is not None:
        from contamray.engines.http import ResponseCache

        engine.cache = ResponseCache(tmp_path / "http")
    return engine


class FaultProxy:
    """A real HTTP proxy on 127.0.0.1 in front of ``upstream``: the first completion requests get the
    scripted ``faults`` ("429": Too Many Requests with ``Retry-After: 1``; "500"; "sleep": no answer for
    ``sleep_s``), the rest are forwarded. It records each request's path and ``Authorization`` header."""

    def __init__(self, upstream: str, faults: list[str] | None = None, sleep_s: float = 3.0) -> None:
        self.upstream = upstream
        self.faults = list(faults or [])
        self.sleep_s = sleep_s
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                proxy.handle(self, b"")

            def do_POST(self) -> None:  # noqa: N802
                proxy.handle(self, self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, h: BaseHTTPRequestHandler, body: bytes) -> None:
        with self.lock:
            self.seen.append((h.path, h.headers.get("Authorization", "")))
            fault = self.faults.pop(0) if self.faults and "completions" in h.path else None
        if fault == "sleep":
            time.sleep(self.sleep_s)
            return self.reply(h, 504, b'{"error": "too late"}')
        if fault in ("429", "500"):
            extra = {"Retry-After": "1"} if fault == "429" else {}
            return self.reply(h, int(fault), json.dumps({"error": f"scripted {fault}"}).encode(), extra)
        method = "POST" if body else "GET"
        answer = httpx.request(method, self.upstream + h.path, content=body or None,
                               headers={"Content-Type": "application/json"}, timeout=120)  # fmt: skip
        self.reply(h, answer.status_code, answer.content)

    @staticmethod
    def reply(h: BaseHTTPRequestHandler, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            h.send_response(status)
            for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
                h.send_header(key, value)
            h.send_header("Content-Length", str(len(payload)))
            h.end_headers()
            h.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timed out) first
            pass

    def completions(self) -> int:
        return sum(1 for path, _ in self.seen if "completions" in path)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ----------------------------------------------------------------------------- no server needed


def test_config_errors_name_the_key_and_never_repeat_a_pasted_key() -> None:
    with pytest.raises(ConfigError, match=r"models\.openai_compatible\.base_url"):
        plan_of("model=[openai_compatible]", "models.openai_compatible.base_url=localhost:8000",
                "benchmark=[synthetic_facts]", "method=[perplexity]", "corpus=none")  # fmt: skip
    pasted = "sk-live-abc123DEF456"
    with pytest.raises(ConfigError, match=r"models\.openai_compatible\.api_key_env must be the NAME") as err:
        plan_of("model=[openai_compatible]", f"models.openai_compatible.api_key_env={pasted}",
                "benchmark=[synthetic_facts]", "method=[perplexity]", "corpus=none")  # fmt: skip
    assert pasted not in str(err.value)
    with pytest.raises(ValueError, match=r"models\.m\.max_retries: must be >= 0"):
        EngineSpec.from_config("m", {"source": "x", "backend": "http", "base_url": "http://h:1", "max_retries": -1})


def test_the_plan_refuses_min_k_plus_plus_on_an_http_model() -> None:
    with pytest.raises(ConfigError) as err:
        plan_of("model=[openai_compatible]", "benchmark=[synthetic_facts]", "method=[min_k_plus_plus]", "corpus=none")
    message = str(err.value)
    assert "min_k_plus_plus" in message and "models.openai_compatible" in message
    assert "vocabulary mean and standard deviation" in message and "OpenAI-compatible API" in message


def test_the_plan_refuses_chat_rendered_scores_on_a_legacy_completions_api() -> None:
    base = ("model=[openai_compatible]", "benchmark=[arc_challenge]", "method=[heldout_accuracy]", "corpus=none",
            "methods.heldout_accuracy.chat=true")  # fmt: skip
    with pytest.raises(ConfigError) as err:
        plan_of(*base, "models.openai_compatible.api=openai")
    message = str(err.value)
    assert "methods.heldout_accuracy.chat" in message and "models.openai_compatible.api=vllm" in message
    assert plan_of(*base, "models.openai_compatible.api=vllm").methods["heldout_accuracy"]  # the server renders it
    with pytest.raises(ConfigError, match=r"methods\.heldout_accuracy\.chat: both scores"):  # both forms: the same
        plan_of(*base[:-1], "methods.heldout_accuracy.chat=both", "models.openai_compatible.api=openai")


def test_the_plan_checks_windows_against_the_server_context_or_asks_for_it() -> None:
    base = ("model=[openai_compatible]", "benchmark=[synthetic_facts]", "method=[perplexity]", "corpus=none")
    with pytest.raises(ConfigError, match=r"methods\.perplexity\.context_len: 2048 .* 1023"):
        plan_of(*base, "models.openai_compatible.max_model_len=1024")
    plan = plan_of(*base)  # the server's context unknown: a warning naming the key to set
    assert any("models.openai_compatible.max_model_len" in w for w in plan.warnings)


def test_the_cell_hash_holds_the_variable_name_not_the_key(monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, "s3cr3t-value-never-hashed")
    plan = plan_of("model=[openai_compatible]", f"models.openai_compatible.api_key_env={SECRET_ENV}",
                   "benchmark=[synthetic_facts]", "method=[perplexity]", "corpus=none")  # fmt: skip
    assert plan.models["openai_compatible"].engine["api_key_env"] == SECRET_ENV
    assert "s3cr3t" not in json.dumps(plan.models["openai_compatible"].engine, default=str)
    before = plan.cell_hash(plan.cells[0])
    monkeypatch.setenv(SECRET_ENV, "another-key")
    assert plan.cell_hash(plan.cells[0]) == before  # a new key is the same model: cells are reused


def test_only_a_refusal_for_want_of_a_chat_template_switches_to_raw_text() -> None:
    from contamray.engines.http import says_no_chat_template

    vllm = ('{"error": {"message": "As of transformers v4.44, default chat template is no longer allowed, so you must '
            'provide a chat template if the tokenizer does not define one.", "type": "BadRequestError", "code": 400}}')
    assert says_no_chat_template(400, vllm)
    assert says_no_chat_template(400, "Cannot use chat template functions because tokenizer.chat_template is not set")
    assert not says_no_chat_template(500, vllm)  # a server error is retried, not read as a missing template
    assert not says_no_chat_template(400, "Refused request with untrusted chat template.")  # a template it has
    assert not says_no_chat_template(400, "This model's maximum context length is 1024 tokens")


def test_backoff_honours_retry_after_and_grows_with_jitter() -> None:
    import random

    from contamray.engines.http import backoff_seconds, retry_after_seconds

    rng = random.Random(0)
    waits = [backoff_seconds(k, 1.0, 60.0, None, rng) for k in range(5)]
    assert all(0.5 * 2**k <= w < 1.5 * 2**k for k, w in enumerate(waits))
    assert backoff_seconds(0, 1.0, 60.0, 7.0, rng) >= 7.0
    assert backoff_seconds(10, 1.0, 60.0, None, rng) == 60.0
    assert retry_after_seconds("3") == 3.0 and retry_after_seconds(None) is None
    assert 0 <= retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") < 1  # a past date: no wait


def test_the_rate_limiter_spaces_requests_and_keeps_tokens_per_minute(monkeypatch) -> None:
    """The limiter's decisions on a fake clock (no timing is measured): requests/s spaces starts, tokens/min
    makes a request wait until the tokens of the last 60 s leave room, corrected by the reported usage."""
    from contamray.engines import http

    clock = {"now": 1000.0}
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(round(seconds, 6))
        clock["now"] += seconds

    monkeypatch.setattr(http.time, "monotonic", lambda: clock["now"])
    monkeypatch.setattr(http.time, "sleep", sleep)
    spaced = http.RateLimiter(requests_per_second=4, tokens_per_minute=0)
    for _ in range(3):
        spaced.acquire(10)
    assert waits == [0.25, 0.25]
    waits.clear()
    budget = http.RateLimiter(requests_per_second=0, tokens_per_minute=100)
    budget.acquire(60)
    budget.correct(60, 30)  # the server says it used 30
    budget.acquire(60)  # 30 + 60 <= 100: no wait
    assert waits == []
    budget.acquire(60)  # 90 + 60 > 100: waits until the first minute's tokens leave the window
    assert waits and sum(waits) == pytest.approx(60.0)


# ----------------------------------------------------------------------------- the real server


@pytest.mark.slow
def test_greedy_completions_equal_the_local_engine(vllm_server: str, hf32) -> None:
    engine = http_engine(vllm_server)
    greedy = Sampling(max_tokens=16)
    for chat in (False, True):
        remote = engine.complete(PROMPTS, greedy, chat=chat, max_tokens=[16, 8, 12])
        local = hf32.complete(PROMPTS, greedy, chat=chat, max_tokens=[16, 8, 12])
        assert [c.text for c in remote] == [c.text for c in local]
        assert [c.sample_ids for c in remote] == [c.sample_ids for c in local]
        assert [(c.prompt_tokens, c.new_tokens) for c in remote] == [(c.prompt_tokens, c.new_tokens) for c in local]
        assert not any(c.error for c in remote)
    two = engine.complete(PROMPTS[:1], Sampling(max_tokens=6, n=2))[0]  # greedy n: one sample twice, as locally
    assert two.samples == [two.text] * 2 and two.new_tokens == 2 * len(two.sample_ids[0])
    seeded = Sampling(max_tokens=8, temperature=0.8, n=3, seed=5)
    sampled = engine.complete(PROMPTS[:1], seeded)[0]
    assert len(sampled.samples) == 3 and len(sampled.sample_ids) == 3
    assert engine.complete(PROMPTS[:1], seeded)[0].samples == sampled.samples  # the seed fixes them


@pytest.mark.slow
def test_guided_prompting_through_the_api_equals_the_local_engine(vllm_server: str, hf32, mirror_dir: Path) -> None:
    from contamray.benchmarks import load_records
    from contamray.methods.closed.guided_prompting import Config, GuidedPrompting
    from contamray.validate.calibrate import SharedEngines

    records = load_records("synthetic_facts", mirror_dir=mirror_dir).records[:4]
    cfg, method = Config(max_tokens=16), GuidedPrompting()
    assert all(r.chat for r in method.requests(records, cfg, 0, {}))  # the instructions go through the chat template
    remote, local = SharedEngines({"target": http_engine(vllm_server)}), SharedEngines({"target": hf32})
    rows_remote, rows_local = remote.run(method, records, cfg), local.run(method, records, cfg)
    outputs = {key: (o.text, o.num_tokens, o.error) for key, o in remote.cache.items()}
    assert outputs == {key: (o.text, o.num_tokens, o.error) for key, o in local.cache.items()}
    assert len(outputs) == 2 * len(records) and not any(error for _, _, error in outputs.values())
    assert json.dumps(rows_remote, sort_keys=True, default=str) == json.dumps(rows_local, sort_keys=True, default=str)


def test_a_chat_only_api_model_skips_the_scoring_methods_with_the_reason() -> None:
    """``api: openai_chat`` (GPT-3.5-turbo and other chat APIs): no prompt log-probabilities, so the plan skips
    the methods that score text on that model, with the reason; the generation methods keep their cells."""
    methods = "method=[guided_prompting,perplexity,sharded_likelihood,heldout_accuracy]"
    plan = plan_of("model=[openai_compatible]", "models.openai_compatible.api=openai_chat", "corpus=none",
                   "benchmark=[arc_challenge]", methods)  # fmt: skip
    assert [c.method for c in plan.cells] == ["guided_prompting"]
    reasons = {c.method: r for c, r in plan.skipped}
    assert set(reasons) == {"perplexity", "sharded_likelihood", "heldout_accuracy"}
    assert all("openai_chat" in r and "models.openai_compatible" in r for r in reasons.values())


@pytest.mark.slow
def test_a_chat_only_api_sends_every_prompt_as_a_chat_turn_and_cannot_score(vllm_server: str, hf32) -> None:
    engine = http_engine(vllm_server, api="openai_chat")
    greedy = Sampling(max_tokens=12)
    remote = engine.complete(PROMPTS, greedy, chat=False)  # raw text asked for: a chat-only model has none
    local = hf32.complete(PROMPTS, greedy, chat=True)
    assert [c.text for c in remote] == [c.text for c in local] and not any(c.error for c in remote)
    with pytest.raises(NotImplementedError, match="openai_chat serves chat completions only"):
        engine.score(TEXTS)


@pytest.mark.slow
@pytest.mark.parametrize("api", ["vllm", "openai"])
def test_prompt_logprobs_equal_the_local_engine(vllm_server: str, hf32, api: str) -> None:
    engine = http_engine(vllm_server, api=api)
    remote, local = engine.score(TEXTS), hf32.score(TEXTS)
    for r, lo in zip(remote, local, strict=True):
        assert not r.error and r.num_tokens == lo.num_tokens
        assert max(abs(a - b) for a, b in zip(r.token_logprobs, lo.token_logprobs)) <= CROSS_TOL
        assert r.token_ids == (lo.token_ids if api == "vllm" else [])  # echo gives token strings, not ids
    if api == "vllm":  # rolling windows over the server's token ids, as the local engines window
        remote, local = engine.score(TEXTS, context_len=8, stride=4), hf32.score(TEXTS, context_len=8, stride=4)
        for r, lo in zip(remote, local, strict=True):
            assert r.windows == lo.windows and r.token_ids == lo.token_ids
            assert max(abs(a - b) for a, b in zip(r.token_logprobs, lo.token_logprobs)) <= CROSS_TOL
        # a reply after the user turn the server renders in the model's chat template, as the local engines read it
        question, replies = ["What is the capital of France?"] * 2, ["", "Paris"]
        for r, lo in zip(engine.score(question, replies=replies), hf32.score(question, replies=replies), strict=True):
            assert not r.error and r.token_ids == lo.token_ids and r.prompt_tokens == lo.prompt_tokens > 0
            assert max(abs(a - b) for a, b in zip(r.token_logprobs, lo.token_logprobs)) <= CROSS_TOL
    else:
        with pytest.raises(NotImplementedError, match="chat-rendered scores need token ids"):
            engine.score(TEXTS[:1], replies=["Paris"])
    with pytest.raises(NotImplementedError, match="Min-K%"):
        engine.score(TEXTS, with_vocab_stats=True)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["429", "500", "sleep"])
def test_transient_failures_are_retried_then_the_request_succeeds(vllm_server: str, fault: str) -> None:
    proxy = FaultProxy(vllm_server, [fault, fault], sleep_s=3.0)
    try:
        engine = http_engine(proxy.url, max_retries=2, backoff_s=0.05, timeout_s=1.5, max_model_len=1024)
        completion = engine.complete(PROMPTS[:1], Sampling(max_tokens=4))[0]
        assert not completion.error and completion.text
        assert proxy.completions() == 3  # two failures, then the answer
        scores = engine.score(TEXTS[:1])[0]
        assert not scores.error and scores.num_tokens > 0
    finally:
        proxy.close()


@pytest.mark.slow
def test_more_failures_than_retries_fail_the_row_with_the_reason(vllm_server: str) -> None:
    from contamray.pipeline.actors import answer_requests

    proxy = FaultProxy(vllm_server, ["429", "500", "sleep", "429"], sleep_s=3.0)
    try:
        engine = http_engine(proxy.url, max_retries=2, backoff_s=0.05, timeout_s=1.5, max_model_len=1024,
                             max_concurrent_requests=1)  # one at a time: the first request meets three faults
        requests = [Request(key=k, record_ids=(k,), kind="generate", text=PROMPTS[0], sampling=Sampling(max_tokens=4))
                    for k in "ab"]  # fmt: skip
        outputs = answer_requests(engine, requests[:1])
        error = outputs[0].error
        assert "after 3 attempt(s)" in error and "HTTP 429" in error and "HTTP 500" in error and "timeout" in error
        assert not outputs[0].text
        assert proxy.completions() == 3
        later = answer_requests(engine, requests[1:])  # the next request meets one 429, then gets through
        assert not later[0].error and later[0].text
    finally:
        proxy.close()


@pytest.mark.slow
def test_a_repeated_request_is_answered_from_the_cache(vllm_server: str, tmp_path: Path) -> None:
    proxy = FaultProxy(vllm_server)
    try:
        first = http_engine(proxy.url, tmp_path, max_model_len=1024)
        answer = first.complete(PROMPTS, Sampling(max_tokens=6))
        scores = first.score(TEXTS)
        sent = proxy.completions()
        again = http_engine(proxy.url, tmp_path, max_model_len=1024)  # a re-run: a new engine, the same cache
        assert [c.text for c in again.complete(PROMPTS, Sampling(max_tokens=6))] == [c.text for c in answer]
        assert [s.token_logprobs for s in again.score(TEXTS)] == [s.token_logprobs for s in scores]
        assert proxy.completions() == sent  # nothing paid twice
        assert len(list((tmp_path / "http").rglob("*.json"))) >= len(PROMPTS) + len(TEXTS)
    finally:
        proxy.close()


@pytest.mark.slow
def test_a_run_through_the_api_never_writes_the_key(vllm_server: str, tmp_path: Path, mirror_dir: Path) -> None:
    """``python -m contamray.run`` with an http model: the key reaches the server, and no file of the
    run's output directory or of the response cache, nor the run's console output, holds it."""
    secret = "ctr-" + os.urandom(12).hex()
    proxy = FaultProxy(vllm_server, ["429"])  # one retried request in the run too
    out, cache = tmp_path / "run", tmp_path / "cache"
    env = dict(os.environ, CONTAMRAY_CACHE=str(cache), CONTAMRAY_LOG="DEBUG", **{SECRET_ENV: secret})
    env.pop("RAY_ADDRESS", None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    args = [
        sys.executable, "-m", "contamray.run", "model=[openai_compatible]", "benchmark=[synthetic_facts]",
        "method=[guided_prompting,perplexity]", "methods.guided_prompting.max_tokens=8", "run.limit=4",
        "corpus=none", f"models.openai_compatible.base_url={proxy.url}",
        f"models.openai_compatible.served_model={SERVED}", f"models.openai_compatible.api_key_env={SECRET_ENV}",
        "models.openai_compatible.backoff_s=0.05", "models.openai_compatible.max_model_len=1024",
        "methods.perplexity.context_len=512", "methods.perplexity.stride=256", f"data.mirror_dir={mirror_dir}",
        f"hydra.run.dir={out}", "ray.num_cpus=2",
    ]  # fmt: skip
    try:
        proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    finally:
        proxy.close()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert {auth for path, auth in proxy.seen if "completions" in path} == {f"Bearer {secret}"}
    import pandas as pd

    examples = pd.read_parquet(out / "examples.parquet")
    assert len(examples) and not examples["error"].fillna("").astype(bool).any()
    assert (examples["engine_tokens"] > 0).all()  # the cost of each example, as local engines record it
    written = [p for root in (out, cache) for p in root.rglob("*") if p.is_file()]
    assert any(p.suffix == ".json" and "http" in p.parts for p in written)  # the cache was written
    assert any(SECRET_ENV.encode() in p.read_bytes() for p in written)  # the variable's name is in the config
    leaks = [str(p) for p in written if secret.encode() in p.read_bytes()]
    assert not leaks, leaks
    assert secret not in proc.stdout and secret not in proc.stderr


@pytest.mark.slow
def test_a_server_without_a_chat_template_gets_the_raw_text_as_the_local_engine_reads_it(templateless, caplog) -> None:
    from contamray.engines.base import has_chat_template
    from contamray.engines.hf import HFEngine

    url, path = templateless
    local = HFEngine(path, dtype="float32", batch_size=4)
    assert not has_chat_template(local.tokenizer)
    refused = httpx.post(f"{url}/tokenize", json={"model": SERVED, "messages": [{"role": "user", "content": "Hi"}],
                                                  "add_generation_prompt": True})  # fmt: skip
    assert refused.status_code == 400 and "chat template" in refused.text  # the server cannot render a chat turn

    engine = http_engine(url)
    question, replies = ["What is the capital of France?"] * 2, ["", "Paris"]
    with caplog.at_level(logging.WARNING, logger="contamray.engines.http"):
        remote = engine.score(question, replies=replies)
    assert caplog.text.count("has no chat template") == 1  # warned once, not per request
    lo = local.score(question, replies=replies)
    for r, x in zip(remote, lo, strict=True):
        assert not r.error and r.token_ids == x.token_ids and r.prompt_tokens == x.prompt_tokens > 0
        assert max(abs(a - b) for a, b in zip(r.token_logprobs, x.token_logprobs)) <= CROSS_TOL
    plain = engine.score(["What is the capital of France? Paris"])[0]  # the raw text, the reply after a space
    assert remote[1].token_ids == plain.token_ids

    fresh = http_engine(url)  # the first chat completion's own refusal switches it to raw text
    greedy = Sampling(max_tokens=12)
    got, want = fresh.complete(PROMPTS, greedy, chat=True), local.complete(PROMPTS, greedy, chat=True)
    assert not any(c.error for c in got)
    assert [(c.text, c.sample_ids) for c in got] == [(c.text, c.sample_ids) for c in want]
    assert [c.text for c in got] == [c.text for c in fresh.complete(PROMPTS, greedy)]  # = the raw prompts'

    only = http_engine(url, api="openai_chat").complete(PROMPTS[:1], greedy)[0]  # no raw completion to fall back on
    assert only.error and "chat template" in only.error and not only.text

"""The HTTP backend: a model behind any OpenAI-compatible server (vLLM's own server, a Ray Serve LLM app,
a hosted API), probed over HTTP instead of loaded here (black-box probing, as the guided-prompting paper
did with GPT-4 and GPT-3.5).

What it sends (``httpx``, one request per prompt, at most ``max_concurrent_requests`` at once):

- ``complete``: ``POST /v1/completions`` with ``model``, ``prompt``, ``max_tokens`` (each prompt its
  own), ``temperature``, ``top_p``, ``n`` (the samples of ``Sampling.n`` in one request), ``stop`` and,
  when sampling, ``seed``; with ``chat=True`` ``POST /v1/chat/completions`` with the text as one user
  message, so the *server* applies the model's chat template (vLLM renders it with the generation
  prompt and without extra special tokens, as ``base.encode_prompts`` does locally). Read back:
  ``choices[i].text`` / ``choices[i].message.content`` (ordered by ``index``), ``usage.prompt_tokens``
  and ``usage.completion_tokens`` (the cost, ``Completion.prompt_tokens`` / ``new_tokens``). With
  ``api: vllm`` the request also asks for ``return_token_ids`` and each sample's generated ids are
  ``Completion.sample_ids`` (end-of-sequence left out, as the local engines do, and ``new_tokens`` is
  their count); a server that does not return ids (``api: openai``) gives ``sample_ids = []``.
- ``score``: prompt log-probabilities, the same positions the local engines score (every token given
  its prefix, the first excluded). ``api: vllm``: the text is tokenised by the server
  (``POST /tokenize``, special tokens added as locally), cut to the context (``TokenScores.truncated``)
  or split into rolling windows over its ids (``context_len`` / ``stride``, ``base.score_rolling``);
  a chat-rendered score (``replies``) is the user turn tokenised by the server through its chat template
  (``POST /tokenize`` with ``messages`` and the generation prompt) and the reply's ids after it,
  and each id sequence is sent as the prompt of ``POST /v1/completions`` with ``max_tokens: 1`` and
  vLLM's ``prompt_logprobs: 0``: ``choices[0].prompt_logprobs[i][str(id_i)].logprob``.
  ``api: openai``: ``echo: true`` + ``logprobs: 0`` + ``max_tokens: 1`` on the text (the legacy OpenAI
  way, also served by vLLM): ``choices[0].logprobs.token_logprobs[1:usage.prompt_tokens]``; no token
  ids, no rolling windows or chat-rendered scores (the ids are the server's), and a text longer than the
  context fails.
- ``api: openai_chat``: a chat-only model (GPT-3.5-turbo, GPT-4 and most hosted chat APIs): every generation
  is ``POST /v1/chat/completions``, a prompt a method meant as raw text included (sent as one user
  message: a chat-only model has no raw completion, so its chat template always applies); there is no
  scoring (no prompt log-probabilities), so the plan skips the methods that score text on such a model
  (``Method.scores_text``), with the reason in the report.
- a model without a chat template (a base model's server): the server refuses to render a chat turn (vLLM answers
  400, "... you must provide a chat template if the tokenizer does not define one"). On the first such answer the
  engine warns once and, as the local engines do (``base.encode_prompts``, ``base.plain_reply``), sends chat requests
  as the raw text from then on: a generation as ``POST /v1/completions`` with the prompt, a chat-rendered score as the
  text's ids (special tokens added) and the reply's after a space - the local engines' ids exactly. Not with
  ``api: openai_chat``, which has no raw completion: its error stays the row's.
- the model's context: ``max_model_len`` from the config, else ``GET /v1/models`` (vLLM reports
  ``max_model_len``); like vLLM locally, one position is kept for the generated token.

What it cannot do: vocabulary statistics (``with_vocab_stats``, Min-K%++): an API returns the
log-probabilities of chosen tokens (at most the top few), never the mean and standard deviation over
the vocabulary; the plan refuses Min-K%++ on an http model. Prompts are sent as text: a prompt longer
than the server's context fails with the server's reason (nothing is cut here, ``truncated`` is 0).

Retry policy: a request that times out, cannot connect, or is answered 429 or 5xx is sent again, up to
``max_retries`` more times, after ``backoff_s * 2**k`` seconds (k = retries so far) times a random
jitter in [0.5, 1.5), capped at ``backoff_max_s``; a ``Retry-After`` header (seconds or an HTTP date)
is honoured (the wait is at least what it says). Other statuses (400, 401, 404 ...) are not retried.
When the attempts are used up the request fails with the reason (statuses and attempts): the
``Completion`` / ``TokenScores`` carries ``error``, its row is a failed row, and the run goes on.

Limits: ``max_concurrent_requests`` requests in flight per engine (a Serve replica), at most
``requests_per_second`` requests started per second and ``tokens_per_minute`` tokens (prompt estimate
plus ``max_tokens * n``, corrected by the usage the server reports) in any 60 s; 0 = no limit.

The API key is read from the environment variable the config names (``api_key_env``) when the engine is
built, kept only in the client's ``Authorization`` header, and scrubbed from every error message. It is
never written: configs, cell hashes and Serve application names hold the variable's *name*.

Response cache: each successful answer is stored under ``$CONTAMRAY_CACHE/http/`` (default
``~/.cache/contamray/http``) as ``<sha256>.json``, the digest of the base URL, the path and the request
body (the model is in the body; the key never is), so a re-run or a resumed run never pays for the same
completion twice (``cache: false`` turns it off). Sampled requests carry their seed in the body, so a
cached sample is the one that seed gave.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from contamray.engines import ENV_NAME, HTTP_APIS
from contamray.engines.base import (
    Completion,
    TokenScores,
    check_window,
    keep_head,
    mark_replies,
    plain_reply,
    score_rolling,
    token_limits,
    warn_truncated,
)
from contamray.engines.wire import Sampling, guess_tokens

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429}) | frozenset(range(500, 600))
VOCAB_STATS_UNSUPPORTED = (
    "with_vocab_stats (the vocabulary mean/std of log p that Min-K%++ needs) is not available from the http "
    "backend: an OpenAI-compatible API returns chosen-token log-probabilities only. Probe a local copy of the "
    "model with backend 'hf' for Min-K%++"
)


CHAT_ONLY_NO_SCORES = (
    "{name}: {where}.api=openai_chat serves chat completions only, which return no prompt log-probabilities: "
    "text cannot be scored (the plan skips the methods that score on such a model)"
)


class RequestFailed(Exception):
    """A request that failed for good (after its retries, or with a status that is not retried)."""


class NoChatTemplate(RequestFailed):
    """The server cannot render a chat turn: its model has no chat template (a 400 answer that says so)."""


NO_TEMPLATE_PHRASES = ("must provide a chat template", "chat_template is not set", "no chat template",
                       "does not have a chat template")  # fmt: skip


def says_no_chat_template(status: int, text: str) -> bool:
    """Whether an answer is a server's refusal to render a chat turn for want of a template (vLLM's 400: "...
    you must provide a chat template if the tokenizer does not define one"; transformers' "tokenizer.chat_template
    is not set"), not another 400 that mentions templates."""
    lowered = text.lower()
    return status == 400 and any(phrase in lowered for phrase in NO_TEMPLATE_PHRASES)


def http_cache_dir() -> Path:
    """``$CONTAMRAY_CACHE/http`` (default ``~/.cache/contamray/http``), as the model cache resolves it."""
    from contamray.engines.models import cache_root

    return cache_root().parent / "http"


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header in seconds (it may be a number or an HTTP date); None when absent or bad."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_seconds(retry: int, base: float, cap: float, retry_after: float | None, rng: random.Random) -> float:
    """Wait before retry number ``retry`` (0-based): exponential with jitter, at least ``Retry-After``."""
    wait = min(cap, base * (2**retry) * rng.uniform(0.5, 1.5))
    return max(wait, retry_after) if retry_after is not None else wait


class RateLimiter:
    """Requests per second and tokens per minute (0 = unlimited), shared by the engine's threads."""

    def __init__(self, requests_per_second: float, tokens_per_minute: float) -> None:
        self.interval = 1.0 / requests_per_second if requests_per_second > 0 else 0.0
        self.tokens_per_minute = float(tokens_per_minute)
        self.lock = threading.Lock()
        self.next_start = 0.0
        self.spent: deque[tuple[float, float]] = deque()  # (time, tokens) in the last 60 s

    def acquire(self, tokens: float) -> None:
        """Wait until a request of about ``tokens`` tokens may start."""
        if self.interval:
            with self.lock:
                now = time.monotonic()
                start = max(now, self.next_start)
                self.next_start = start + self.interval
            if start > now:
                time.sleep(start - now)
        while self.tokens_per_minute > 0:
            with self.lock:
                now = time.monotonic()
                while self.spent and now - self.spent[0][0] >= 60.0:
                    self.spent.popleft()
                used = sum(t for _, t in self.spent)
                if not self.spent or used + tokens <= self.tokens_per_minute:
                    self.spent.append((now, tokens))
                    return
                wait = 60.0 - (now - self.spent[0][0])
            time.sleep(max(0.01, wait))

    def correct(self, estimated: float, actual: float) -> None:
        """Count what the server reports a request used instead of its estimate."""
        if self.tokens_per_minute > 0 and actual != estimated:
            with self.lock:
                self.spent.append((time.monotonic(), actual - estimated))


class ResponseCache:
    """Successful answers by a digest of (base URL, path, request body); files written atomically."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    @staticmethod
    def key(base_url: str, path: str, body: dict[str, Any]) -> str:
        blob = json.dumps({"base_url": base_url, "path": path, "body": body}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _file(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        if self.root is None:
            return None
        try:
            return json.loads(self._file(key).read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, answer: dict[str, Any]) -> None:
        if self.root is None:
            return
        path = self._file(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(answer))
            os.replace(tmp, path)
        except OSError as err:  # a cache that cannot be written costs money later, not correctness
            log.warning("http response cache: cannot write %s (%s)", path, err)


def _generated_ids(choice: dict[str, Any]) -> list[int]:
    """A choice's generated ids, the end-of-sequence token left out (as ``VLLMEngine._generated_ids``)."""
    ids = [int(t) for t in choice.get("token_ids") or []]
    ended_on_eos = choice.get("finish_reason") == "stop" and choice.get("stop_reason") is None
    return ids[:-1] if ended_on_eos and ids else ids


def _choices(answer: dict[str, Any]) -> list[dict[str, Any]]:
    choices = sorted(answer.get("choices") or [], key=lambda c: int(c.get("index", 0)))
    if not choices:
        raise RequestFailed(f"the server's answer has no choices: {json.dumps(answer)[:300]}")
    return choices


class HTTPEngine:
    """Engine for a model behind an OpenAI-compatible server (see the module docstring)."""

    concurrent = True  # thread-safe: a Serve replica answers several batches at once (serve/hosting.py)

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str = "",
        api: str = "vllm",
        max_concurrent_requests: int = 8,
        requests_per_second: float = 0.0,
        tokens_per_minute: float = 0.0,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        backoff_max_s: float = 60.0,
        max_model_len: int | None = None,
        cache: bool = True,
        cache_dir: str | Path | None = None,
        seed: int = 0,
        name: str = "",
        where: str = "model",
    ) -> None:
        if api not in HTTP_APIS:
            raise ValueError(f"{where}.api: {api!r} is not one of {', '.join(HTTP_APIS)}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api = api
        self.name = name or f"http:{model}"
        self.where = where
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.backoff_max_s = float(backoff_max_s)
        self._secret = _read_key(api_key_env, where)
        headers = {"Authorization": f"Bearer {self._secret}"} if self._secret else {}
        self.client = httpx.Client(base_url=self.base_url, headers=headers, timeout=float(timeout_s))
        self.pool = ThreadPoolExecutor(max_workers=int(max_concurrent_requests), thread_name_prefix=self.name)
        self.limiter = RateLimiter(requests_per_second, tokens_per_minute)
        self.cache = ResponseCache(Path(cache_dir) if cache_dir else http_cache_dir()) if cache else ResponseCache(None)
        self.rng = random.Random(seed)
        self._configured_len = int(max_model_len) if max_model_len else None
        self._model_len: int | None = None
        self._len_lock = threading.Lock()
        self._raw_chat = False  # the server said its model has no chat template: chat requests go as raw text
        self._raw_chat_lock = threading.Lock()

    def __repr__(self) -> str:  # never the key
        return f"HTTPEngine(name={self.name!r}, base_url={self.base_url!r}, model={self.model!r})"

    # ------------------------------------------------------------------ transport
    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def post(self, path: str, body: dict[str, Any], tokens: float = 0.0, billable: bool = True) -> dict[str, Any]:
        """The JSON answer to ``body`` at ``path``: from the cache, or sent (rate-limited, retried) and cached."""
        key = ResponseCache.key(self.base_url, path, body)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        answer = self._send(path, body, tokens if billable else None)
        if billable:
            used = (answer.get("usage") or {}).get("total_tokens")
            if used is not None:
                self.limiter.correct(tokens, float(used))
        self.cache.put(key, answer)
        return answer

    def _send(self, path: str, body: dict[str, Any], tokens: float | None) -> dict[str, Any]:
        """POST with the retry policy of the module docstring; raises ``RequestFailed`` with the reason.
        Every attempt of a billable request (``tokens`` not None) waits for the rate limits."""
        history: list[str] = []
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            retry_after = None
            if tokens is not None:
                self.limiter.acquire(tokens)
            try:
                response = self.client.post(path, json=body)
            except httpx.TimeoutException as err:
                history.append(f"timeout ({type(err).__name__})")
            except httpx.TransportError as err:
                history.append(f"connection error ({type(err).__name__}: {self._scrub(str(err))[:200]})")
            else:
                if response.status_code < 300:
                    try:
                        return response.json()
                    except ValueError:
                        history.append("the answer is not JSON")
                        raise RequestFailed(self._failure(path, history, attempt + 1, retried=False)) from None
                reason = f"HTTP {response.status_code} {response.reason_phrase}: {self._scrub(response.text)[:300]}"
                history.append(reason)
                if response.status_code not in RETRY_STATUSES:
                    refused = says_no_chat_template(response.status_code, response.text)
                    failed = NoChatTemplate if refused else RequestFailed
                    raise failed(self._failure(path, history, attempt + 1, retried=False))
                retry_after = retry_after_seconds(response.headers.get("retry-after"))
            if attempt + 1 < attempts:
                time.sleep(backoff_seconds(attempt, self.backoff_s, self.backoff_max_s, retry_after, self.rng))
        raise RequestFailed(self._failure(path, history, attempts))

    def _failure(self, path: str, history: list[str], attempts: int, retried: bool = True) -> str:
        how = "not retried (the status is not a transient one)" if not retried else f"after {attempts} attempt(s)"
        return self._scrub(f"{self.name}: POST {path} failed {how}: " + "; ".join(history))

    def _without_template(self, err: NoChatTemplate) -> None:
        """From now on send chat requests as raw text (the server's model has no chat template); warn once, whichever
        of the engine's threads meet the refusal first."""
        with self._raw_chat_lock:
            if self._raw_chat:
                return
            self._raw_chat = True
        log.warning("%s: the server's model has no chat template (%s); chat requests use the raw text (a reply after a "
                    "space), as the local engines do", self.name, str(err)[-160:])  # fmt: skip

    def _map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``fn`` over ``items`` on the engine's pool (its concurrency limit), results in order."""
        return list(self.pool.map(fn, items))

    # ------------------------------------------------------------------ the model's context
    @property
    def max_model_len(self) -> int | None:
        """The model's context in tokens: the config's ``max_model_len``, else ``GET /v1/models``."""
        if self._configured_len:
            return self._configured_len
        with self._len_lock:
            if self._model_len is None:
                self._model_len = self._served_len() or 0
        return self._model_len or None

    @property
    def max_context(self) -> int:
        """Tokens a scored text may hold: the context minus the one generated token (0 = unknown)."""
        return (self.max_model_len or 1) - 1

    def _served_len(self) -> int | None:
        try:
            response = self.client.get("/v1/models")
            response.raise_for_status()
            models = response.json().get("data") or []
        except (httpx.HTTPError, ValueError) as err:
            log.warning("%s: GET /v1/models failed (%s); set %s.max_model_len", self.name, self._scrub(str(err)),
                        self.where)  # fmt: skip
            return None
        for entry in models:
            if entry.get("id") == self.model and entry.get("max_model_len"):
                return int(entry["max_model_len"])
        return None

    # ------------------------------------------------------------------ tokens
    def _tokenize(self, text: str) -> list[int]:
        if self.api != "vllm":
            raise RequestFailed(f"{self.name}: token ids need the server's /tokenize (api: vllm); "
                                f"this model is configured with {self.where}.api={self.api}")  # fmt: skip
        answer = self.post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": True},
                           billable=False)  # fmt: skip
        return [int(t) for t in answer["tokens"]]

    def _tokenize_reply(self, prompt: str, reply: str) -> tuple[list[int], list[int]]:
        """``prompt`` as one user turn in the server's chat template with the generation prompt, and ``reply``'s ids
        (no special tokens) to follow it: ``base.with_replies`` on the server's tokenizer (``api: vllm``, as ``score``
        asks); the turn's length says where the reply's scores start (``TokenScores.prompt_tokens``). A model without a
        chat template: the raw text's ids and the reply after a space (``base.scored_ids``' fallback)."""
        turn: list[int] | None = None
        if not self._raw_chat:
            try:
                turn = [int(t) for t in self.post("/tokenize", {
                    "model": self.model, "messages": [{"role": "user", "content": prompt}],
                    "add_generation_prompt": True, "add_special_tokens": False}, billable=False)["tokens"]]  # fmt: skip
            except NoChatTemplate as err:
                self._without_template(err)
        if turn is None:
            turn, reply = self._tokenize(prompt), plain_reply(reply)
        tail = self.post("/tokenize", {"model": self.model, "prompt": reply, "add_special_tokens": False},
                         billable=False) if reply else {"tokens": []}  # fmt: skip
        return turn, [int(t) for t in tail["tokens"]]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids as the server's tokenizer gives them, special tokens included (``api: vllm``)."""
        return self._map(self._tokenize, list(texts))

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.encode(texts)]

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: list[str], sampling: Sampling, chat: bool = False) -> list[str]:
        """The new text of each prompt (see ``complete``)."""
        return [c.text for c in self.complete(prompts, sampling, chat=chat)]

    def complete(
        self, prompts: list[str], sampling: Sampling, chat: bool = False, max_tokens: Sequence[int] | None = None
    ) -> list[Completion]:
        """One completion per prompt, one request each; a request that fails is a ``Completion`` with
        ``error`` (the others are unaffected)."""
        limits = token_limits(len(prompts), sampling, max_tokens, self.max_model_len or 2**31)
        jobs = [self._completion_body(p, sampling, chat, m) for p, m in zip(prompts, limits, strict=True)]
        return self._map(self._complete_one, jobs)

    def _completion_body(self, prompt: str, sampling: Sampling, chat: bool, limit: int) -> tuple[str, dict, int]:
        """(path, body, copies): greedy samples are one sample ``n`` times (as the local engines give them;
        vLLM refuses ``n > 1`` without sampling), so a greedy request asks for one and it is copied."""
        greedy = sampling.temperature <= 0
        n = max(1, int(sampling.n))
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": int(limit),
            "temperature": 0.0 if greedy else float(sampling.temperature),
            "top_p": 1.0 if greedy else float(sampling.top_p),
            "n": 1 if greedy else n,
        }
        stops = [s for s in sampling.stop if s]
        if stops:
            body["stop"] = stops
        if not greedy:
            body["seed"] = int(sampling.seed)
        if self.api == "vllm":
            body["return_token_ids"] = True
        chat = (chat and not self._raw_chat) or self.api == "openai_chat"  # a chat-only model has no raw completion
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        path = "/v1/chat/completions" if chat else "/v1/completions"
        return path, body, n if greedy else 1

    def _complete_one(self, job: tuple[str, dict, int]) -> Completion:
        path, body, copies = job
        text = body.get("prompt") or body["messages"][0]["content"]
        try:
            choices = _choices(answer := self.post(path, body, guess_tokens(text, body["max_tokens"] * body["n"])))
        except NoChatTemplate as err:
            if self.api == "openai_chat":  # no raw completion to fall back on
                return Completion(text="", error=str(err))
            self._without_template(err)
            raw = {k: v for k, v in body.items() if k != "messages"} | {"prompt": text}
            return self._complete_one(("/v1/completions", raw, copies))
        except RequestFailed as err:
            return Completion(text="", error=str(err))
        chat = path.endswith("chat/completions")
        texts = [str((c.get("message") or {}).get("content") or "") if chat else str(c.get("text") or "")
                 for c in choices] * copies  # fmt: skip
        has_ids = all(c.get("token_ids") is not None for c in choices)
        ids = [_generated_ids(c) for c in choices] * copies if has_ids else []
        usage = answer.get("usage") or {}
        new_tokens = sum(len(x) for x in ids) if ids else int(usage.get("completion_tokens") or 0) * copies
        return Completion(text=texts[0], prompt_tokens=int(usage.get("prompt_tokens") or 0), new_tokens=new_tokens,
                          samples=texts, sample_ids=ids)  # fmt: skip

    # ------------------------------------------------------------------ scoring
    def score(
        self,
        texts: list[str],
        with_vocab_stats: bool = False,
        context_len: int = 0,
        stride: int = 0,
        replies: Sequence[str] | None = None,
    ) -> list[TokenScores]:
        """Prompt log-probabilities of each text (module docstring); a failed text has ``error``. With ``replies``,
        each text is a user turn the server renders in the model's chat template (``POST /tokenize`` with
        ``messages``, the generation prompt added) and its reply's ids follow (``api: vllm`` only)."""
        if with_vocab_stats:
            raise NotImplementedError(VOCAB_STATS_UNSUPPORTED)
        if self.api == "openai_chat":
            raise NotImplementedError(CHAT_ONLY_NO_SCORES.format(name=self.name, where=self.where))
        if self.api == "openai":
            for needs, what in ((context_len, "rolling windows"), (replies is not None, "chat-rendered scores")):
                if needs:
                    raise NotImplementedError(f"{self.name}: {what} need token ids from the server's /tokenize; "
                                              f"set {self.where}.api=vllm for a vLLM server")  # fmt: skip
            return self._map(self._score_echo, list(texts))
        jobs: list[Any] = list(texts) if replies is None else list(zip(texts, replies, strict=True))
        encoded = self._map(self._tokenize_or_error, jobs)  # ids, (turn, reply) ids, or why it failed
        failed = {i: e for i, e in enumerate(encoded) if isinstance(e, str)}
        turns = [len(e[0]) if isinstance(e, tuple) else 0 for e in encoded]
        ids = [_joined(e) for e in encoded]
        limit = self.max_context if self.max_model_len else 2**31  # unknown context: nothing is cut here
        if context_len:
            check_window(context_len, stride, limit, self.name)
            results = score_rolling(self.score_ids, ids, context_len, stride, False)
        else:
            ids, truncated = keep_head(ids, limit)
            warn_truncated(self.name, "texts", truncated, limit, "scored on their first tokens")
            results = self.score_ids(ids)
            for res, n in zip(results, truncated):
                res.truncated = n
        for i, error in failed.items():
            results[i] = TokenScores(token_logprobs=[], error=error)
        return mark_replies(results, turns)

    def _tokenize_or_error(self, job: str | tuple[str, str]) -> list[int] | tuple[list[int], list[int]] | str:
        try:
            return self._tokenize(job) if isinstance(job, str) else self._tokenize_reply(*job)
        except (RequestFailed, KeyError, TypeError, ValueError) as err:
            return str(err)

    def score_ids(self, encoded: list[list[int]], with_vocab_stats: bool = False) -> list[TokenScores]:
        """Scores of token id sequences (each at most the model's context), one request each."""
        if with_vocab_stats:
            raise NotImplementedError(VOCAB_STATS_UNSUPPORTED)
        if self.api == "openai_chat":
            raise NotImplementedError(CHAT_ONLY_NO_SCORES.format(name=self.name, where=self.where))
        return self._map(self._score_ids_one, encoded)

    def _score_ids_one(self, ids: list[int]) -> TokenScores:
        if len(ids) < 2:
            return TokenScores(token_logprobs=[])
        body = {"model": self.model, "prompt": list(ids), "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        try:
            entries = _choices(self.post("/v1/completions", body, len(ids) + 1))[0].get("prompt_logprobs")
            if not entries or len(entries) != len(ids):
                raise RequestFailed(f"{self.name}: the server returned {len(entries or [])} prompt log-probabilities "
                                    f"for {len(ids)} tokens (does it support vLLM's prompt_logprobs? else "
                                    f"set {self.where}.api=openai to score with echo + logprobs)")  # fmt: skip
            values = [float(entries[pos][str(ids[pos])]["logprob"]) for pos in range(1, len(ids))]
        except RequestFailed as err:
            return TokenScores(token_logprobs=[], error=str(err))
        except (KeyError, TypeError, ValueError) as err:
            return TokenScores(token_logprobs=[], error=f"{self.name}: unexpected prompt_logprobs ({err!r})")
        return TokenScores(token_logprobs=values, token_ids=list(ids[1:]))

    def _score_echo(self, text: str) -> TokenScores:
        body = {"model": self.model, "prompt": text, "max_tokens": 1, "temperature": 0.0, "echo": True, "logprobs": 0}
        try:
            answer = self.post("/v1/completions", body, guess_tokens(text, 1))
            n_prompt = int((answer.get("usage") or {})["prompt_tokens"])
            logprobs = _choices(answer)[0]["logprobs"]["token_logprobs"][:n_prompt]
            values = [float(x) for x in logprobs[1:]]
        except RequestFailed as err:
            return TokenScores(token_logprobs=[], error=str(err))
        except (KeyError, TypeError, ValueError) as err:
            return TokenScores(token_logprobs=[], error=f"{self.name}: the answer has no echoed logprobs ({err!r})")
        return TokenScores(token_logprobs=values)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def _joined(encoded: list[int] | tuple[list[int], list[int]] | str) -> list[int]:
    """The ids ``score`` reads from one of ``_tokenize_or_error``'s answers (none for a failed one)."""
    if isinstance(encoded, str):
        return []
    return encoded[0] + encoded[1] if isinstance(encoded, tuple) else encoded


def _read_key(variable: str, where: str) -> str:
    """The API key from the environment variable ``variable`` ('' when none is named)."""
    if not variable:
        return ""
    if not ENV_NAME.match(variable):
        raise ValueError(f"{where}.api_key_env must be the NAME of an environment variable (letters, digits, _), "
                         "not the key itself (the value is not shown here)")  # fmt: skip
    value = os.environ.get(variable, "")
    if not value:
        raise ValueError(f"{where}.api_key_env: the environment variable {variable} is not set (or empty) where the "
                         f"engine runs; export it before starting the run (on a cluster, on every node)")  # fmt: skip
    return value

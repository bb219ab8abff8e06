"""Who may call the API and how much: bearer tokens, body size, per-token rate, and JSON errors.

- **Tokens** come from ``CONTAMRAY_API_TOKENS`` (comma-separated) or the file named by
  ``CONTAMRAY_API_TOKENS_FILE`` (one token per line, ``#`` comments), read where the app is built. Only
  their SHA-256 digests travel to the replicas; a presented token is hashed and compared with each
  digest by ``hmac.compare_digest`` (constant time). With no token the server refuses to start unless
  it is local and insecure on purpose (``--insecure-local``, host 127.0.0.1).
- **Limits**, enforced before a body is parsed (``GuardMiddleware``, plain ASGI): a body above
  ``limits.max_body_bytes`` gets 413 (by ``Content-Length``, and by counting when there is none); a
  token above its rate gets 429 with ``Retry-After`` (a token bucket per token: ``burst`` at once, then
  ``requests_per_minute``; per replica).
- **Errors** are JSON ``{"error", "detail"}``: ``ApiError`` for the client's faults (4xx) and one
  internal-error body for the rest; no stack trace reaches a response.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

TOKENS_ENV = "CONTAMRAY_API_TOKENS"
TOKENS_FILE_ENV = "CONTAMRAY_API_TOKENS_FILE"
LOCAL_HOST = "127.0.0.1"
OPEN_PATHS = ("/healthz", "/docs", "/openapi.json", "/docs/oauth2-redirect", "/redoc")
MIN_TOKEN_CHARS = 16


class SecurityError(RuntimeError):
    """The server cannot start safely (no token, or insecure mode off loopback)."""


class ApiError(Exception):
    """A request the server refuses: HTTP ``status``, a short ``error`` code and a ``detail`` naming the fix."""

    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.error, self.detail, self.headers = status, error, detail, headers or {}


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def read_tokens(environ: dict[str, str] | None = None) -> list[str]:
    """The API tokens configured in the environment (both sources, in that order)."""
    env = os.environ if environ is None else environ
    tokens = [t.strip() for t in env.get(TOKENS_ENV, "").split(",") if t.strip()]
    path = env.get(TOKENS_FILE_ENV, "").strip()
    if path:
        file = Path(path).expanduser()
        if not file.is_file():
            raise SecurityError(f"{TOKENS_FILE_ENV}={path}: no such file; point it at a file with one token per line")
        lines = (line.split("#", 1)[0].strip() for line in file.read_text().splitlines())
        tokens += [line for line in lines if line]
    short = [t for t in tokens if len(t) < MIN_TOKEN_CHARS]
    if short:
        raise SecurityError(
            f"{len(short)} API token(s) shorter than {MIN_TOKEN_CHARS} characters; use random tokens, e.g. "
            "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )
    return tokens


def token_digests(host: str, insecure_local: bool, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """Digests of the configured tokens; refuses to start without one unless insecure on loopback."""
    tokens = read_tokens(environ)
    if insecure_local and host != LOCAL_HOST:
        raise SecurityError(
            f"--insecure-local serves without tokens and only on {LOCAL_HOST}, but host is {host!r}; "
            f"use --host {LOCAL_HOST} or configure tokens ({TOKENS_ENV} or {TOKENS_FILE_ENV})"
        )
    if not tokens and not insecure_local:
        raise SecurityError(
            f"no API token configured: set {TOKENS_ENV} (comma-separated) or {TOKENS_FILE_ENV} (a file, one per "
            f"line); for a local trial without tokens pass --insecure-local (host {LOCAL_HOST} only)"
        )
    return tuple(sorted({digest(t) for t in tokens}))


class TokenBucket:
    """Per-key token bucket: ``burst`` requests at once, refilled at ``per_minute`` / 60 per second."""

    def __init__(self, per_minute: float, burst: int) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(burst)
        self.state: dict[str, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def take(self, key: str, now: float | None = None) -> float:
        """0 when a request of ``key`` may go now (and is counted), else the seconds until it may."""
        now = time.monotonic() if now is None else now
        with self.lock:
            level, last = self.state.get(key, (self.burst, now))
            level = min(self.burst, level + (now - last) * self.rate)
            if level >= 1.0:
                self.state[key] = (level - 1.0, now)
                return 0.0
            self.state[key] = (level, now)
            return (1.0 - level) / self.rate


class Guard:
    """Authentication and rate limiting of one replica (built from ``ServerSettings``)."""

    def __init__(self, digests: tuple[str, ...], insecure_local: bool, max_body_bytes: int, per_minute: float,
                 burst: int) -> None:
        self.digests = tuple(digests)
        self.open = insecure_local and not self.digests
        self.max_body_bytes = max_body_bytes
        self.bucket = TokenBucket(per_minute, burst)

    def identify(self, authorization: str | None) -> str:
        """The caller's identity (its token digest, or ``local`` in insecure mode); ApiError 401 otherwise."""
        if self.open:
            return "local"
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "unauthorized", "send the header `Authorization: Bearer <token>` (a configured API "
                           "token)", {"WWW-Authenticate": "Bearer"})
        presented = digest(token.strip())
        found = False
        for known in self.digests:  # every digest compared, so the time does not tell which one matched
            found |= hmac.compare_digest(presented, known)
        if not found:
            raise ApiError(401, "unauthorized", "the bearer token is not one of this server's API tokens",
                           {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        return presented

    def admit(self, caller: str) -> None:
        wait = self.bucket.take(caller)
        if wait > 0:
            seconds = max(1, math.ceil(wait))
            raise ApiError(429, "rate_limited", f"too many requests for this token; retry in {seconds} s",
                           {"Retry-After": str(seconds)})


_GUARD: Guard | None = None  # this replica's guard, installed by the deployment's constructor


def install(guard: Guard) -> None:
    global _GUARD
    _GUARD = guard


def error_body(error: str, detail: Any) -> bytes:
    return json.dumps({"error": error, "detail": detail}).encode()


class GuardMiddleware:
    """ASGI middleware: 401 / 429 / 413 before the app reads a body; the caller's identity in
    ``scope["state"]["caller"]`` for the routes (job ownership)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        guard = _GUARD
        if guard is None:
            await _send_error(send, ApiError(503, "starting", "the API replica is not initialised yet; retry"))
            return
        path = scope.get("path", "")
        if path in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            caller = guard.identify(headers.get("authorization"))
            guard.admit(caller)
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > guard.max_body_bytes):
                raise ApiError(413, "body_too_large", f"the request body is {length} bytes; the limit is "
                               f"{guard.max_body_bytes} (limits.max_body_bytes): send fewer or shorter items")
        except ApiError as err:
            await _send_error(send, err)
            return
        scope.setdefault("state", {})["caller"] = caller
        if length is None and scope.get("method") in ("POST", "PUT", "PATCH"):
            try:  # no Content-Length (a chunked body): read it here, counting, and replay it to the app
                receive = await _buffered(receive, guard.max_body_bytes)
            except ApiError as err:
                await _send_error(send, err)
                return
        await self.app(scope, receive, send)


async def _buffered(receive: Any, limit: int) -> Any:
    """The whole body read from ``receive`` (ApiError 413 past ``limit`` bytes), as a replaying ``receive``."""
    chunks, seen, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        seen += len(chunks[-1])
        if seen > limit:
            raise ApiError(413, "body_too_large", f"the request body exceeds {limit} bytes (limits.max_body_bytes): "
                           "send fewer or shorter items")
        more = bool(message.get("more_body", False))
    body = b"".join(chunks)
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_error(send: Any, err: ApiError) -> None:
    headers = [(b"content-type", b"application/json")]
    headers += [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": error_body(err.error, err.detail)})

"""The gateway's settings: ``HERDLESS_GATEWAY_*`` variables and ``herdless serve`` flags.

This is the only gateway module that reads the environment; it turns it into the
frozen :class:`~herdless.gateway.core.admission.AdmissionConfig`,
:class:`~herdless.gateway.connections.ConnectionLimits` and an :class:`ApiKeys`
table, which hold no pydantic.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import AnyHttpUrl, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from herdless._cli_settings import config_by_name
from herdless.gateway.connections import ConnectionLimits
from herdless.gateway.core.keys import KeyLimits
from herdless.gateway.core.limits import STATIC_CONCURRENCY, AdmissionConfig
from herdless.gateway.cors import parse_origins
from herdless.gateway.policies import KeyPolicies, load_policies

__all__ = [
    "ANONYMOUS",
    "ApiKeys",
    "GatewaySettings",
    "UserIds",
    "digest_matches",
    "key_id",
    "secret_digest",
    "token_matches",
]

ANONYMOUS = "anonymous"
"""The key id of every request when no API keys are configured."""


class GatewaySettings(BaseSettings):
    """Settings of ``herdless serve``; each field is ``HERDLESS_GATEWAY_<NAME>`` or a flag."""

    # The docstring under each field is its description: the help of its flag and its
    # row in the configuration reference (herdless._cli_settings, docs/scripts).
    model_config = SettingsConfigDict(
        env_prefix="HERDLESS_GATEWAY_", extra="forbid", use_attribute_docstrings=True
    )

    config: Path | None = None
    """TOML file of these settings by name (max_queue = 128), under flags and variables; SIGHUP
    and POST /admin/reload re-read it and the key policies (unset: none)"""
    host: str = "127.0.0.1"
    """interface to listen on"""
    port: int = Field(default=8080, ge=0, le=65535)
    """port to listen on (0 picks a free one)"""
    upstream: AnyHttpUrl = AnyHttpUrl("http://127.0.0.1:8000")
    """vLLM's base URL"""
    upstream_api_key: SecretStr | None = None
    """API key the gateway sends to vLLM (vLLM's --api-key); unset: none"""
    max_concurrency: int | None = Field(default=None, gt=0)
    """cap on requests running upstream at once (unset: sized from the upstream's /metrics; 64
    while it publishes no size)"""
    max_queue: int = Field(default=256, ge=0)
    """requests waiting at once (0 refuses instead of queueing)"""
    queue_timeout: float = Field(default=30.0, gt=0)
    """seconds a request may wait before 429 queue_timeout"""
    rate: float | None = Field(default=None, gt=0)
    """requests per second per key (unset: no limit)"""
    burst: int | None = Field(default=None, gt=0)
    """requests a key may send at once (unset: ceil(rate))"""
    tokens_per_minute: int | None = Field(default=None, gt=0)
    """LLM tokens per minute per key (unset: no limit)"""
    max_inflight_tokens: int | None = Field(default=None, gt=0)
    """cap on the KV tokens of the running requests (unset: the engine's KV capacity, read from its
    /metrics; none while it publishes none)"""
    sizing: Literal["engine", "static"] = "engine"
    """engine: dispatch while the engine has room, read from its /metrics every metrics_interval;
    static: only the caps (max_concurrency, else 64)"""
    metrics_interval: float = Field(default=0.25, gt=0)
    """seconds between reads of the upstream's /metrics (sizing engine)"""
    key_queue_share: float = Field(default=0.5, gt=0, le=1)
    """fraction of the queue one API key may hold (with API keys only)"""
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    """largest request body in bytes, else 413"""
    body_timeout: float = Field(default=5.0, gt=0)
    """seconds a client has to send its whole body, else 408"""
    item_memory_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    """memory for the Responses API's output items, kept by key so a later request may refer to
    one (item_reference: vLLM stores none); the least recently used go first (0: none kept)"""
    max_messages: int = Field(default=2048, gt=0)
    """most messages in one chat request, else 400"""
    max_tokens_cap: int = Field(default=32_768, gt=0)
    """largest max_tokens a request may ask for, else 400"""
    default_max_tokens: int = Field(default=512, gt=0)
    """max_tokens assumed for pricing when a request has none (and its answer's length
    until answers are measured: it caps no prediction)"""
    max_retry_after: float = Field(default=59.0, gt=0)
    """cap on Retry-After, seconds (openai-node, LangChain.js and the Vercel AI SDK honour it
    only below 60)"""
    drain_retry_after: float = Field(default=30.0, gt=0)
    """Retry-After while draining with no announced window (POST /admin/drain?expect=SECONDS
    announces one), seconds"""
    upstream_retry_after: float = Field(default=2.0, gt=0)
    """Retry-After while vLLM is not ready, seconds"""
    health_interval: float = Field(default=1.0, gt=0)
    """seconds between polls of vLLM's /health"""
    upstream_sleep: float | None = Field(default=None, gt=0)
    """seconds idle before vLLM is put to sleep (/sleep?level=1), woken by the next request, held
    meanwhile; needs vLLM's --enable-sleep-mode, VLLM_SERVER_DEV_MODE=1 (unset: never)"""
    connect_timeout: float = Field(default=2.0, gt=0)
    """seconds to connect to vLLM"""
    read_timeout: float = Field(default=600.0, gt=0)
    """seconds between two bytes from vLLM"""
    shutdown_grace: float = Field(default=30.0, ge=0)
    """seconds running requests get to finish on SIGTERM"""
    max_head_bytes: int = Field(default=32_768, ge=1024)
    """largest request head (request line and headers) in bytes, else 431 and close"""
    max_headers: int = Field(default=100, gt=0)
    """most header lines in a request, else 431 and close"""
    head_timeout: float = Field(default=10.0, gt=0)
    """seconds from a request's first byte to the end of its headers, else 408 and close"""
    keep_alive_timeout: float = Field(default=10.0, gt=0)
    """seconds a connection may stay open with no request under way; keep it above your clients'
    idle timeout (httpx: 5)"""
    max_connections_per_peer: int = Field(default=1024, ge=0)
    """connections one client address may hold, at most half the process's file limit (0: no cap)"""
    allowed_origins: str = ""
    """origins of the web pages that may call /v1/ from a browser (CORS), comma-separated or a
    JSON list as vLLM's flag ('*': any; unset: none, as vLLM)"""
    models_cache_ttl: float = Field(default=1.0, ge=0)
    """seconds GET /v1/models is answered from the last upstream answer (0: fetched every time;
    concurrent requests still share one fetch)"""
    scheduler: Literal["vtc", "round-robin", "fcfs"] = "vtc"
    """order of the waiters: vtc (token-fair between keys, then users; interactive before batch),
    or the reference orders round-robin and fcfs"""
    prompt_weight: float = Field(default=1.0, gt=0)
    """weight of a prompt token in a user's service"""
    completion_weight: float = Field(default=2.0, gt=0)
    """weight of a completion token in a user's service"""
    max_users: int = Field(default=10_000, gt=0)
    """most users (per class) whose service the queue remembers"""
    interactive_reserve: int | None = Field(default=None, ge=0)
    """slots batch work leaves free while interactive work is recent, with static sizing (unset:
    max_concurrency / 8, rounded up); sized from the engine, batch leaves what interactive work
    held over reserve_window"""
    reserve_window: float = Field(default=30.0, gt=0)
    """seconds after the last interactive request during which the reserve holds"""
    fair_window: float = Field(default=10.0, ge=1)
    """seconds over which /metrics measures service per user and the fairness index"""
    metrics_top_users: int = Field(default=10, ge=0, le=1000)
    """users named in /metrics by their service; the rest are 'other'"""
    api_keys: SecretStr | None = None
    """the API keys clients may use, comma-separated (unset: anyone may call, unless
    key_policies names keys)"""
    key_policies: Path | None = None
    """TOML file of per-key policies: [defaults] and [keys.NAME] tables (key, fallback, hold,
    priority, user_header, rate, burst, tokens_per_minute, queue_share), [fallback] prices and
    spend caps (unset: every key by the flags, none may use the fallback)"""
    fallback_url: AnyHttpUrl | None = None
    """the hosted OpenAI-compatible API (ending in /v1) requests of keys whose policy allows it
    go to when the GPU cannot serve them in time (unset: none)"""
    fallback_model: str | None = None
    """the model asked of the hosted API (required with fallback_url)"""
    fallback_api_key: SecretStr | None = None
    """API key of the hosted API"""
    admin_token: SecretStr | None = None
    """bearer token for POST /admin/drain and /admin/resume (unset: admin is off, 403
    admin_disabled)"""
    key_id_secret: SecretStr | None = None
    """secret that keys the logged key ids (key- + 8 hex of HMAC-SHA256(secret, key)); unset: a
    random one per process, so ids change when the gateway restarts and differ between replicas"""
    access_log: bool = True
    """write one access-log line per request"""
    log_level: str = "info"
    """critical, error, warning, info or debug"""
    log_format: Literal["text", "json"] = "text"
    """text (one line: time, level, logger, message, key=value) or json (one object per line), for
    every line on stderr"""

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        levels = {"critical", "error", "warning", "info", "debug"}
        if value.lower() not in levels:
            raise ValueError(f"must be one of {sorted(levels)}")
        return value.lower()

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: str) -> str:
        parse_origins(value)
        return value

    @field_validator("api_keys")
    @classmethod
    def _keys_not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not _split(value.get_secret_value()):
            raise ValueError("must hold at least one key (comma-separated)")
        return value

    @model_validator(mode="after")
    def _reserve_below_concurrency(self) -> GatewaySettings:
        reserve = self.interactive_reserve
        limit = STATIC_CONCURRENCY if self.max_concurrency is None else self.max_concurrency
        if reserve is not None and reserve >= limit:
            raise ValueError(
                f"interactive_reserve ({reserve}) must be below max_concurrency ({limit})"
            )
        return self

    @model_validator(mode="after")
    def _fallback_has_a_model(self) -> GatewaySettings:
        if self.fallback_url is not None and not self.fallback_model:
            raise ValueError("fallback_model is required with fallback_url (the hosted model)")
        return self

    @model_validator(mode="after")
    def _default_within_cap(self) -> GatewaySettings:
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError(
                f"default_max_tokens ({self.default_max_tokens}) must not exceed "
                f"max_tokens_cap ({self.max_tokens_cap})"
            )
        return self

    def without_secrets(self) -> GatewaySettings:
        """A copy without the client keys, the admin token, the key-id secret and the
        hosted API's key: the gateway keeps only their digests (:class:`ApiKeys`,
        :func:`secret_digest`), so a heap dump or a stray ``repr`` cannot reveal them. The
        upstream key stays: it is sent as is (the hosted API's lives in the fallback's client).
        """
        gone = {
            "api_keys": None,
            "admin_token": None,
            "key_id_secret": None,
            "fallback_api_key": None,
        }
        return self.model_copy(update=gone)

    def policies(self) -> KeyPolicies:
        """The key policies: ``key_policies``' file, else every key by the flags.

        Raises:
            PolicyError: the file is invalid (line and field named).
        """
        flags = KeyLimits.of(self.admission_config())
        if self.key_policies is None:
            return KeyPolicies.flags_only(flags)
        return load_policies(self.key_policies, flags)

    def admission_config(self) -> AdmissionConfig:
        """The admission limits: each setting of a limit's name (see ``config_by_name``).
        ``key_queue_share`` applies only when keys are set."""
        keyed = self.api_keys is not None or self.key_policies is not None
        return config_by_name(
            AdmissionConfig,
            self,
            key_queue_share=self.key_queue_share if keyed else 1.0,
            stale_after=max(1.0, 4 * self.metrics_interval),
        )

    def connection_limits(self) -> ConnectionLimits:
        """What one client connection may hold (head size, timeouts, per-peer cap)."""
        return config_by_name(ConnectionLimits, self)

    def user_ids(self) -> UserIds:
        """Hashes users with ``key_id_secret`` (a random secret when it is unset)."""
        secret = self.key_id_secret
        return UserIds(None if secret is None else secret.get_secret_value().encode())

    def api_key_table(
        self, named: Mapping[str, str] | None = None, *, before: ApiKeys | None = None
    ) -> ApiKeys | None:
        """The configured API keys, hashed, or ``None`` when the gateway is open.

        ``named``: the key policies' keys (secret -> name), accepted too, each with its
        name as its id. Other key ids are keyed with ``key_id_secret``, or with a random
        per-process secret when it is unset (ids then change when the gateway restarts).
        ``before``: the table this one replaces (a reload): a key in both keeps its id.
        """
        if self.api_keys is None and not named:
            return None
        keys = [] if self.api_keys is None else _split(self.api_keys.get_secret_value())
        secret = self.key_id_secret
        id_secret = None if secret is None else secret.get_secret_value().encode()
        return ApiKeys(keys, id_secret=id_secret, named=named, before=before)


_HASHED = re.compile(r"key-[0-9a-f]{8}")  # a hashed key id, not a key policy's name


def _split(raw: str) -> list[str]:
    return [part.strip() for part in raw.split(",") if part.strip()]


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class ApiKeys:
    """API keys kept only as SHA-256 digests, looked up in constant time.

    Each key's id is ``key-`` plus the first 8 hex digits of
    ``HMAC-SHA256(id_secret, key)``: loggable, and, without the secret, no help to
    confirm a guess of the key offline (an unsalted digest would be). With no
    ``id_secret``, a random one is drawn for this table: ids are stable for the
    life of the process only. Set ``HERDLESS_GATEWAY_KEY_ID_SECRET`` to keep
    them across restarts and replicas.

    Args:
        keys: the keys (at least one here or in ``named``).
        id_secret: the secret that keys the ids (default: 32 random bytes).
        named: keys whose id is a name (the key policies' keys: secret -> name).
        before: the table this one replaces (a reload): its keys keep their ids.
    """

    __slots__ = ("_table",)
    _table: list[tuple[bytes, str]]

    def __init__(
        self,
        keys: list[str],
        *,
        id_secret: bytes | None = None,
        named: Mapping[str, str] | None = None,
        before: ApiKeys | None = None,
    ) -> None:
        if not keys and not named:
            raise ValueError("keys must not be empty")
        secret = os.urandom(32) if id_secret is None else id_secret
        kept = {d: i for d, i in before._table if _HASHED.fullmatch(i)} if before else {}
        table = [(d := _digest(key), kept.get(d) or key_id(key, secret)) for key in keys]
        self._table = table + [(_digest(key), name) for key, name in (named or {}).items()]

    def identify(self, presented: str) -> str | None:
        """The id of ``presented``, or ``None``: every entry is compared, equal or not."""
        digest = _digest(presented)
        found = None
        for stored, key_id in self._table:
            if hmac.compare_digest(stored, digest):
                found = key_id
        return found

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"ApiKeys([secure] x{len(self._table)})"


class UserIds:
    """The loggable id of an end user a request names: ``u-`` + 12 hex digits of a
    BLAKE2b keyed with the key-id secret (as :class:`ApiKeys` keys its ids).

    A user id is often personal (an e-mail address): keyed, its id in a log line or a
    metric label cannot confirm a guess offline. Without a secret, a random one is
    drawn: ids are stable for the life of the process only.
    """

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = os.urandom(32) if secret is None else hashlib.sha256(secret).digest()

    def __call__(self, user: str) -> str:
        digest = hashlib.blake2b(user.encode(), key=self._secret, digest_size=6)
        return "u-" + digest.hexdigest()

    def __repr__(self) -> str:
        return "UserIds([secure])"


def key_id(key: str, secret: bytes) -> str:
    """The loggable id of ``key``: ``key-`` + 8 hex digits of ``HMAC-SHA256(secret, key)``."""
    return "key-" + hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()[:8]


def secret_digest(secret: SecretStr) -> bytes:
    """The SHA-256 digest of a secret: what the running gateway keeps instead of it."""
    return _digest(secret.get_secret_value())


def digest_matches(presented: str, digest: bytes) -> bool:
    """Whether a bearer token's digest equals ``digest``, compared in constant time."""
    return hmac.compare_digest(_digest(presented), digest)


def token_matches(presented: str, expected: SecretStr) -> bool:
    """Whether a bearer token equals ``expected``, compared in constant time."""
    return digest_matches(presented, secret_digest(expected))

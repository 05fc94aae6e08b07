"""What one running gateway shares between its routes, and their request ids and audit."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from starlette.types import Scope

from herdless.gateway.gate import Gate
from herdless.gateway.items import ItemMemory
from herdless.gateway.logs import event
from herdless.gateway.metrics import GatewayMetrics
from herdless.gateway.policies import KeyPolicies
from herdless.gateway.settings import ANONYMOUS, ApiKeys, GatewaySettings, UserIds
from herdless.gateway.upstream import Upstream

if TYPE_CHECKING:
    from herdless.gateway.spill import Spill

__all__ = [
    "ACCESS_LOG",
    "AUDIT_LOG",
    "KEY_REQUIRED",
    "Runtime",
    "audit",
    "header_map",
    "request_id",
]

ACCESS_LOG = logging.getLogger("herdless.gateway.access")
AUDIT_LOG = logging.getLogger("herdless.gateway.audit")
_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # visible ASCII, bounded
KEY_REQUIRED = "a valid API key is required (Authorization: Bearer <key>, or x-api-key)"
"""The message of a 401: where :meth:`Runtime.identify` looks for the key."""


@dataclass(slots=True, kw_only=True)
class Runtime:
    """The gateway's parts, built once by ``create_app`` (one per app, never global).

    ``settings`` holds no client key nor admin token (see
    :meth:`GatewaySettings.without_secrets`): ``keys`` and ``admin_digest`` hold
    their digests; ``users`` hashes the end users requests name; ``policies`` says what
    each key's requests may do (no secret); ``spill`` is the hosted fallback, if any;
    ``items`` the Responses API's output items kept for later references
    (:mod:`~herdless.gateway.items`; none with ``item_memory_bytes`` 0).
    """

    settings: GatewaySettings
    gate: Gate
    upstream: Upstream
    metrics: GatewayMetrics
    keys: ApiKeys | None
    admin_digest: bytes | None
    users: UserIds
    policies: KeyPolicies
    spill: Spill | None = None
    items: ItemMemory = field(init=False)

    def __post_init__(self) -> None:
        self.items = self.metrics.items = ItemMemory(self.settings.item_memory_bytes)

    def identify(self, headers: dict[str, str]) -> str | None:
        """The caller's key id, ``ANONYMOUS`` when keys are off, ``None`` if refused.

        The key is the bearer token (``Authorization``, as vLLM reads it), else
        ``x-api-key``: what Anthropic's clients send (Claude Code's ``ANTHROPIC_API_KEY``).
        Neither is forwarded upstream."""
        if self.keys is None:
            return ANONYMOUS
        scheme, _, token = headers.get("authorization", "").partition(" ")
        presented = (token if scheme.lower() == "bearer" else headers.get("x-api-key", "")).strip()
        return self.keys.identify(presented) if presented else None

    @property
    def access_log(self) -> bool:
        """Whether access-log lines are written (checked before building one)."""
        return self.settings.access_log and ACCESS_LOG.isEnabledFor(logging.INFO)

    def log_access(self, **fields: object) -> None:
        """One line per request on ``herdless.gateway.access`` (never a key): the message
        is ``METHOD PATH STATUS``, the fields ride on the record (see :mod:`.logs`)."""
        message = f"{fields.get('method')} {fields.get('path')} {fields.get('status')}"
        ACCESS_LOG.info(message, extra={"fields": fields})


def request_id(headers: dict[str, str]) -> str:
    """The client's ``X-Request-ID`` when sane, else a new one (every route, the same rule).

    Echoed in a response header, logged and forwarded: only visible ASCII up to
    128 characters is kept.
    """
    rid = headers.get("x-request-id", "")
    if _REQUEST_ID.fullmatch(rid):
        return rid
    return os.urandom(16).hex()  # as random as uuid4().hex, at a third of the cost


def audit(action: str, outcome: str, scope: Scope, rid: str, **more: object) -> None:
    """One line on ``herdless.gateway.audit`` (WARNING): who asked for an admin action,
    and when.

    ``caller`` is the client address as uvicorn reports it (``X-Forwarded-For``
    is believed only from uvicorn's trusted proxies, 127.0.0.1 by default);
    ``at`` is UTC wall-clock time; ``more``: what the action did (counts). Never a token.
    """
    client = scope.get("client")
    caller = f"{client[0]}:{client[1]}" if client else None
    at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    fields: dict[str, object] = {"event": "admin", "action": action, "outcome": outcome}
    fields |= {"caller": caller, "at": at, "request_id": rid, **more}
    event(AUDIT_LOG, logging.WARNING, f"admin {action} {outcome}", **fields)


def header_map(scope: Scope) -> dict[str, str]:
    """The request headers, lower-case names (ASGI already lower-cases them)."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}

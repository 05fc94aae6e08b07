"""Key policies: what each API key's requests may do (``herdless serve --key-policies FILE``).

A TOML file::

    [defaults]                      # every key, --api-keys' too (all fields optional)
    hold = 30                       # seconds a request may wait here (its queue_timeout)
    fallback = false                # may its requests leave the building (default: no)
    retries = true                  # its clients retry a 429 (false: never; left out:
                                    # a full queue keeps the clients that show they never do)

    [keys.openwebui]                # a key of its own; its name is its id in logs and metrics
    key = "sk-webui-..."            # the secret (also accepted by the gateway as an API key)
    fallback = true
    hold = 20
    retries = false                 # Open WebUI shows a 429 to the employee: wait for a place
    priority = "interactive"        # the class when the request names none
    user_header = "X-OpenWebUI-User-Id"
    rate = 20                       # and burst, tokens_per_minute, queue_share: the flags'
                                    # per-key limits, for this key only

    [fallback]                      # the hosted model (--fallback-url): prices, spend caps
    input_price = 0.15              # per million prompt tokens
    output_price = 0.60             # per million completion tokens
    max_tokens = 2_000_000          # tokens it may use per window, all keys together
    max_cost = 5.0                  # money it may cost per window, in the prices' currency
    window = 3600                   # seconds

A field a key leaves out takes ``[defaults]``' value, and then the flag's. An invalid
file fails at start with the line and the field (:class:`PolicyError`). This module
reads the file once; the running gateway keeps digests of the keys, never the keys.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from herdless.gateway.core.keys import KeyLimits
from herdless.gateway.core.limits import Priority

__all__ = ["FallbackTable", "KeyPolicies", "KeyPolicy", "PolicyError", "load_policies"]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_HASHED_ID = re.compile(r"key-[0-9a-f]{8}")  # the ids of --api-keys' keys
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")  # an RFC 9110 token


class PolicyError(ValueError):
    """The key policy file is invalid: the message names the file, the line and the field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyPolicy:
    """What one key's requests may do beyond the limits (:class:`KeyLimits`).

    Attributes:
        name: the key's name in the file (``defaults`` for keys it does not name).
        fallback: its requests may go to the hosted model (data leaves the building).
        retries: its clients retry a refusal. ``False`` (a chat front-end that never
            retries): where a full queue would refuse one of its requests, the gateway
            keeps it waiting for the place the refusal would name, up to its hold.
            ``None`` (the default): by the client, the requests of one that shows it
            never retries (:func:`herdless.gateway.wire.never_retries`: Open WebUI's
            backend, a browser, curl, Node's ``fetch``) are kept, the others refused.
            Whatever it says, a retry is kept (:func:`herdless.gateway.edge.keeps`):
            its first attempt had its refusal at once.
        priority: their class when a request names none (``None``: interactive).
        user_header: the header naming the employee (it wins over ``X-Herdless-User``,
            which wins over the body's ``user``), lower-case; ``None``: none.
        limits: its rate, burst, tokens per minute, queue share and hold.
    """

    name: str
    fallback: bool = False
    retries: bool | None = None
    priority: Priority | None = None
    user_header: str | None = None
    limits: KeyLimits = field(default_factory=KeyLimits)


@dataclass(frozen=True, slots=True, kw_only=True)
class FallbackTable:
    """The ``[fallback]`` table: the hosted model's prices and the spend caps over
    ``window`` seconds (``None``: no cap, no price)."""

    input_price: float | None = None
    output_price: float | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    window: float = 3600.0


@dataclass(frozen=True, slots=True)
class KeyPolicies:
    """Every key's policy: ``keys`` by key id (the named keys), the rest ``default``.

    ``secrets`` maps each named key's secret to its name; the gateway turns it into
    digests at once (:class:`herdless.gateway.settings.ApiKeys`) and drops it.
    """

    default: KeyPolicy
    keys: Mapping[str, KeyPolicy] = field(default_factory=dict)
    fallback: FallbackTable = field(default_factory=FallbackTable)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)

    def of(self, key_id: str) -> KeyPolicy:
        """The policy of ``key_id``."""
        return self.keys.get(key_id, self.default)

    def limits(self) -> dict[str, KeyLimits]:
        """The limits of the named keys, by key id (for the admission core)."""
        return {name: policy.limits for name, policy in self.keys.items()}

    def without_secrets(self) -> KeyPolicies:
        """A copy without the secrets (what the running gateway keeps)."""
        return KeyPolicies(self.default, self.keys, self.fallback)

    @classmethod
    def flags_only(cls, limits: KeyLimits) -> KeyPolicies:
        """The policies with no file: every key by the flags, none may spill."""
        return cls(KeyPolicy(name="defaults", limits=limits))


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fallback: bool | None = None
    retries: bool | None = None
    hold: float | None = Field(default=None, gt=0)
    priority: Literal["interactive", "batch"] | None = None
    user_header: str | None = None
    rate: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, gt=0)
    tokens_per_minute: int | None = Field(default=None, gt=0)
    queue_share: float | None = Field(default=None, gt=0, le=1)

    @field_validator("user_header")
    @classmethod
    def _a_header_name(cls, value: str | None) -> str | None:
        if value is not None and not _HEADER.fullmatch(value):
            raise ValueError("must be an HTTP header name (letters, digits, '-', ...)")
        return value


class _Key(_Table):
    key: SecretStr

    @field_validator("key")
    @classmethod
    def _not_blank(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().strip():
            raise ValueError("must not be empty")
        return value


class _Fallback(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input_price: float | None = Field(default=None, ge=0)
    output_price: float | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, gt=0)
    max_cost: float | None = Field(default=None, gt=0)
    window: float = Field(default=3600.0, gt=0)


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: _Table = _Table()
    keys: dict[str, _Key] = {}
    fallback: _Fallback = _Fallback()


def load_policies(path: str | Path, flags: KeyLimits) -> KeyPolicies:
    """Read and check a key policy file; ``flags``: the limits the flags give every key.

    Raises:
        PolicyError: the file cannot be read, is not TOML, or a table or field is
            invalid (the message names the line and the field, never a key).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path}: not valid TOML: {exc}") from None
    try:
        parsed = _File.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_input=False, include_url=False)[0]
        loc = tuple(str(part) for part in error["loc"])
        where = _line_of(text, loc)
        at = f"line {where}: " if where else ""
        raise PolicyError(f"{path}: {at}{'.'.join(loc)}: {error['msg']}") from None
    default = _policy("defaults", parsed.defaults, None, flags)
    keys: dict[str, KeyPolicy] = {}
    secrets: dict[str, str] = {}
    for name, table in parsed.keys.items():
        where = _line_of(text, ("keys", name))
        at = f"{path}: line {where}: " if where else f"{path}: "
        if not _NAME.fullmatch(name) or _HASHED_ID.fullmatch(name):
            raise PolicyError(
                f"{at}keys.{name[:64]}: a key's name is 1-64 letters, digits, '_', '.' or '-' "
                "(and not key- and 8 hex digits: those are the ids of --api-keys' keys)"
            )
        secret = table.key.get_secret_value().strip()
        if secret in secrets:
            raise PolicyError(f"{at}keys.{name}.key: the same key as keys.{secrets[secret]}")
        secrets[secret] = name
        keys[name] = _policy(name, table, parsed.defaults, flags)
    prices = parsed.fallback
    return KeyPolicies(default, keys, FallbackTable(**prices.model_dump()), secrets)


def _policy(name: str, table: _Table, defaults: _Table | None, flags: KeyLimits) -> KeyPolicy:
    """``table``'s fields, else ``defaults``', else the flags'."""

    def pick(field: str, flag: Any) -> Any:
        for source in (table, defaults):
            value = None if source is None else getattr(source, field)
            if value is not None:
                return value
        return flag

    limits = KeyLimits(
        rate=pick("rate", flags.rate),
        burst=pick("burst", flags.burst),
        tokens_per_minute=pick("tokens_per_minute", flags.tokens_per_minute),
        queue_share=pick("queue_share", flags.queue_share),
        hold=pick("hold", flags.hold),
    )
    header = pick("user_header", None)
    return KeyPolicy(
        name=name,
        fallback=pick("fallback", False),
        retries=pick("retries", None),
        priority=pick("priority", None),
        user_header=None if header is None else header.lower(),
        limits=limits,
    )


def _line_of(text: str, loc: tuple[str, ...]) -> int | None:
    """The line (1-based) of the table or field ``loc`` names, e.g. ``("keys", "webui",
    "hold")``: the field's line within the table, else the table's header line."""
    table, fieldname = (loc[:2], loc[2:3]) if loc[:1] == ("keys",) else (loc[:1], loc[1:2])
    lines = text.splitlines()
    header = re.compile(
        r"\s*\[\s*"
        + r"\s*\.\s*".join(rf"(?:{re.escape(p)}|\"{re.escape(p)}\")" for p in table)
        + r"\s*\]"
    )
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    if start is None:
        return None
    for i in range(start + 1, len(lines)):
        line = lines[i].strip()
        if line.startswith("["):
            break
        if fieldname and re.match(rf"{re.escape(fieldname[0])}\s*=", line):
            return i + 1
    return start + 1

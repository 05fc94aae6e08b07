"""The maintenance runbook as code: drain a gateway, wait until idle, (swap), resume.

    export HERDLESS_GATEWAY_ADMIN_TOKEN=...
    python runbook.py drain  --gateway http://gpu-0.gpu:8080
    python runbook.py wait   --gateway http://gpu-0.gpu:8080 --timeout 120
    # ... restart vLLM with the new model; /readyz stays false while it loads ...
    python runbook.py resume --gateway http://gpu-0.gpu:8080

While drained, the gateway answers 503 + ``X-Herdless-Drain: 1``: herdless clients
open their breaker for it at once and use another gateway or the fallback.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx


def _admin(gateway: str, action: str, token: str) -> dict[str, Any]:
    response = httpx.post(
        f"{gateway}/admin/{action}", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    response.raise_for_status()
    status: dict[str, Any] = response.json()
    return status


def drain(gateway: str, token: str) -> dict[str, Any]:
    """Stop admitting; running requests finish. Returns the gateway's status."""
    return _admin(gateway, "drain", token)


def resume(gateway: str, token: str) -> dict[str, Any]:
    """Admit again."""
    return _admin(gateway, "resume", token)


def status(gateway: str) -> dict[str, Any]:
    """``/readyz``'s body (it answers 503 while draining or loading, with the same body)."""
    body: dict[str, Any] = httpx.get(f"{gateway}/readyz", timeout=10).json()
    return body


def wait_until_idle(
    gateway: str,
    *,
    timeout: float = 120.0,
    poll: float = 0.5,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Poll until nothing runs or waits at the gateway.

    Raises:
        TimeoutError: requests are still in flight after ``timeout`` seconds.
    """
    end = clock() + timeout
    while True:
        now = status(gateway)
        if now["inflight"] == 0 and now["queue_depth"] == 0:
            return now
        if clock() >= end:
            raise TimeoutError(f"{gateway} still has {now['inflight']} requests in flight")
        sleep(poll)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="drain / wait / resume one gateway")
    parser.add_argument("action", choices=["drain", "wait", "resume", "status"])
    parser.add_argument("--gateway", required=True, help="e.g. http://gpu-0.gpu:8080")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    gateway = args.gateway.rstrip("/")
    token = os.environ.get("HERDLESS_GATEWAY_ADMIN_TOKEN", "")
    if args.action in ("drain", "resume") and not token:
        print("set HERDLESS_GATEWAY_ADMIN_TOKEN", file=sys.stderr)
        return 2
    if args.action == "drain":
        print(drain(gateway, token))
    elif args.action == "resume":
        print(resume(gateway, token))
    elif args.action == "wait":
        print(wait_until_idle(gateway, timeout=args.timeout))
    else:
        print(status(gateway))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

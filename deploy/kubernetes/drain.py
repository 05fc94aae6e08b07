"""preStop hook: drain the pod's gateway, then wait until nothing runs on the GPU.

Kubernetes runs it before it sends SIGTERM (kustomization.yaml mounts it in both
containers of the GPU pod):

- in the gateway: ``python /opt/herdless/drain.py --drain`` posts ``/admin/drain``
  with the admin token (``HERDLESS_GATEWAY_ADMIN_TOKEN``, the variable the gateway
  reads), so new calls get ``503`` + ``X-Herdless-Drain`` and herdless clients
  switch to their fallback at once, then waits for the running calls to finish;
- in vLLM: ``python3 /opt/herdless/drain.py`` only waits for the same, so vLLM
  is not stopped under calls the gateway still lets finish.

Standard library only: it runs in the gateway's image and in vLLM's. It waits at
most ``--timeout`` seconds (keep it below the pod's terminationGracePeriodSeconds)
and never prints the token.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

TOKEN_VARIABLE = "HERDLESS_GATEWAY_ADMIN_TOKEN"


def _status(url: str, *, token: str | None = None) -> dict[str, Any] | None:
    """The gateway's status (``/readyz``'s body, or ``/admin/drain``'s with a token);
    ``None`` once nothing listens (the gateway has exited)."""
    if token is None:
        request = urllib.request.Request(url + "/readyz")
    else:
        request = urllib.request.Request(
            url + "/admin/drain", method="POST", headers={"Authorization": f"Bearer {token}"}
        )
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            body = answer.read()
    except urllib.error.HTTPError as error:  # /readyz answers 503 while draining
        if token is not None:
            raise SystemExit(f"drain refused: {error.code} {error.read()[:200]!r}") from None
        body = error.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    status = json.loads(body or b"{}")
    return status if isinstance(status, dict) else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8080", help="the pod's gateway")
    parser.add_argument(
        "--drain", action="store_true", help=f"POST /admin/drain (${TOKEN_VARIABLE})"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait at most")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.timeout
    if args.drain:
        token = os.environ.get(TOKEN_VARIABLE)
        if not token:
            print(f"drain: {TOKEN_VARIABLE} is not set; not draining", file=sys.stderr)
            return 1
        _status(args.gateway, token=token)
        print("drain: the gateway is draining", flush=True)
    while True:
        status = _status(args.gateway)
        if status is None:
            print("drain: the gateway has exited", flush=True)
            return 0
        if status.get("draining") and not status.get("inflight") and not status.get("queue_depth"):
            print("drain: drained, nothing in flight", flush=True)
            return 0
        if time.monotonic() >= deadline:
            print(f"drain: still busy after {args.timeout:g} s: {status}", flush=True)
            return 0  # the gateway's own SIGTERM drain takes it from here
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())

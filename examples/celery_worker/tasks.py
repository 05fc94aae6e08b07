"""A Celery worker with one herdless.Client per worker process.

    celery --workdir examples/celery_worker -A tasks worker --concurrency 4

Celery forks its worker processes from a parent. A client created in the parent
(at import time) would be copied into every child with its connection pool: the
children would share sockets. So the client is made in each child, by the
``worker_process_init`` signal, and closed by ``worker_process_shutdown``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown

import herdless

app = Celery(
    "herdless_example",
    # memory:// only works inside one process (tests); set a real broker to run workers.
    broker=os.environ.get("CELERY_BROKER_URL", "memory://"),
)
# A task that waits on a busy GPU is not lost if the worker dies meanwhile.
app.conf.task_acks_late = True

_client: herdless.Client | None = None


def client(**options: Any) -> herdless.Client:
    """This process's client (created on first use outside a worker, e.g. in tests)."""
    global _client
    if _client is None:
        _client = herdless.Client(**options)
    return _client


@worker_process_init.connect
def _open(**_: Any) -> None:
    client()


@worker_process_shutdown.connect
def _close(**_: Any) -> None:
    global _client
    if _client is not None:
        _client.close()
        _client = None


@app.task(
    bind=True,
    # Celery retries only what herdless gave up on (all backends failed within the
    # deadline), much later, so that the two retry layers do not multiply.
    autoretry_for=(herdless.APIConnectionError, herdless.ServiceUnavailableError),
    retry_backoff=60,
    retry_jitter=True,
    max_retries=3,
)
def summarize(self: Any, text: str) -> dict[str, Any]:
    result = client().chat(
        [{"role": "user", "content": f"Summarise in one sentence:\n\n{text}"}],
        # Documents may hold personal data: never send them to the hosted model.
        allow_fallback=False,
    )
    return {"summary": result.content, "backend": result.backend}

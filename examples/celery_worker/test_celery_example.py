"""The Celery example, eagerly (no broker, no worker process): the task and the client."""

from __future__ import annotations

import pytest
import tasks

import herdless
from herdless.testing import connect_error, ok, rate_limited

pytest_plugins = ["herdless.testing.pytest_plugin"]

GPU, HOSTED = "http://gpu.test/v1", "http://hosted.test/v1"


@pytest.fixture
def backends(herdless_env, herdless_backends, herdless_clock):
    herdless_env(primary_url=GPU, model="gemma-4", fallback_url=HOSTED, fallback_model="mini")
    # Run tasks in this process, errors raised to the caller: no broker, no worker.
    tasks.app.conf.update(task_always_eager=True, task_eager_propagates=True)
    tasks.client(clock=herdless_clock, sleep=herdless_clock.sleep)
    yield herdless_backends(GPU), herdless_backends(HOSTED)
    tasks._close()
    tasks.app.conf.update(task_always_eager=False, task_eager_propagates=False)


def test_task_waits_out_backpressure(backends):
    gpu, _ = backends
    gpu.script(rate_limited(2.0), ok("short summary"))
    result = tasks.summarize.delay("a long text").get()
    assert result == {"summary": "short summary", "backend": "primary"}


def test_documents_never_reach_the_hosted_model(backends):
    gpu, hosted = backends
    gpu.script(connect_error())
    with pytest.raises(herdless.HerdlessError):
        tasks.summarize.apply(args=("secret text",), retries=3).get()
    assert not hosted.requests


def test_each_process_gets_its_own_client(backends):
    first = tasks.client()
    tasks._close()  # what worker_process_shutdown does
    tasks._open()  # what worker_process_init does in a fresh child
    assert tasks.client() is not first

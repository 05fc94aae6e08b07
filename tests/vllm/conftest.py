"""herdless in front of a real vLLM: the gateway as a real process, upstream of it vLLM.

The gateway admits two requests at a time and queues two more, well under
vLLM's own limits (four sequences, four queued): what reaches vLLM is the
gateway's decision, never vLLM's.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from herdless.launch.servers import ServerProcess, gateway_process

pytestmark = [pytest.mark.vllm]

CONCURRENCY = 2
QUEUE = 2


@pytest.fixture(scope="module")
def gateway(vllm_url: str) -> Iterator[ServerProcess]:
    """``herdless serve`` in front of the session's vLLM."""
    options = {"max_concurrency": CONCURRENCY, "max_queue": QUEUE, "queue_timeout": 30.0}
    # Poll vLLM often, so that readiness follows it within a fraction of a second.
    options |= {"health_interval": 0.25, "upstream_retry_after": 2.0, "access_log": False}
    with gateway_process(upstream=vllm_url, **options) as server:
        yield server
        print(f"----- log of {server} -----\n{server.logs()}")

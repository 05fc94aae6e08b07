"""vLLM 0.32's KV geometry on ``/metrics``, and the emulator's, side by side.

The gateway sizes itself from ``vllm:cache_config_info``: an info gauge (value 1)
whose labels are the engine's cache configuration, KV capacity in tokens being
``num_gpu_blocks * block_size``. The real server must publish it so, and the
emulator the same family: the same name, type and label names (their values differ:
the emulator caches no prefix, for one). An emulator started like the session's
vLLM (``herdless.launch.vllm_pytest``) serves as the other side.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from herdless.launch.servers import emulator_process
from herdless.launch.vllm import MODEL_NAME

pytestmark = [pytest.mark.vllm]

NAME = "vllm:cache_config_info"


def cache_config_info(url: str) -> Metric:
    """The ``vllm:cache_config_info`` family of ``url``'s ``/metrics``."""
    text = httpx.get(f"{url}/metrics", timeout=10.0).raise_for_status().text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert NAME in families, f"no {NAME} on {url}/metrics"
    return families[NAME]


@pytest.fixture(scope="module")
def emulator_url() -> Iterator[str]:
    """An emulator with the limits of the session's vLLM (1 GiB of KV: 46,592 tokens)."""
    with emulator_process(
        model=MODEL_NAME,
        max_model_len=2048,
        kv_cache_tokens=46_592,
        max_num_seqs=4,
        max_num_queued_reqs=4,
    ) as server:
        yield server.url
        print(f"----- log of {server} -----\n{server.logs()}")


def test_real_vllm_publishes_its_kv_geometry_as_an_info_gauge(vllm_url: str) -> None:
    family = cache_config_info(vllm_url)
    assert family.type == "gauge"
    assert family.samples, f"{NAME} has no sample"
    for sample in family.samples:  # one per engine
        assert sample.value == 1.0
        assert {"num_gpu_blocks", "block_size", "engine"} <= set(sample.labels)
        blocks, size = int(sample.labels["num_gpu_blocks"]), int(sample.labels["block_size"])
        assert blocks > 0
        assert size > 0


def test_the_emulator_publishes_the_same_family_as_real_vllm(
    vllm_url: str, emulator_url: str
) -> None:
    real, emulated = cache_config_info(vllm_url), cache_config_info(emulator_url)
    assert (emulated.name, emulated.type) == (real.name, real.type)
    real_names = {frozenset(sample.labels) for sample in real.samples}
    emulated_names = {frozenset(sample.labels) for sample in emulated.samples}
    assert emulated_names == real_names, (
        f"only in vLLM: {sorted(set().union(*real_names) - set().union(*emulated_names))}; "
        f"only in the emulator: {sorted(set().union(*emulated_names) - set().union(*real_names))}"
    )
    assert [sample.value for sample in emulated.samples] == [1.0]
    [info] = emulated.samples
    assert int(info.labels["num_gpu_blocks"]) * int(info.labels["block_size"]) == 46_592

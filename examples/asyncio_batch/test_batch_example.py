"""The batch worker: 300 prompts, bounded concurrency, a GPU that refuses some, fake time."""

from __future__ import annotations

import batch as batch_job

import herdless
from herdless.testing import connect_error, ok, rate_limited

pytest_plugins = ["herdless.testing.pytest_plugin"]

GPU, HOSTED = "http://gpu.test/v1", "http://hosted.test/v1"


def _client(clock) -> herdless.AsyncClient:
    hosted = herdless.Backend(name="hosted", base_url=HOSTED, model="mini", external=True)
    return herdless.AsyncClient(
        primary=GPU, model="gemma-4", fallback=hosted, clock=clock, sleep=clock.asleep
    )


async def test_three_hundred_prompts_all_answered_in_order(herdless_backends, herdless_clock):
    gpu = herdless_backends(GPU).script(rate_limited(0.5), rate_limited(0.5), ok("done"))
    herdless_backends(HOSTED)
    prompts = [f"prompt {i}" for i in range(300)]
    async with _client(herdless_clock) as client:
        result = await batch_job.run_batch(client, prompts, concurrency=16)
    assert [o.index for o in result.outcomes] == list(range(300))
    assert all(o.answer == "done" for o in result.outcomes)
    assert 1 <= result.max_in_flight <= 16
    assert result.stats["succeeded"] == 300
    assert len(gpu.requests) == 302  # two refusals, waited out, then 300 answers


async def test_failures_are_reported_not_dropped(herdless_backends, herdless_clock):
    herdless_backends(GPU).script(connect_error())
    herdless_backends(HOSTED).script(connect_error())
    async with _client(herdless_clock) as client:
        result = await batch_job.run_batch(client, ["a", "b"], concurrency=2)
    assert [o.answer for o in result.outcomes] == [None, None]
    assert all(o.error for o in result.outcomes)


async def test_main_reads_a_file_and_writes_jsonl(
    tmp_path, capsys, herdless_env, herdless_backends
):
    herdless_env(primary_url=GPU, model="gemma-4")
    herdless_backends(GPU).script(ok("yes"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\n\ntwo\n")
    assert await batch_job.main([str(prompts), "--concurrency", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert '"answer": "yes"' in lines[0]

"""Key policies: the TOML file, its errors (line and field, never a key), and the per-key
limits and holds the admission core applies (pure, FakeClock)."""

from __future__ import annotations

from pathlib import Path

import pytest

from herdless.gateway.core.admission import Admission
from herdless.gateway.core.decisions import Admit, Enqueued, Refuse
from herdless.gateway.core.keys import KeyLimits
from herdless.gateway.core.limits import AdmissionConfig
from herdless.gateway.policies import KeyPolicies, PolicyError, load_policies
from herdless.gateway.settings import GatewaySettings
from herdless.testing import FakeClock

FLAGS = KeyLimits(rate=5.0, tokens_per_minute=9000, queue_share=0.5, hold=30.0)

GOOD = """\
[defaults]
hold = 25
queue_share = 0.25

[keys.webui]
key = "sk-webui-secret"
fallback = true
hold = 120
retries = false
user_header = "X-OpenWebUI-User-Id"

[keys."batch-job"]
key = "sk-batch-secret"
priority = "batch"
rate = 1

[fallback]
input_price = 0.15
output_price = 0.6
max_tokens = 1000
window = 60
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text(text)
    return path


def test_a_key_takes_its_table_then_the_defaults_then_the_flags(tmp_path: Path) -> None:
    policies = load_policies(write(tmp_path, GOOD), FLAGS)
    webui, batch = policies.of("webui"), policies.of("batch-job")
    assert (webui.fallback, webui.limits.hold, webui.user_header) == (
        True,
        120,
        "x-openwebui-user-id",
    )
    assert webui.retries is False  # its clients show a 429 as an error: a full queue keeps them
    assert batch.retries is None  # the default: by what each request shows of its client
    assert webui.limits.queue_share == 0.25  # [defaults]
    assert webui.limits.rate == 5.0  # the flag
    assert (batch.priority, batch.fallback, batch.limits.rate, batch.limits.hold) == (
        "batch",
        False,  # nothing leaves the building unless someone said so
        1,
        25,
    )
    other = policies.of("key-0a1b2c3d")  # an --api-keys key: the defaults
    assert (other.name, other.fallback, other.limits.hold) == ("defaults", False, 25)
    assert policies.fallback.max_tokens == 1000
    assert policies.fallback.window == 60
    assert dict(policies.secrets) == {"sk-webui-secret": "webui", "sk-batch-secret": "batch-job"}
    assert "secret" not in repr(policies)
    assert policies.without_secrets().secrets == {}


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ('[defaults]\nhold = 10\n\n[keys.a]\nkey = "k"\nhold = -1\n', 6, "keys.a.hold"),
        ('[keys.a]\nkey = "k"\npriority = "urgent"\n', 3, "keys.a.priority"),
        ('[keys.a]\nkey = "k"\nfalback = true\n', 3, "keys.a.falback"),
        ('[keys.a]\nkey = "k"\nretries = "sometimes"\n', 3, "keys.a.retries"),
        ("[keys.a]\nhold = 3\n", 1, "keys.a.key"),
        ("[defaults]\nqueue_share = 2\n", 2, "defaults.queue_share"),
        ('[keys.a]\nkey = "k"\nuser_header = "bad header"\n', 3, "keys.a.user_header"),
        ("[fallback]\nmax_cost = 0\n", 2, "fallback.max_cost"),
        ("[limits]\nrate = 1\n", 1, "limits"),
    ],
)
def test_an_invalid_field_names_its_line_and_field(
    tmp_path: Path, text: str, line: int, field: str
) -> None:
    with pytest.raises(PolicyError, match=rf"line {line}: {field}") as caught:
        load_policies(write(tmp_path, text), FLAGS)
    assert str(write(tmp_path, text)) in str(caught.value)


def test_a_key_is_never_shown_in_an_error(tmp_path: Path) -> None:
    text = '[keys.a]\nkey = "sk-one-secret"\n\n[keys.b]\nkey = "sk-one-secret"\n'
    with pytest.raises(PolicyError, match=r"line 4: keys.b.key: the same key as keys.a") as e:
        load_policies(write(tmp_path, text), FLAGS)
    assert "sk-one" not in str(e.value)
    with pytest.raises(PolicyError) as e:
        load_policies(write(tmp_path, '[keys.a]\nkey = "sk-x-secret"\nrate = "fast"\n'), FLAGS)
    assert "sk-x" not in str(e.value)


@pytest.mark.parametrize("name", ["key-0a1b2c3d", "has space", "x" * 65])
def test_a_key_name_must_be_a_plain_id_unlike_a_hashed_one(tmp_path: Path, name: str) -> None:
    with pytest.raises(PolicyError, match="a key's name is"):
        load_policies(write(tmp_path, f'[keys."{name}"]\nkey = "k"\n'), FLAGS)


def test_a_file_that_is_not_toml_or_not_there_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="not valid TOML"):
        load_policies(write(tmp_path, "[keys.a\n"), FLAGS)
    with pytest.raises(PolicyError, match="cannot be read"):
        load_policies(tmp_path / "missing.toml", FLAGS)


def test_the_settings_accept_the_policy_keys_as_api_keys_with_their_names(tmp_path: Path) -> None:
    settings = GatewaySettings(key_policies=write(tmp_path, GOOD), api_keys="sk-plain")
    policies = settings.policies()
    keys = settings.api_key_table(named=policies.secrets)
    assert keys is not None
    assert keys.identify("sk-webui-secret") == "webui"
    assert (plain := keys.identify("sk-plain")) is not None
    assert plain.startswith("key-")
    assert keys.identify("sk-other") is None
    # Keys from the file alone close the gateway too, and the key share applies.
    alone = GatewaySettings(key_policies=write(tmp_path, GOOD))
    assert alone.api_key_table(named=alone.policies().secrets) is not None
    assert alone.admission_config().key_queue_share == 0.5


def test_the_fallback_needs_a_model() -> None:
    with pytest.raises(ValueError, match="fallback_model is required"):
        GatewaySettings(fallback_url="http://127.0.0.1:9/v1")  # type: ignore[arg-type]


# -- the admission core with per-key limits ----------------------------------------------


def admission(clock: FakeClock, **limits: KeyLimits) -> Admission:
    config = AdmissionConfig(max_concurrency=1, max_queue=4, queue_timeout=30.0)
    return Admission(config, clock=clock, keys=limits)


def test_each_key_has_its_own_rate_hold_and_queue_share() -> None:
    clock = FakeClock()
    adm = admission(
        clock, slow=KeyLimits(rate=1.0, hold=90.0), small=KeyLimits(queue_share=0.25, hold=5.0)
    )
    assert isinstance(adm.offer("slow", 10), Admit)  # runs; its rate bucket is now empty
    refused = adm.precheck("slow")
    assert isinstance(refused, Refuse)
    assert refused.code == "rate_limited"
    assert refused.policy == '"rate_limited";q=1;w=1'
    assert adm.precheck("other") is None  # the flags: no rate limit
    waiting = adm.offer("small", 10)
    assert isinstance(waiting, Enqueued)
    assert waiting.ticket.hold == 5.0
    full = adm.offer("small", 10)  # its share: ceil(4 x 0.25) = 1 waiter
    assert isinstance(full, Refuse)
    assert full.code == "queue_full"
    other = adm.offer("other", 10)
    assert isinstance(other, Enqueued)
    assert other.ticket.hold == 30.0  # the flag's queue_timeout
    expired = adm.expire(waiting.ticket)
    assert "this key's hold (5s)" in expired.message


def test_a_patient_request_waits_out_an_announced_window_its_hold_covers() -> None:
    clock = FakeClock()
    adm = admission(clock, long=KeyLimits(hold=120.0), short=KeyLimits(hold=10.0))
    running = adm.offer("long", 10)
    assert isinstance(running, Admit)
    held = adm.offer("long", 10)
    short = adm.offer("short", 10)
    assert isinstance(held, Enqueued)
    assert isinstance(short, Enqueued)
    refused = adm.drain(expect=50.0)
    assert [ticket for ticket, _ in refused] == [short.ticket]  # 10 s < the 50 s window
    assert refused[0][1].retry_after == 50.0
    # New requests: the long hold waits, the short one is told the window's end.
    assert adm.precheck("long") is None
    later = adm.offer("long", 10)
    assert isinstance(later, Enqueued)
    told = adm.precheck("short")
    assert isinstance(told, Refuse)
    assert (told.status, told.code, told.retry) == (503, "draining", True)
    assert "maintenance for about 50s more" in told.message
    # A request that names a deadline is a herdless client's: it falls back, never waits.
    assert isinstance(adm.precheck("long", deadline=500.0), Refuse)
    adm.release(running.ticket)
    assert adm.dispatch() == []  # nothing starts while draining
    clock.advance(30.0)
    assert adm.drain_left == 20.0
    adm.resume()
    assert adm.dispatch() == [held.ticket]


def test_a_window_s_refusals_name_its_end_and_the_crowd_after_it_meets_the_queue() -> None:
    """A 503's Retry-After says when the service is expected back (RFC 9110): every caller
    refused in an announced window is told its end, not a slot spread past it. A drain
    tells callers to use their fallback, and a herdless client does for as long as it is
    told: promises spread past the end kept a crowd on the hosted model for seconds after
    the GPU served again. Callers that wait instead come back at the end, where the queue
    holds what it can and spreads the rest with its 429 reservations, as for any crowd."""
    clock = FakeClock()
    adm = admission(clock)  # one runs, four wait
    adm.drain(expect=20.0)
    assert [adm.unavailable("draining").retry_after for _ in range(10)] == [20.0] * 10
    clock.advance(5.0)
    assert adm.unavailable("draining").retry_after == 15.0
    clock.advance(15.0)
    adm.resume()
    crowd = [adm.offer("k", 10) for _ in range(7)]
    assert [type(d) for d in crowd] == [Admit, *[Enqueued] * 4, Refuse, Refuse]
    spread = [d.retry_after for d in crowd[5:] if isinstance(d, Refuse)]
    assert 0 < spread[0] < spread[1]  # one answer's time apart, from the window's end
    adm.drain(expect=600.0)
    long = adm.unavailable("draining")
    assert (long.retry_after, long.retry) == (59.0, False)  # x-should-retry: false
    adm.resume()
    adm.drain()  # no window announced: the configured drain_retry_after, as before
    assert adm.unavailable("draining").retry_after == 30.0


def test_no_policy_file_gives_every_key_the_flags() -> None:
    policies = KeyPolicies.flags_only(FLAGS)
    assert policies.of("anyone").limits == FLAGS
    assert policies.of("anyone").fallback is False
    assert policies.of("anyone").retries is None  # a 429 at once, unless the client never retries


def test_a_burst_after_a_quiet_spell_is_not_sent_away_by_the_quiet() -> None:
    """Rule 7 after an idle spell: the answers finished since the first say 4 in 9 s, the
    four running requests at their 1 s mean run time say 4/s: a caller whose hold the
    faster rate meets keeps its place (a caller leaves late, not early)."""
    clock = FakeClock()
    adm = Admission(AdmissionConfig(max_concurrency=4, max_queue=16), clock=clock)
    for _ in range(4):  # four answers of 1 s each, then 6 s of quiet
        ticket = adm.offer("k", 10)
        assert isinstance(ticket, Admit)
        clock.advance(1.0)
        adm.release(ticket.ticket)
    clock.advance(6.0)
    assert adm.drain_rate() < 0.5  # 4 answers over the 9 s since the first
    for _ in range(4):
        assert isinstance(adm.offer("k", 10), Admit)
    for place in range(1, 9):  # eight waiters ahead: about 2 s at 4/s, 20 s at 0.4/s
        assert isinstance(adm.offer("k", 10, deadline=5.0), Enqueued), place
    assert isinstance(adm.offer("k", 10, deadline=2.0), Refuse)  # 9 places at 4/s > 2 s


def test_a_full_queue_during_a_window_names_its_end_and_an_overrun_a_short_wait() -> None:
    clock = FakeClock()
    adm = admission(clock, long=KeyLimits(hold=120.0, queue_share=0.25))
    assert isinstance(adm.offer("long", 10), Admit)
    adm.drain(expect=40.0)
    assert isinstance(adm.offer("long", 10), Enqueued)  # held: its hold covers the window
    full = adm.offer("long", 10)  # its share of the queue (1 of 4) is taken
    assert isinstance(full, Refuse)
    assert full.code == "queue_full"
    assert full.retry_after >= 40.0  # nothing starts before the window's end
    assert full.retry
    clock.advance(45.0)  # the window ran over its announced end
    late = adm.unavailable("draining")
    assert late.retry_after == 2.0  # upstream_retry_after: back shortly, not at once

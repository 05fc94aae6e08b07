"""The full queue's refusals remembered by their request, so that a retry that says nothing
of itself is known (pure: an injected clock)."""

from __future__ import annotations

from herdless.gateway.core.comebacks import REMEMBER, Comebacks
from herdless.testing import FakeClock

APP = ("key-1", "10.0.0.7")
BODY = b'{"model":"m","messages":[{"role":"user","content":"hello"}]}'


def test_each_refusal_is_known_once_when_its_request_comes_again() -> None:
    comebacks = Comebacks(FakeClock())
    assert not comebacks.back(APP, BODY)  # nothing refused yet
    comebacks.refused(APP, BODY)
    comebacks.refused(APP, BODY)  # a second caller, the same request
    assert [comebacks.back(APP, BODY) for _ in range(3)] == [True, True, False]
    assert len(comebacks) == 0


def test_another_body_key_or_address_is_another_request() -> None:
    comebacks = Comebacks(FakeClock())
    comebacks.refused(APP, BODY)
    assert not comebacks.back(APP, BODY + b" ")
    assert not comebacks.back(("key-2", "10.0.0.7"), BODY)
    assert not comebacks.back(("key-1", "10.0.0.8"), BODY)
    assert not comebacks.back(("key-1", None), BODY)
    assert comebacks.back(APP, BODY)


def test_a_refusal_is_forgotten_after_a_while() -> None:
    clock = FakeClock()
    comebacks = Comebacks(clock)
    comebacks.refused(APP, b"early")
    comebacks.refused(APP, b"late")
    clock.advance(REMEMBER - 1.0)
    assert comebacks.back(APP, b"early")  # a backoff of its own, long after its time
    clock.advance(1.0)
    assert not comebacks.back(APP, b"late")
    assert len(comebacks) == 0


def test_a_refusal_again_is_remembered_anew() -> None:
    clock = FakeClock()
    comebacks = Comebacks(clock)
    comebacks.refused(APP, BODY)
    clock.advance(REMEMBER - 1.0)
    comebacks.refused(APP, BODY)  # refused again: both remembered from now
    clock.advance(REMEMBER - 1.0)
    assert [comebacks.back(APP, BODY) for _ in range(3)] == [True, True, False]


def test_a_flood_s_memory_is_bounded_the_oldest_forgotten_first() -> None:
    comebacks = Comebacks(FakeClock(), most=2)
    for body in (b"a", b"b", b"c"):
        comebacks.refused(APP, body)
    assert len(comebacks) == 2
    assert [comebacks.back(APP, body) for body in (b"a", b"b", b"c")] == [False, True, True]

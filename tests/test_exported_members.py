"""The public surface is exactly ``__all__``, sorted, and every name exists."""

import herdless


def test_all_is_sorted_and_complete() -> None:
    exported = set(herdless.__all__)
    assert list(herdless.__all__) == sorted(herdless.__all__)
    for name in exported:
        assert hasattr(herdless, name), name
    public = {n for n in dir(herdless) if not n.startswith("_")} - {
        # subpackages and modules that are imported as a side effect
        "cli",
        "events",
        "errors",
        "testing",
        "gateway",
        "emulator",
        "bench",
        "demo",
    }
    assert public <= exported | {"__version__"}

"""The public surface is exactly ``__all__``, sorted, and every name exists."""

import types

import herdless


def test_all_is_sorted_and_complete() -> None:
    exported = set(herdless.__all__)
    assert list(herdless.__all__) == sorted(herdless.__all__)
    for name in exported:
        assert hasattr(herdless, name), name
    # Submodules (herdless.errors, herdless.testing, ...) become attributes when imported.
    public = {
        name
        for name in dir(herdless)
        if not name.startswith("_") and not isinstance(getattr(herdless, name), types.ModuleType)
    }
    assert public <= exported


def test_the_testing_package_exports_its_clock_and_all_of_mock() -> None:
    import __future__

    import herdless.testing
    from herdless.testing import mock

    assert herdless.testing.__all__ == ["FakeClock", *mock.__all__]
    for name in herdless.testing.__all__:
        assert hasattr(herdless.testing, name), name
    public = {
        name
        for name in dir(herdless.testing)
        if not name.startswith("_")
        and not isinstance(getattr(herdless.testing, name), types.ModuleType | __future__._Feature)
    }
    assert public == set(herdless.testing.__all__)

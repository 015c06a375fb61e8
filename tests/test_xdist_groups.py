"""tests/conftest.py's pytest-xdist grouping: a costly session fixture is fetched only by tests that name it."""

from types import SimpleNamespace

import pytest

from tests.conftest import COSTLY_SESSION_FIXTURES, CostlyFixtureGuard

COSTLY = next(iter(COSTLY_SESSION_FIXTURES))


def set_up(argname: str, names: list[str]) -> None:
    """The guard's check of fixture `argname` set up for a test whose arguments (closure) are `names`."""
    item = SimpleNamespace(nodeid="tests/x.py::test_x", fixturenames=names)
    CostlyFixtureGuard().pytest_fixture_setup(
        SimpleNamespace(argname=argname), SimpleNamespace(_pyfuncitem=item)
    )


def test_a_costly_fixture_fetched_without_being_named_fails_naming_the_test_and_the_fix():
    with pytest.raises(
        pytest.fail.Exception, match=rf"tests/x.py::test_x fetches .*{COSTLY!r}.* Fix: name it"
    ):
        set_up(COSTLY, ["request"])


def test_a_named_costly_fixture_or_a_cheap_fetched_one_passes():
    set_up(COSTLY, ["request", COSTLY])
    set_up("tmp_path", ["request"])


def test_the_guard_is_registered_for_the_whole_session(pytestconfig):
    assert isinstance(
        pytestconfig.pluginmanager.get_plugin("grpo-hub-costly-fixture-guard"), CostlyFixtureGuard
    )

"""Fixtures shared by several test modules, and how `make test` schedules and times
its tests (tests/scheduling.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import scheduling
import site_check


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--book-schedule", action="store_true",
                     help="with -n: costliest work first, the site's pages after its build "
                          "(tests/scheduling.py)")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("book_schedule"):
        return scheduling.make_scheduler(config, log)
    return None


def pytest_configure(config: pytest.Config) -> None:
    # A plugin, not this conftest's hooks: those would reach only the tests under tests/,
    # and the notebooks' cells are timed too.
    config.pluginmanager.register(scheduling, "book-scheduling")
    # One name per pytest session, the same in every worker (xdist's run id).
    workerinput = getattr(config, "workerinput", None)
    config.stash[_SESSION] = workerinput["testrunuid"] if workerinput else (
        getattr(config.option, "testrunuid", None) or uuid.uuid4().hex)


_SESSION = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def build_state(pytestconfig) -> Path:
    """Where this session's site build (tests/test_site_build.py) says how it went."""
    return site_check.BUILD_STATES / f"{pytestconfig.stash[_SESSION]}.state"


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors: a second thread only adds synchronisation. Restored afterwards."""
    # Imported here, not above: every pytest process loads this file, and the
    # browser tests and xdist's controller have no use for torch.
    from mha.threads import num_threads

    with num_threads(1):
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``make unit`` leaves out the tests marked ``browser`` and ``make browser`` runs
    tests/test_site.py alone: a browser test anywhere else would never run."""
    stray = [item.nodeid for item in items
             if item.get_closest_marker("browser") and item.path.name != "test_site.py"]
    if stray:
        raise pytest.UsageError(
            "tests marked browser must live in tests/test_site.py (make browser runs "
            "only that file): " + ", ".join(stray)
        )

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
    parser.addoption(
        "--chapter", metavar="NN_slug", default=None,
        help="run only the tests that concern this chapter: those parametrised with it, "
        "its page or its checkers (the registry of mha.exercises says which), those that "
        "name one of these in their code, and those marked plumbing (make chapter-check; "
        "tools.chapter.concerns)",
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("book_schedule"):
        return scheduling.make_scheduler(config, log)
    return None


def pytest_configure(config: pytest.Config) -> None:
    # A plugin, not this conftest's hooks: those would reach only the tests under tests/,
    # and the notebooks' cells are timed too.
    config.pluginmanager.register(scheduling, "book-scheduling")
    # With pytest-cov on, nbval would trace every notebook's kernel too, with coverage's
    # defaults instead of pyproject.toml's: the report is the unit tests' (it was, when
    # nbval ran in a stage of its own), and a traced kernel runs about a third slower.
    if config.pluginmanager.hasplugin("nbval"):
        import nbval.plugin

        nbval.plugin.setup_coverage = nbval.plugin.teardown_coverage = _no_kernel_coverage
        # Its kernels are forked from one that has imported torch, matplotlib and mha
        # (tools/kernels.py): 3.5 s of CPU less for each notebook.
        import nbval.kernel

        nbval.kernel.NbvalKernelspecManager.get_kernel_spec = _forked_kernel_spec
    # One name per pytest session, the same in every worker (xdist's run id).
    workerinput = getattr(config, "workerinput", None)
    config.stash[_SESSION] = workerinput["testrunuid"] if workerinput else (
        getattr(config.option, "testrunuid", None) or uuid.uuid4().hex)


_SESSION = pytest.StashKey[str]()


def _no_kernel_coverage(*args, **kwargs) -> None:
    """nbval's coverage of a notebook's kernel, switched off (see pytest_configure)."""


def _forked_kernel_spec(self, kernel_name):
    """nbval's kernel of this environment, forked by tools/kernels.py's server."""
    import nbval.kernel

    from tools import kernels

    if kernel_name == nbval.kernel.CURRENT_ENV_KERNEL_NAME:
        return kernels.kernel_spec()
    return super(nbval.kernel.NbvalKernelspecManager, self).get_kernel_spec(kernel_name)


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
    tests/test_site.py alone: a browser test anywhere else would never run. With
    ``--chapter``, only the tests that concern that chapter are kept."""
    stray = [item.nodeid for item in items
             if item.get_closest_marker("browser") and item.path.name != "test_site.py"]
    if stray:
        raise pytest.UsageError(
            "tests marked browser must live in tests/test_site.py (make browser runs "
            "only that file): " + ", ".join(stray)
        )
    # (tests/test_stages.py calls this hook with no config)
    chapter = config.getoption("chapter", None) if config is not None else None
    if chapter:
        from tools.chapter import select

        try:
            keep, drop = select(items, chapter)
        except ValueError as error:
            raise pytest.UsageError(str(error)) from error
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep

"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest

import tools  # noqa: F401 - first: spares every test process a slow import (see there)


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

"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest

from mha.threads import num_threads


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors: a second thread only adds synchronisation. Restored afterwards."""
    with num_threads(1):
        yield

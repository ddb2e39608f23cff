"""One helper for PyTorch's thread count, used by training, decoding and the tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["num_threads"]


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``, then restore the previous count.

    The translator's matrices are tiny: a second thread only adds synchronisation (on
    a 2-core machine with the other core busy, decoding with 2 threads measured over
    ten times slower than with 1).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)

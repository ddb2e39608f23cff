"""tests/stages.py, the runner of `make test`: order, failures, and honest stage times."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

STAGES = Path(__file__).resolve().parent / "stages.py"


def run(*stages: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STAGES), *stages], capture_output=True,
                          text=True, timeout=60, check=False)


def seconds(out: str, name: str) -> float:
    return float(re.search(rf"^  {re.escape(name)} +([0-9.]+) s", out, re.M).group(1))


def test_a_background_stage_is_timed_to_its_own_end():
    """It ends long before the foreground stage; its time must say so, even though its
    output is collected only at the end."""
    result = run("short=sleep 0.2; echo short done &", "long=sleep 1.5")
    assert result.returncode == 0, result.stderr
    assert "short done" in result.stdout
    assert seconds(result.stdout, "short") < 1.0
    assert seconds(result.stdout, "long") >= 1.5
    assert seconds(result.stdout, "total") >= 1.5


def test_a_failing_stage_stops_the_run_and_is_named():
    result = run("first=true", "second=exit 3", "third=echo never")
    assert result.returncode == 3
    assert "stage 'second' failed (exit 3)" in result.stderr
    assert "never" not in result.stdout


def test_a_browser_test_outside_test_site_is_refused():
    """`make unit` leaves browser tests out and `make browser` runs tests/test_site.py
    only: tests/conftest.py refuses a browser test anywhere else."""
    import conftest
    import pytest

    class Item:
        def __init__(self, path: str, browser: bool):
            self.path, self.nodeid, self.browser = Path(path), f"{path}::test_x", browser

        def get_closest_marker(self, name: str):
            return object() if name == "browser" and self.browser else None

    fine = [Item("tests/test_site.py", True), Item("tests/test_masks.py", False)]
    conftest.pytest_collection_modifyitems(None, fine)  # nothing raised
    with pytest.raises(pytest.UsageError, match=r"tests/test_other.py::test_x"):
        conftest.pytest_collection_modifyitems(None, [*fine, Item("tests/test_other.py", True)])

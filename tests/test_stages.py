"""tools/stages.py, the runner of `make test`: order, failures, and honest stage times;
and how tools/simulated_cpu.py runs those stages on simulated CPUs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tools import ROOT, simulated_cpu, stages


def run(*specs: str) -> subprocess.CompletedProcess:
    """The runner as `make test` starts it: ``python -m tools.stages`` from the root."""
    return subprocess.run([sys.executable, "-m", "tools.stages", *specs], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)


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


def cpu(out: str, name: str) -> float:
    return float(re.search(rf"^  {re.escape(name)} +[0-9.]+ s  CPU +([0-9.]+) s", out, re.M)
                 .group(1))


def test_a_stage_is_charged_the_cpu_time_of_what_it_started():
    """CPU time counts the stage's children (here a Python busy loop two processes
    down), in the foreground and in the background, and not time spent asleep."""
    burn = f"{sys.executable} -c 'import time; t = time.process_time()\nwhile " \
        "time.process_time() - t < 0.6: pass'"
    result = run(f"busy={burn} &", "asleep=sleep 0.7", f"busy2=bash -c \"{burn}\"")
    assert result.returncode == 0, result.stderr
    assert cpu(result.stdout, "busy") >= 0.5 and cpu(result.stdout, "busy2") >= 0.5
    assert cpu(result.stdout, "asleep") < 0.2
    assert cpu(result.stdout, "total") >= 1.0


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


def test_stages_run_in_the_environment_given(capsys):
    """tools/simulated_cpu.py runs make test's stages under a simulated CPU's variables:
    the foreground and the background stage must both see them."""
    import os

    check = 'test "$SIMULATED" = yes'
    env = {**os.environ, "SIMULATED": "yes"}
    assert stages.run([f"background={check} &", f"foreground={check}"], env=env) == 0
    os.environ.pop("SIMULATED", None)
    assert stages.run([f"foreground={check}"]) == 1
    assert stages.run([f"background={check} &", "foreground=true"]) == 1
    capsys.readouterr()


def test_simulated_cpus_leave_out_only_existing_tooling_tests():
    """A renamed tooling test would otherwise be re-run there, and a typo would make
    `--ignore` skip nothing."""
    missing = [name for name in simulated_cpu.TOOLING_TESTS if not (ROOT / name).is_file()]
    assert not missing
    (checks,) = simulated_cpu.stage_commands()
    assert checks.startswith("checks=") and "COV='-p no:pytest_cov'" in checks
    assert all(name in checks for name in simulated_cpu.TOOLING_TESTS)


def test_mkl_is_expected_to_keep_its_own_branch_only_off_intel():
    """MKL_CBWR=AVX2 is honoured on Intel CPUs; elsewhere MKL stays on AUTO (seen on an
    AMD EPYC), which the probe must accept rather than fail every run there."""
    assert simulated_cpu.expected("avx2", "GenuineIntel")["mkl"] == "CNR:AVX2"
    assert simulated_cpu.expected("avx2", "AuthenticAMD")["mkl"] == "CNR:AUTO"
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        assert simulated_cpu.expected("baseline", vendor)["mkl"] == "CNR:COMPATIBLE"
        assert simulated_cpu.expected("avx2", vendor)["aten"] == "AVX2"

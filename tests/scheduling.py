"""How `make test` shares two cores: one pytest session, costliest work first.

`make test` runs every check (unit tests, nbval over every notebook, each chapter's
workbook, the site build and the browser tests) in one pytest session on as many
workers as the machine has cores (``-n 2 --book-schedule``), so that exactly one
CPU-bound process runs per core: a worker runs one test at a time, and a test's
kernel, Sphinx build or browser works while the worker waits for it. The scheduler
(:class:`BookScheduling`, chosen by ``--book-schedule``) hands out work units:

* a unit is what must stay on one worker (:func:`scope_of`): a notebook's cells (one
  kernel), a page's browser tests (one visit), a test module (its module fixtures),
  and one unit each for the site build and for each chapter's workbook run;
* each time a worker needs work, it gets the costliest unit that can start: the
  costs are the seconds each unit took in the run that wrote ``tests/durations.json``
  (``make durations``), or an estimate for a unit not listed there;
* a page of the site cannot start before the site is built (the build is one unit,
  and the costliest: it starts first).

Every test also records the CPU time of its worker and of everything the worker
started (kernels, Sphinx, Chromium). At the end the session prints, per kind of check,
the number of tests, their summed wall time and CPU time, and writes what each unit
took to ``_build/durations.json``.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DURATIONS = ROOT / "tests" / "durations.json"
MEASURED = ROOT / "_build" / "durations.json"
BUILD_TEST = "tests/test_site_build.py::test_the_site_builds_strictly"
# A unit with no recorded duration: this many seconds per test in it.
UNKNOWN_SECONDS_PER_TEST = 0.2


def scope_of(nodeid: str) -> str:
    """The work unit a test belongs to: what must run on one worker, in order."""
    path, _, rest = nodeid.partition("::")
    if path.endswith(".ipynb"):  # nbval: one kernel runs the notebook's cells in order
        return path
    if path == "tests/test_site.py" and "[" in rest:
        # A page's tests read one visit of that page: "test_x[chromium-book/a.html]"
        param = rest.split("[", 1)[1].rstrip("]").removeprefix("chromium-")
        if param.endswith(".html"):
            return f"site page {param}"
    if nodeid == BUILD_TEST or rest.startswith("test_a_workbook_runs_top_to_bottom["):
        return nodeid
    return path


def kind_of(nodeid: str) -> str:
    """The kind of check a test is, for the summary."""
    path, _, rest = nodeid.partition("::")
    if path.endswith(".ipynb"):
        return "nbval"
    if nodeid == BUILD_TEST:
        return "site build"
    if path == "tests/test_site.py":
        return "browser"
    if rest.startswith("test_a_workbook_runs_top_to_bottom["):
        return "workbook"
    return "unit"


def _needs_the_site(scope: str) -> bool:
    return scope.startswith("site page ") or scope == "tests/test_site.py"


def recorded_durations() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


# --------------------------------------------------------------------------- scheduler


def make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class BookScheduling(LoadScopeScheduling):
        """Costliest ready unit first; the site's pages after the site build."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.costs = recorded_durations()
            self.built = True  # until the collection shows a build to wait for

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def schedule(self) -> None:
            if self.collection is None and self.collection_is_completed:
                first = next(iter(self.registered_collections.values()))
                self.built = BUILD_TEST not in first
            super().schedule()

        def _cost(self, scope: str) -> float:
            if scope in self.costs:
                return self.costs[scope]
            return UNKNOWN_SECONDS_PER_TEST * len(self.workqueue[scope])

        def _assign_work_unit(self, node) -> None:
            ready = [s for s in self.workqueue if self.built or not _needs_the_site(s)]
            if not ready:  # only pages left, and the site is still being built
                return
            scope = max(ready, key=self._cost)
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some(
                [collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 2:
                return
            self._assign_work_unit(node)

        def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
            nodeid = self.registered_collections[node][item_index]
            super().mark_test_complete(node, item_index, duration)
            if nodeid == BUILD_TEST:  # the pages may start now, on any idle worker
                self.built = True
                for other in self.nodes:
                    self._reschedule(other)

    return BookScheduling(config, log)


# --------------------------------------------------------------------------- CPU time


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
    except OSError:  # gone, or not Linux
        pass
    return found


def _subtree_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    # after the command: state, ppid, ...; utime is the 12th, then stime, cutime, cstime
    own = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return own + sum(_subtree_cpu(child) for child in _children(pid))


def tree_cpu_seconds() -> float:
    """CPU time of this process and of everything it started, alive or reaped (a
    kernel, a Sphinx build, Chromium): each live process counts its own time and that
    of the children it has reaped."""
    t = os.times()
    return (t.user + t.system + t.children_user + t.children_system
            + sum(_subtree_cpu(child) for child in _children(os.getpid())))


_START = pytest.StashKey[float]()
_STARTED = time.perf_counter()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_START] = tree_cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _START in item.stash:
        # From the start of setup to the end of the test's own teardown. A process that
        # ends without this tree reaping it takes its time along (Chromium, when the
        # last test's teardown closes the browser: its time was counted while it ran).
        outcome.get_result().user_properties.append(
            ("cpu_seconds", max(0.0, tree_cpu_seconds() - item.stash[_START])))


class _Totals:
    def __init__(self):
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self.scopes: dict[str, float] = defaultdict(float)


_TOTALS = _Totals()


def pytest_runtest_logreport(report):
    kind = kind_of(report.nodeid)
    _TOTALS.wall[kind] += report.duration
    _TOTALS.scopes[scope_of(report.nodeid)] += report.duration
    if report.when == "call":
        _TOTALS.count[kind] += 1
    for name, value in report.user_properties:
        if name == "cpu_seconds":
            _TOTALS.cpu[kind] += value


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput") or not _TOTALS.count:
        return
    write = terminalreporter.write_line
    terminalreporter.section("time by kind of check")
    write(f"{'kind':12} {'tests':>6} {'wall s':>8} {'CPU s':>8}   (summed over tests)")
    for kind in sorted(_TOTALS.wall, key=lambda k: -_TOTALS.cpu[k]):
        write(f"{kind:12} {_TOTALS.count[kind]:6d} {_TOTALS.wall[kind]:8.1f} "
              f"{_TOTALS.cpu[kind]:8.1f}")
    write(f"{'all':12} {sum(_TOTALS.count.values()):6d} {sum(_TOTALS.wall.values()):8.1f} "
          f"{sum(_TOTALS.cpu.values()):8.1f}   session: "
          f"{time.perf_counter() - _STARTED:.1f} s wall")
    MEASURED.parent.mkdir(exist_ok=True)
    MEASURED.write_text(json.dumps(
        {scope: round(seconds, 2) for scope, seconds in sorted(_TOTALS.scopes.items())},
        indent=1) + "\n")

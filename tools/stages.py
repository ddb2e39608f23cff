"""Run the stages of `make test`, and print how long each took at the end.

Usage: ``python -m tools.stages NAME=COMMAND [NAME=COMMAND ...]``. A stage given as
``A=... & B=...`` (one argument) runs beside the next ones; its output is held back and
printed when it ends, so that two stages never interleave their lines. The run stops
at the first stage that fails and says which. At the end, each stage's wall-clock time
and CPU time (its own and that of every process it started and waited for: pytest's
workers, their kernels, Sphinx, Chromium) are printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time

from tools import ROOT


def _parse(arg: str) -> tuple[str, str]:
    name, _, command = arg.partition("=")
    if not name or not command:
        raise SystemExit(f"expected NAME=COMMAND, got {arg!r}")
    return name.strip(), command.strip()


def _start(command: str, env: dict[str, str] | None, **streams) -> subprocess.Popen:
    return subprocess.Popen(command, shell=True, cwd=ROOT, env=env, executable="/bin/bash",
                            **streams)


def _wait(proc: subprocess.Popen) -> tuple[int, float]:
    """Wait for ``proc``; its exit code and the CPU time of it and all it waited for."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def run(stages: list[str], env: dict[str, str] | None = None) -> int:
    """Run the stages in order (``env``: their environment, this one's by default)."""
    timings: list[tuple[str, float, float, str]] = []  # name, wall, CPU, note
    background: list[tuple[str, object, float, dict]] = []
    start_all = time.perf_counter()

    def finish_background() -> bool:
        ok = True
        for name, log, started, ended in background:
            ended["thread"].join()  # the waiter thread noted when it ended
            log.seek(0)
            sys.stdout.write(log.read())
            log.close()
            timings.append((name, ended["at"] - started, ended["cpu"], "beside the next stages"))
            if ended["code"] != 0:
                print(f"stage {name!r} failed (exit {ended['code']})", file=sys.stderr)
                ok = False
        background.clear()
        return ok

    for arg in stages:
        if arg.endswith("&"):
            name, command = _parse(arg[:-1])
            log = tempfile.TemporaryFile("w+")
            print(f"--- {name} (started in the background)", flush=True)
            proc = _start(command, env, stdout=log, stderr=subprocess.STDOUT)
            ended: dict = {}

            def note_end(proc=proc, ended=ended) -> None:
                ended["code"], ended["cpu"] = _wait(proc)
                ended["at"] = time.perf_counter()

            ended["thread"] = threading.Thread(target=note_end, daemon=True)
            ended["thread"].start()
            background.append((name, log, time.perf_counter(), ended))
            continue
        name, command = _parse(arg)
        print(f"--- {name}", flush=True)
        started = time.perf_counter()
        code, cpu = _wait(_start(command, env))
        timings.append((name, time.perf_counter() - started, cpu, ""))
        if code != 0:
            finish_background()
            print(f"stage {name!r} failed (exit {code})", file=sys.stderr)
            return code
    if not finish_background():
        return 1
    total = time.perf_counter() - start_all
    print("\nstage times (wall clock, and CPU time of the stage and all it started):")
    for name, seconds, cpu, note in timings:
        print(f"  {name:12} {seconds:6.1f} s  CPU {cpu:7.1f} s  {note}".rstrip())
    print(f"  {'total':12} {total:6.1f} s  CPU {sum(t[2] for t in timings):7.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))

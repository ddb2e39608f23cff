"""Run the stages of `make test`, and print how long each took at the end.

Usage: ``python -m tools.stages NAME=COMMAND [NAME=COMMAND ...]``. A stage given as
``A=... & B=...`` (one argument) runs beside the next ones; its output is held back and
printed when it ends, so that two stages never interleave their lines. The run stops
at the first stage that fails and says which.
"""

from __future__ import annotations

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


def run(stages: list[str], env: dict[str, str] | None = None) -> int:
    """Run the stages in order (``env``: their environment, this one's by default)."""
    timings: list[tuple[str, float, str]] = []
    background: list[tuple[str, subprocess.Popen, object, float, dict]] = []
    start_all = time.perf_counter()

    def finish_background() -> bool:
        ok = True
        for name, proc, log, started, ended in background:
            code = proc.wait()
            log.seek(0)
            sys.stdout.write(log.read())
            log.close()
            # When it ended, not when it was collected: a waiter thread noted the time.
            ended["thread"].join()
            timings.append((name, ended["at"] - started, "beside the next stages"))
            if code != 0:
                print(f"stage {name!r} failed (exit {code})", file=sys.stderr)
                ok = False
        background.clear()
        return ok

    for arg in stages:
        if arg.endswith("&"):
            name, command = _parse(arg[:-1])
            log = tempfile.TemporaryFile("w+")
            print(f"--- {name} (started in the background)", flush=True)
            proc = subprocess.Popen(command, shell=True, cwd=ROOT, stdout=log, env=env,
                                    stderr=subprocess.STDOUT, executable="/bin/bash")
            ended: dict = {}

            def note_end(proc=proc, ended=ended) -> None:
                proc.wait()
                ended["at"] = time.perf_counter()

            ended["thread"] = threading.Thread(target=note_end, daemon=True)
            ended["thread"].start()
            background.append((name, proc, log, time.perf_counter(), ended))
            continue
        name, command = _parse(arg)
        print(f"--- {name}", flush=True)
        started = time.perf_counter()
        code = subprocess.run(command, shell=True, cwd=ROOT, env=env,
                              executable="/bin/bash").returncode
        timings.append((name, time.perf_counter() - started, ""))
        if code != 0:
            finish_background()
            print(f"stage {name!r} failed (exit {code})", file=sys.stderr)
            return code
    if not finish_background():
        return 1
    total = time.perf_counter() - start_all
    print("\nstage times (wall clock):")
    for name, seconds, note in timings:
        print(f"  {name:12} {seconds:6.1f} s  {note}".rstrip())
    print(f"  {'total':12} {total:6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))

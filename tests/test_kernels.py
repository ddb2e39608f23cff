"""The notebooks' kernels, forked from a server that has imported the book's modules
(tools/kernels.py): they start where and as asked, show figures, take interrupts, end
with their launcher, and a launcher that cannot be served becomes an ordinary kernel."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tools import kernels
from tools.nbtools import kernel_env

pytestmark = pytest.mark.no_cover  # the code under test runs in other processes

PROBE = """
import json, os, sys
print(json.dumps({"cwd": os.getcwd(), "pid": os.getpid(), "path0": sys.path[0],
                  "torch": "torch" in sys.modules, "marker": os.environ.get("MARKER"),
                  "backend": os.environ.get("MPLBACKEND")}))
"""


def started(cwd, env):
    km = kernels.kernel_manager_class()(kernel_name="python3")
    km.start_kernel(cwd=str(cwd), env=env)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def run(kc, code: str, timeout: float = 60) -> tuple[str, list[dict], dict]:
    """The text a cell printed, its outputs and its reply."""
    outputs: list[dict] = []
    reply = kc.execute_interactive(code, timeout=timeout,
                                   output_hook=lambda msg: outputs.append(msg))
    text = "".join(m["content"].get("text", "") for m in outputs
                   if m["msg_type"] == "stream")
    return text, outputs, reply


def stop(km, kc):
    kc.stop_channels()
    km.shutdown_kernel(now=True)


def test_a_forked_kernel_starts_with_the_book_loaded_where_and_as_asked(tmp_path):
    import json

    km, kc = started(tmp_path, {**kernel_env(), "MARKER": "x"})
    try:
        seen = json.loads(run(kc, PROBE)[0])
        _, outputs, _ = run(kc, "import matplotlib.pyplot as plt\n"
                                "plt.plot([0, 1]); plt.show()")
        launcher = km.provisioner.process.pid
    finally:
        stop(km, kc)
    assert seen["torch"] and seen["pid"] != launcher, seen  # forked, with torch loaded
    assert seen["marker"] == "x"  # a variable read later: as asked
    assert seen["cwd"] == str(tmp_path) == seen["path0"]
    assert seen["backend"] == kernels.INLINE
    shown = [m for m in outputs if m["msg_type"] == "display_data"]
    assert shown and "image/png" in shown[0]["content"]["data"]  # figures are shown inline


def test_a_kernel_asked_for_with_another_environment_is_an_ordinary_one(tmp_path):
    import json

    # A variable read at import time (as the portability stage's simulated CPUs are)
    km, kc = started(tmp_path, {**kernel_env(), "ATEN_CPU_CAPABILITY": "default", "MARKER": "x"})
    try:
        seen = json.loads(run(kc, PROBE)[0])
        launcher = km.provisioner.process.pid
    finally:
        stop(km, kc)
    assert seen["pid"] == launcher and not seen["torch"] and seen["marker"] == "x"


def test_without_a_server_the_launcher_is_an_ordinary_kernel(tmp_path):
    import json

    km = kernels.kernel_manager_class()(kernel_name="python3")
    km.kernel_spec.argv[km.kernel_spec.argv.index("--server") + 1] = str(tmp_path / "none")
    km.start_kernel(cwd=str(tmp_path), env=kernel_env())
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        seen = json.loads(run(kc, PROBE)[0])
        launcher = km.provisioner.process.pid
    finally:
        stop(km, kc)
    assert seen["pid"] == launcher and not seen["torch"]


def test_an_interrupt_reaches_the_forked_kernel(tmp_path):
    km, kc = started(tmp_path, kernel_env())
    try:
        # (stop_on_error=False: the interrupted cell's error does not abort the next one)
        msg_id = kc.execute("import time; time.sleep(60)", stop_on_error=False)
        time.sleep(1)
        start = time.monotonic()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=20)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=20)
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - start < 10
        text, _, _ = run(kc, "print(6 * 7)")  # and it goes on
        assert text.strip() == "42"
    finally:
        stop(km, kc)


def test_a_forked_kernel_ends_with_its_launcher(tmp_path):
    import json

    km, kc = started(tmp_path, kernel_env())
    try:
        kernel = json.loads(run(kc, PROBE)[0])["pid"]
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        end = time.monotonic() + 10
        while time.monotonic() < end and os.path.exists(f"/proc/{kernel}"):
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{kernel}")
    finally:
        stop(km, kc)

"""Kernels for the notebooks the tests run, each ready in a fraction of a second.

A kernel is a fresh Python process that imports torch, matplotlib and mha before its
first cell does anything: about 3.5 s of CPU, and `make test` starts 21 of them (nbval's
notebooks and the workbooks). Here one server process per pytest worker imports them
once, and each kernel is a child forked from it, which starts with those modules loaded
and nothing else run (importing them starts no thread and draws no random number).

What Jupyter starts and watches is the launcher, ``python tools/kernels.py --server
<address> -f <connection file>`` (:func:`kernel_spec`): it hands the server its working directory,
environment and standard streams, forwards every signal Jupyter sends it to the kernel,
and exits with the kernel's status; the kernel ends when its launcher does. Where no
server answers at that address (it has ended), or where the
environment asked for differs from the server's in anything but Jupyter's own variables
(the portability stage's simulated CPUs, say), the launcher becomes an ordinary kernel.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# Run as a file: a kernel starts in its notebook's folder, where `tools` does not import.
LAUNCHER = [sys.executable, str(Path(__file__).resolve())]
# What the kernels of the book import first (see the chapters' first cells).
PRELOAD = ("ipykernel.kernelapp", "ipykernel.ipkernel", "numpy", "torch", "matplotlib",
           "matplotlib.pyplot", "mha", "mha.modules", "mha.draw", "mha.translator",
           "mha.exercises", "myst_nb")  # fmt: skip
# The variables read while the server imported what the kernels share (or by the
# interpreter at its start): a kernel asked for with any of them different from the
# server's would not be the kernel asked for. The others take effect in the kernel as in
# an ordinary one (torch sets TORCHINDUCTOR_CACHE_DIR in the tests' processes as they
# run, for one). MPLBACKEND is ipykernel's to set (below).
AT_IMPORT = ("PYTHON", "LD_", "LC_", "LANG", "HOME", "XDG_", "TMPDIR", "PATH", "VIRTUAL_ENV",
             "COV_", "COVERAGE_", "ATEN_", "TORCH_", "PYTORCH_", "MKL_", "OMP_", "KMP_",
             "GOMP_", "ONEDNN_", "DNNL_", "OPENBLAS_", "NUMPY_", "NPY_", "MPLCONFIGDIR",
             "MATPLOTLIB", "JUPYTER", "IPYTHON")  # fmt: skip
# How ipykernel shows figures; set before matplotlib is imported, as ipykernel would.
INLINE = "module://matplotlib_inline.backend_inline"


def _differences(asked: dict[str, str], own: dict[str, str]) -> list[str]:
    keys = {k for k in set(asked) | set(own) if k.startswith(AT_IMPORT)}
    return sorted(k for k in keys if asked.get(k) != own.get(k))


# --- the launcher: the process Jupyter starts ------------------------------------------


def _become_a_kernel(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *argv])


def _readline(conn: socket.socket) -> dict | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    return json.loads(data)


def launch(address: str, argv: list[str]) -> int:
    """Ask the server at ``address`` for a kernel with ``argv`` (ipykernel's arguments)
    and stand for it until it ends; without a server, or refused, become a kernel in
    this process."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(address)
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "pid": os.getpid()}
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        reply = _readline(conn)
    except OSError:
        reply = None
    if not reply or "pid" not in reply:
        conn.close()
        _become_a_kernel(argv)
    kernel = reply["pid"]

    def forward(signum, frame):
        try:
            os.kill(kernel, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                   signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    ended = _readline(conn)  # the kernel's status, once it has ended
    if ended is None:  # the server is gone: so is the kernel
        forward(signal.SIGKILL, None)
        return 1
    return ended["status"]


# --- the server: one per pytest worker ------------------------------------------------


def _exit_status(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if status else 0


def _kernel(request: dict, fds: list[int], closing: list) -> None:
    """In the forked child: become the kernel the launcher asked for (``closing``: the
    server's sockets and file descriptors)."""
    try:
        for s in closing:
            s.close() if isinstance(s, socket.socket) else os.close(s)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]  # as `python -m ipykernel_launcher` there has it
        os.environ.clear()
        os.environ.update(request["env"])
        launcher = os.pidfd_open(request["pid"])

        def end_with_the_launcher():
            sel = selectors.DefaultSelector()
            sel.register(launcher, selectors.EVENT_READ)
            sel.select()
            os._exit(1)

        threading.Thread(target=end_with_the_launcher, daemon=True).start()
        from ipykernel.kernelapp import launch_new_instance

        # Its parent, for ipykernel, is the launcher (as Jupyter's own process is for an
        # ordinary kernel): it then prints no note on how to stop it by hand.
        argv = [*request["argv"], f"--IPKernelApp.parent_handle={request['pid']}"]
        sys.argv = [sys.executable, *argv]
        try:
            launch_new_instance(argv=argv)
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must never return to the server
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(address: str) -> None:
    """Import what the kernels need, then fork a kernel for each launcher that asks,
    until the process that started this one ends."""
    os.environ.setdefault("MPLBACKEND", INLINE)
    sys.path[0] = os.getcwd()  # not tools/: its modules are no kernel's
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    own = dict(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(16)
    parent = os.pidfd_open(os.getppid())
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(parent, selectors.EVENT_READ, "parent")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    kernels: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                for pid in kernels:
                    os.kill(pid, signal.SIGKILL)
                return
            if key.data == "child":
                os.read(wake_r, 512)
                while kernels:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    conn = kernels.pop(pid, None)
                    if conn is not None:
                        try:
                            conn.sendall(json.dumps({"status": _exit_status(status)}).encode()
                                         + b"\n")
                        except OSError:
                            pass
                        conn.close()
                continue
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            while not message.endswith(b"\n"):
                message += conn.recv(1 << 20)
            request = json.loads(message)
            differences = _differences(request["env"], own)
            if differences or len(fds) != 3:
                print(f"tools/kernels.py: an ordinary kernel for {request['cwd']}: the "
                      f"environment differs from the server's in {', '.join(differences)}",
                      file=sys.stderr, flush=True)
                conn.sendall(json.dumps({"refused": differences}).encode() + b"\n")
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            pid = os.fork()
            if pid == 0:
                _kernel(request, fds, [listener, conn, *kernels.values(), wake_r, wake_w])
            for fd in fds:
                os.close(fd)
            kernels[pid] = conn
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


_STARTED: list[tuple[subprocess.Popen, str]] = []


def start_server(env: dict[str, str]) -> str:
    """Start this process's kernel server (once), with ``env`` (the kernels'
    environment, see tools.nbtools.kernel_env); returns its address."""
    if _STARTED:
        return _STARTED[0][1]
    address = str(Path(tempfile.mkdtemp(prefix="mha-kernels-")) / "server")
    server = subprocess.Popen([*LAUNCHER, "--serve", address],
                              env=env, stdout=subprocess.PIPE, text=True)
    ready = server.stdout.readline().strip() == "ready"
    server.stdout.close()
    if not ready:
        server.kill()
        server.wait()
        raise RuntimeError("the kernel server did not start")
    _STARTED.append((server, address))

    def stop():
        server.terminate()
        server.wait()

    atexit.register(stop)
    return address


def kernel_spec():
    """A kernel spec of this environment whose kernels this process's server forks
    (started here on first use)."""
    from jupyter_client.kernelspec import KernelSpec

    from tools.nbtools import kernel_env

    address = start_server(kernel_env())
    return KernelSpec(argv=[*LAUNCHER, "--server", address, "-f", "{connection_file}"],
                      display_name="Python 3 (forked)", language="python")


def kernel_manager_class():
    """A Jupyter kernel manager whose kernel :func:`kernel_spec` starts (nbclient's
    ``kernel_manager_class``)."""
    from jupyter_client.manager import KernelManager

    class ForkedKernelManager(KernelManager):
        @property
        def kernel_spec(self):
            if self._kernel_spec is None:
                self._kernel_spec = kernel_spec()
            return self._kernel_spec

    return ForkedKernelManager


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    elif sys.argv[1:2] == ["--server"]:
        sys.exit(launch(sys.argv[2], sys.argv[3:]))
    else:
        _become_a_kernel(sys.argv[1:])

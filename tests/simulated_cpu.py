"""Re-run every notebook under nbval as if the book were read on other CPUs.

PyTorch's own kernels (ATen), its BLAS (MKL), oneDNN and NumPy's OpenBLAS each pick
their code by instruction set. A stored output that changes with that choice would
pass on the machine that executed the notebooks and fail on a reader's. Four
environment variables make this machine behave like older CPUs:

* ``ATEN_CPU_CAPABILITY``: ATen's SIMD kernels (``default``, ``avx2``, ``avx512``);
* ``MKL_CBWR``: MKL's code branch (``COMPATIBLE``, ``AVX2``, ...);
* ``ONEDNN_MAX_CPU_ISA``: the highest instruction set oneDNN may use;
* ``OPENBLAS_CORETYPE``: the kernels of NumPy's OpenBLAS.

Every profile asks for less than any x86-64 course machine has, so it can be
honoured everywhere. Torch ignores an unknown ``ATEN_CPU_CAPABILITY`` without a
word, and MKL and oneDNN fall back silently too, so before nbval runs, each
library is asked in a fresh interpreter (with the same environment the kernels
get) which code it really uses; a profile that did not take effect is an error.

Usage: ``python tests/simulated_cpu.py [PROFILE ...]`` (all profiles by default).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbtools  # noqa: E402

PROFILES: dict[str, dict[str, str]] = {
    # A laptop or server of the last decade: AVX2 everywhere.
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "OPENBLAS_CORETYPE": "Haswell",
    },
    # The oldest code paths: no SIMD kernels in ATen, MKL's compatible branch.
    "baseline": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_CBWR": "COMPATIBLE",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "OPENBLAS_CORETYPE": "Prescott",
    },
}

# What each library reports when the profile took effect.
EXPECTED = {
    "avx2": {"aten": "AVX2", "mkl": "CNR:AVX2", "onednn": "isa:Intel AVX2"},
    "baseline": {"aten": "DEFAULT", "mkl": "CNR:COMPATIBLE", "onednn": "isa:Intel SSE4.1"},
}

PROBE = r"""
import ctypes, glob, json, os, sys
import numpy as np
import torch

a = torch.randn(64, 64)
a @ a  # MKL's SGEMM: MKL_VERBOSE names the code branch (CNR:...)
torch.nn.functional.conv2d(torch.randn(8, 64, 32, 32), torch.randn(64, 64, 3, 3))
libs = glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "*openblas*"))
core = "unknown"
for lib in libs:
    for name in ("scipy_openblas_get_corename64_", "openblas_get_corename"):
        fn = getattr(ctypes.CDLL(lib), name, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            core = fn().decode()
sys.stdout.flush()
print(json.dumps({"aten": torch.backends.cpu.get_cpu_capability(), "openblas": core}))
"""


def probe(env: dict[str, str]) -> dict[str, str]:
    """Ask ATen, MKL, oneDNN and OpenBLAS which code they use under ``env``."""
    env = {**env, "MKL_VERBOSE": "1", "ONEDNN_VERBOSE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    lines = out.stdout.splitlines()
    found = json.loads(lines[-1])
    found["mkl"] = next(
        (w for line in lines if "SGEMM" in line for w in line.split() if w.startswith("CNR:")),
        "no MKL_VERBOSE line",
    )
    found["onednn"] = next(
        (line.split(",")[-1] for line in lines if ",cpu,isa:" in line),
        "no ONEDNN_VERBOSE line",
    )
    found["onednn"] = "isa:" + found["onednn"].removeprefix("isa:")
    return found


def check_profile(name: str, env: dict[str, str]) -> list[str]:
    """Problems with ``name``: each library must report what the profile asked for."""
    found = probe(env)
    problems = [
        f"{name}: {lib} reports {found[lib]!r}, expected {want!r}"
        for lib, want in EXPECTED[name].items()
        if found[lib] != want
    ]
    native = probe(nbtools.kernel_env())["openblas"]
    if found["openblas"] == native and native != PROFILES[name]["OPENBLAS_CORETYPE"]:
        problems.append(f"{name}: OpenBLAS still uses its native core {native!r}")
    print(
        f"simulated CPU {name!r}: ATen {found['aten']}, MKL {found['mkl']}, "
        f"oneDNN {found['onednn']}, OpenBLAS {found['openblas']}",
        flush=True,
    )
    return problems


def run(names: list[str]) -> int:
    failed = []
    for name in names:
        env = {**nbtools.kernel_env(), **PROFILES[name]}
        problems = check_profile(name, env)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            failed.append(name)
            continue
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
             "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "-n", "2",
             "--dist", "loadfile", "-q", "book/notebooks"],
            env=env, cwd=ROOT, check=False,
        )
        print(f"simulated CPU {name!r}: nbval exit {result.returncode} "
              f"in {time.perf_counter() - start:.0f} s", flush=True)
        if result.returncode != 0:
            failed.append(name)
    if failed:
        print(f"notebooks differ on simulated CPUs: {', '.join(failed)}", file=sys.stderr)
    else:
        print(f"every notebook passed nbval on simulated CPUs: {', '.join(names)}")
    print(f"portability: {len(names) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    names = argv or list(PROFILES)
    unknown = [n for n in names if n not in PROFILES]
    if unknown:
        print(f"unknown profile(s) {unknown}; known: {list(PROFILES)}", file=sys.stderr)
        return 2
    return run(names)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

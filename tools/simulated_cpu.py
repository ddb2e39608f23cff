"""Re-run the unit tests and every notebook as if on other CPUs.

PyTorch's own kernels (ATen), its BLAS (MKL), oneDNN and NumPy's OpenBLAS each pick
their code by instruction set. A stored output that changes with that choice, or a
test that compares two differently computed floats exactly, would pass on the machine
that ran it and fail on a reader's. Four environment variables make this machine
behave like older CPUs:

* ``ATEN_CPU_CAPABILITY``: ATen's SIMD kernels (``default``, ``avx2``, ``avx512``);
* ``MKL_CBWR``: MKL's code branch (``COMPATIBLE``, ``AVX2``, ...);
* ``ONEDNN_MAX_CPU_ISA``: the highest instruction set oneDNN may use;
* ``OPENBLAS_CORETYPE``: the kernels of NumPy's OpenBLAS;
* ``NPY_DISABLE_CPU_FEATURES``: NumPy's own SIMD loops (``exp``, ``log``, ``power``,
  ``tanh``, float32 ``sin``, ...), which give other last bits with AVX-512, with
  AVX2 and without either. It accepts only the feature groups NumPy dispatches
  (``X86_V3``, ``X86_V4``, ``AVX512_ICL``, ``AVX512_SPR``); another name stops
  ``import numpy``.

Every profile asks for less than any x86-64 course machine has, so it can be
honoured everywhere. Torch ignores an unknown ``ATEN_CPU_CAPABILITY`` without a
word, and MKL and oneDNN fall back silently too, so before the tests run, each
library is asked in a fresh interpreter (with the same environment the tests and
the kernels get) which code it really uses; a profile that did not take effect is
an error.

Under each profile, the unit tests (without coverage and without the tooling tests in
``TOOLING_TESTS``, which check files and commands, not numbers) and nbval over every
notebook run in one session, as in ``make test`` (``make checks``).

Usage: ``python -m tools.simulated_cpu [PROFILE ...]``; all profiles by default, which is
``make portability``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tools import nbtools, stages

# Tests of the book's tooling (notebook pairing, the workbook, the layering of mha, the
# stage runner, the site): what they check does not depend on the CPU.
TOOLING_TESTS = [
    "tests/test_chapter_tools.py",
    "tests/test_import_layering.py",
    "tests/test_kernels.py",
    "tests/test_notebooks.py",
    "tests/test_packaging.py",
    "tests/test_prose.py",
    "tests/test_readme.py",
    "tests/test_references.py",
    "tests/test_site.py",
    "tests/test_site_assets.py",
    "tests/test_site_build.py",
    "tests/test_stages.py",
    "tests/test_translations.py",
    "tests/test_workbook.py",
]

PROFILES: dict[str, dict[str, str]] = {
    # A laptop or server of the last decade: AVX2 everywhere.
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_CBWR": "AVX2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "OPENBLAS_CORETYPE": "Haswell",
        "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    },
    # The oldest code paths: no SIMD kernels in ATen, MKL's compatible branch.
    "baseline": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_CBWR": "COMPATIBLE",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "OPENBLAS_CORETYPE": "Prescott",
        "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
    },
}

# What each library reports when the profile took effect.
EXPECTED = {
    "avx2": {"aten": "AVX2", "mkl": "CNR:AVX2", "onednn": "isa:Intel AVX2", "numpy": "X86_V3"},
    "baseline": {
        "aten": "DEFAULT", "mkl": "CNR:COMPATIBLE", "onednn": "isa:Intel SSE4.1",
        "numpy": "X86_V2",
    },
}

PROBE = r"""
import ctypes, glob, json, os, sys
import numpy as np
import torch
from numpy._core._multiarray_umath import __cpu_features__ as features

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
# NumPy's own loops: the highest feature group it dispatches to
groups = [g for g in ("AVX512_SPR", "AVX512_ICL", "X86_V4", "X86_V3") if features.get(g)]
numpy_simd = groups[0] if groups else "X86_V2"
print(json.dumps({"aten": torch.backends.cpu.get_cpu_capability(), "openblas": core,
                  "numpy": numpy_simd}))
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


def cpu_vendor() -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ... (empty where /proc/cpuinfo says none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("vendor_id")), "")


def expected(name: str, vendor: str) -> dict[str, str]:
    """What each library should report under profile ``name`` on this CPU's vendor.

    MKL takes a code branch other than ``COMPATIBLE`` only on Intel CPUs: on an AMD
    EPYC, ``MKL_CBWR=AVX2`` (or ``AVX``, ``AVX512``) leaves it on ``AUTO``, its own
    choice for that CPU, which no variable changes.
    """
    want = dict(EXPECTED[name])
    if vendor != "GenuineIntel" and want["mkl"] != "CNR:COMPATIBLE":
        want["mkl"] = "CNR:AUTO"
    return want


def check_profile(name: str, env: dict[str, str]) -> list[str]:
    """Problems with ``name``: each library must report what the profile asked for."""
    found = probe(env)
    vendor = cpu_vendor()
    want = expected(name, vendor)
    problems = [
        f"{name}: {lib} reports {found[lib]!r}, expected {value!r}"
        for lib, value in want.items()
        if found[lib] != value
    ]
    if want["mkl"] != EXPECTED[name]["mkl"]:
        print(f"simulated CPU {name!r}: MKL keeps its own branch on this {vendor or 'CPU'} "
              f"(MKL_CBWR={PROFILES[name]['MKL_CBWR']} is honoured on Intel CPUs only)")
    native = probe(nbtools.kernel_env())["openblas"]
    if found["openblas"] == native and native != PROFILES[name]["OPENBLAS_CORETYPE"]:
        problems.append(f"{name}: OpenBLAS still uses its native core {native!r}")
    print(
        f"simulated CPU {name!r}: ATen {found['aten']}, MKL {found['mkl']}, "
        f"oneDNN {found['onednn']}, OpenBLAS {found['openblas']}, NumPy {found['numpy']}",
        flush=True,
    )
    return problems


def stage_commands() -> list[str]:
    """``make test``'s session of checks, without the tooling tests and coverage: the
    unit tests and nbval over every notebook (see tests/scheduling.py)."""
    make = "make --no-print-directory"
    return [f"checks={make} checks CHECK_IGNORE='{' '.join(TOOLING_TESTS)}' "
            "COV='-p no:pytest_cov'"]


def run(names: list[str]) -> int:
    failed = []
    for name in names:
        env = {**nbtools.kernel_env(), **PROFILES[name]}
        problems = check_profile(name, env)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            failed.append(name)
            continue
        code = stages.run(stage_commands(), env=env)
        print(f"simulated CPU {name!r}: exit {code}", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        print(f"tests or notebooks fail on simulated CPUs: {', '.join(failed)}",
              file=sys.stderr)
    else:
        print(f"the unit tests and every notebook passed on simulated CPUs: {', '.join(names)}")
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

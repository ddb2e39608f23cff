"""The site builds, both editions, with no warning (`make site-build`: Sphinx with
``-W -n --keep-going``, then the Chinese edition, then the font cut).

In `make test` this is one test of the session (tests/scheduling.py starts it first, and
no page of the site is opened before it ends); its state is written beside the build,
so that the browser tests of the same session wait for it (tests/test_site.py)."""

from __future__ import annotations

import os
import subprocess

import pytest
import site_check

pytestmark = [pytest.mark.site_build, pytest.mark.no_cover]


def test_the_site_builds_strictly(build_state):
    build_state.parent.mkdir(parents=True, exist_ok=True)
    build_state.write_text(f"building {os.getpid()}\n")
    result = subprocess.run(
        ["make", "--no-print-directory", "site-build"], cwd=site_check.ROOT,
        capture_output=True, text=True, check=False,
    )
    build_state.write_text("built\n" if result.returncode == 0 else "failed\n")
    # The build's last lines: each edition's time and the fonts' cut, or the warnings.
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-60:])
    print(tail)
    assert result.returncode == 0, f"make site-build failed:\n{tail}"

"""The test suite's own settings keep what a failing test reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_failing_property_test_names_the_example_it_failed_on(
    tmp_path: Path,
) -> None:
    # With the project's pytest settings and plugins: schemathesis's plugin
    # printed every falsifying example's arguments blank (`scenario=,`).
    test = tmp_path / "test_failing.py"
    test.write_text(
        "from hypothesis import given, strategies as st\n\n"
        "@given(st.integers(min_value=0))\n"
        "def test_small(n: int) -> None:\n"
        "    assert n < 5\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            str(test),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "n=5," in done.stdout, done.stdout

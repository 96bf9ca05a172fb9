"""The test session's own setup (tests/conftest.py) leaves no trace a developer would read as a fault."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_a_pytest_run_that_imported_triton_ends_without_leak_reports():
    # conftest freezes the worker's objects (gc.freeze) and unfreezes them at the end: still frozen at exit,
    # Triton's nanobind objects outlive the interpreter and nanobind reports each as leaked, on stderr.
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/mars/test_triton_backend.py", "-k", "test_empty_lists_are_a_no_op"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert "leaked" not in run.stdout + run.stderr

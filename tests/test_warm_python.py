"""tests.warm_python forks launches from a warm Python: each must end as `python SCRIPT` ends in a fresh process."""
import subprocess
import sys
import textwrap

import pytest

from tests import warm_python

SCRIPT = textwrap.dedent("""
    import atexit, os, sys
    atexit.register(lambda: print("atexit ran", flush=True))
    print("argv", sys.argv, "cwd", os.getcwd(), "path0", sys.path[0], "stdin", repr(sys.stdin.read()))
    print("env", os.environ.get("WARM_TEST"), "torch imported", "torch" in sys.modules, file=sys.stderr)
    print("unflushed at the end")  # a pipe's stdout is block-buffered: the shutdown flushes it
    if sys.argv[1] == "message":
        raise SystemExit("error: told in one line")
    if sys.argv[1] == "exception":
        raise ValueError("uncaught")
    if sys.argv[1] == "status":
        sys.exit(3)
    if sys.argv[1] == "sleep":
        import time
        time.sleep(60)
""")


@pytest.fixture
def script(tmp_path):
    (tmp_path / "scripts").mkdir()
    path = tmp_path / "scripts" / "probe.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.parametrize("launch", ["scripts/probe.py", "-m scripts.probe"])
@pytest.mark.parametrize("ending", ["normal", "message", "exception", "status"])
def test_a_forked_launch_ends_as_a_fresh_python_does(tmp_path, script, monkeypatch, ending, launch):
    monkeypatch.setenv("WARM_TEST", "from the caller")
    args = [sys.executable, *launch.split(), ending]
    fresh = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    forked = warm_python.run(args, cwd=tmp_path, timeout=60)
    assert warm_python.forkable(args, None)
    # Only the preloaded modules differ (the fork has torch imported before the script runs), and `python -m`'s
    # traceback starts in runpy's frozen frames.
    assert forked.stderr.replace("torch imported True", "torch imported False") == "".join(
        line for line in fresh.stderr.splitlines(keepends=True) if not line.startswith('  File "<frozen runpy>"'))
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert "unflushed at the end" in fresh.stdout and "atexit ran" in fresh.stdout
    assert f"path0 {script.parent if launch.endswith('.py') else tmp_path}" in fresh.stdout
    assert "stdin ''" in fresh.stdout


@pytest.mark.slow
def test_a_forked_launch_past_its_timeout_is_killed_and_raises_as_subprocess_does(tmp_path, script):
    with pytest.raises(subprocess.TimeoutExpired):
        warm_python.run([sys.executable, str(script), "sleep"], cwd=tmp_path, timeout=1)
    assert warm_python.run([sys.executable, str(script), "status"], cwd=tmp_path, timeout=60).returncode == 3


def test_what_a_fork_cannot_give_runs_in_a_fresh_process(tmp_path, script):
    # A variable torch reads when it is imported, or a command prefix: a real process.
    assert not warm_python.forkable([sys.executable, str(script)], {"OMP_NUM_THREADS": "7"})
    assert not warm_python.forkable(["env", sys.executable, str(script)], None)
    assert not warm_python.forkable([sys.executable, "-m", "torch.distributed.run", "train.py"], None)
    result = warm_python.run(["env", "WARM_TEST=prefixed", sys.executable, str(script), "normal"], cwd=tmp_path,
                             timeout=60)
    assert "env prefixed torch imported False" in result.stderr

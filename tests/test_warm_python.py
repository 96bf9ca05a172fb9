"""tests.warm_python forks launches from a warm Python: each must end as `python SCRIPT` ends in a fresh process."""
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests import warm_python

SCRIPT = textwrap.dedent("""
    import atexit, os, sys, threading, time
    atexit.register(lambda: print("atexit ran", flush=True))

    class TornDown:  # its finalizer runs when the shutdown tears the script's module down, after atexit
        def __del__(self):
            print("torn down")

    kept = TornDown()
    left_open = open("left_open.txt", "w")  # written, never closed: the shutdown's teardown flushes it
    left_open.write("written, never closed")
    # Not a daemon: the shutdown waits for it, before atexit.
    thread = threading.Thread(target=lambda: (time.sleep(0.3), print("thread ended")))
    thread.start()
    print("argv", sys.argv, "cwd", os.getcwd(), "path0", sys.path[0], "stdin", repr(sys.stdin.read()))
    print("env", os.environ.get("WARM_TEST"), "torch imported", "torch" in sys.modules, file=sys.stderr)
    print("unflushed at the end")  # a pipe's stdout is block-buffered: the shutdown flushes it
    if sys.argv[1] == "message":
        raise SystemExit("error: told in one line")
    if sys.argv[1] == "exception":
        raise ValueError("uncaught")
    if sys.argv[1] == "status":
        sys.exit(3)
    if sys.argv[1] in ("sleep", "wait"):
        thread.join()  # a signal the test sends must reach the main thread's sleep, not this thread
        # Ctrl-C raises KeyboardInterrupt even where the shell that started the tests left SIGINT ignored (a
        # background job's), which Python would keep.
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("waiting", flush=True)
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
    assert (tmp_path / "left_open.txt").read_text() == "written, never closed"
    (tmp_path / "left_open.txt").unlink()
    forked = warm_python.run(args, cwd=tmp_path, timeout=60)
    assert (tmp_path / "left_open.txt").read_text() == "written, never closed"
    assert warm_python.forkable(args, None)
    # Only the preloaded modules differ (the fork has torch imported before the script runs), and `python -m`'s
    # traceback starts in runpy's frozen frames.
    assert forked.stderr.replace("torch imported True", "torch imported False") == "".join(
        line for line in fresh.stderr.splitlines(keepends=True) if not line.startswith('  File "<frozen runpy>"'))
    assert (forked.returncode, forked.stdout) == (fresh.returncode, fresh.stdout)
    assert "unflushed at the end" in fresh.stdout and "atexit ran" in fresh.stdout
    assert fresh.stdout.endswith("thread ended\natexit ran\ntorn down\n")
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


def popen(args, *, cwd, stdout, stderr):
    with open(stdout, "w") as out, open(stderr, "w") as err:
        return subprocess.Popen(args, cwd=cwd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL, None])
def test_a_started_launch_is_polled_signalled_and_waited_for_as_a_popen_of_a_fresh_python_is(tmp_path, script,
                                                                                              signum):
    args = [sys.executable, str(script), "wait" if signum else "status"]
    assert warm_python.forkable(args, None)
    ended = []
    for start in (popen, warm_python.start):
        out, err = tmp_path / f"{start.__name__}.out", tmp_path / f"{start.__name__}.err"
        process = start(args, cwd=tmp_path, stdout=out, stderr=err)
        deadline = time.monotonic() + 60
        while signum and "waiting" not in out.read_text():
            assert process.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.01)
        if signum:
            process.send_signal(signal.SIGSTOP)  # as a suspended job: neither ended nor waitable
            with pytest.raises(subprocess.TimeoutExpired):
                process.wait(timeout=0.2)
            process.send_signal(signal.SIGCONT)
            process.send_signal(signum)
        returncode = process.wait(timeout=60)
        stderr = err.read_text().replace("torch imported True", "torch imported False")  # preloaded in the fork
        ended.append((returncode, out.read_text(), stderr))
        assert process.poll() == process.returncode == ended[-1][0]
        process.kill()  # ended: nothing to signal, as Popen
    assert ended[0] == ended[1]
    assert ended[0][0] == (-signum if signum else 3), ended
    assert ("KeyboardInterrupt" in ended[0][2]) == (signum == signal.SIGINT)
    assert ("atexit ran" in ended[0][1]) == (signum in (signal.SIGINT, None))


RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    launcher = [os.environ[name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")]
    print("rank", dist.get_rank(), "launcher", launcher, "sum", total.item(), "argv", sys.argv[1:], flush=True)
    dist.destroy_process_group()
    if sys.argv[1] == "fail":
        sys.exit(3)
    time.sleep(float(sys.argv[1]))
""")


@pytest.mark.slow
def test_forked_ranks_form_one_gloo_group_each_with_its_launcher_variables_arguments_and_exit_status(tmp_path):
    (tmp_path / "ranks.py").write_text(RANK_SCRIPT)
    ranks = warm_python.run_ranks([sys.executable, "ranks.py"], world_size=3, cwd=tmp_path, timeout=120,
                                  rank_args=[["0"], ["fail"], ["0"]], end_on_failure=False)
    assert [rank.returncode for rank in ranks] == [0, 3, 0]
    for rank, result in enumerate(ranks):  # 1 + 2 + 3 summed over the group
        argv = "fail" if rank == 1 else "0"
        assert result.stdout == f"rank {rank} launcher {[str(rank), str(rank), '3', '3']} sum 6.0 argv {[argv]}\n"


@pytest.mark.slow
def test_a_failed_rank_ends_the_others_as_torchruns_agent_would_unless_each_rank_ends_on_its_own(tmp_path):
    (tmp_path / "ranks.py").write_text(RANK_SCRIPT)
    started = time.monotonic()
    ended = warm_python.run_ranks([sys.executable, "ranks.py"], world_size=2, cwd=tmp_path, timeout=120,
                                  rank_args=[["100"], ["fail"]])
    assert [rank.returncode for rank in ended] == [-9, 3] and time.monotonic() - started < 60
    left = warm_python.run_ranks([sys.executable, "ranks.py"], world_size=2, cwd=tmp_path, timeout=120,
                                 rank_args=[["8"], ["fail"]], end_on_failure=False)
    assert [rank.returncode for rank in left] == [0, 3]  # rank 0 slept its 8 s out

"""Run ``python SCRIPT ARGS...`` (or ``python -m MODULE ARGS...``) in a fresh process without paying for torch's
import each time.

Every launch of train.py imports torch, torch._dynamo (torch.optim imports it when an optimizer is built) and
Hydra: about 3.5 s of the 4 s a two-step CPU run takes. The suite launches train.py a few hundred times, so
``run`` forks each launch from a Python that has imported those once (a zygote, as Android starts apps) and runs
the script there as ``python SCRIPT`` would: its own process, working directory, environment, ``sys.argv``,
``sys.path[0]``, stdin from /dev/null, stdout and stderr captured, exit status, traceback or ``SystemExit``
message, and the interpreter's shutdown of what the launch ran (its threads waited for, atexit, flushing, its
modules and objects torn down; see ``end``). The script and the project's own modules are imported afresh in each
launch; only the third-party modules in ``PRELOADED`` are shared, and are not torn down at a launch's end: in a
fork that would only free the zygote's memory.
``run_ranks`` forks the ranks of one data-parallel job the same way, as srun would start them; ``start`` forks a
launch that a test does not wait for but polls and signals (Ctrl-C, SIGTERM, SIGKILL) while it runs, as a Popen.

What a fork cannot give, ``run`` and ``start`` leave to ``subprocess``: another interpreter or a command prefix
(``setpriv``), an environment that changes a variable read when torch is imported (``ENV_READ_AT_IMPORT``),
torchrun (``NOT_FORKED_MODULES``), and anything that is not ``python SCRIPT`` or ``python -m MODULE``. Tests about
how a launch starts (its imports, torchrun) start real processes.
"""
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PRELOADED = ("torch", "numpy", "hydra", "omegaconf", "sympy", "torch._dynamo")
ENV_READ_AT_IMPORT = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "TRITON_INTERPRET",
                      "CUDA_VISIBLE_DEVICES", "TORCH_COMPILE_DISABLE", "PYTHONHASHSEED")

# torchrun's workers read the agent's command line from /proc (training.elastic): a forked agent's is the zygote's.
NOT_FORKED_MODULES = ("torch.distributed.run",)

# The zygote: imports PRELOADED, then for each request forks a child that leaves the loop and runs the script at
# the top level, so that an uncaught exception or SystemExit ends it exactly as it ends `python SCRIPT`.
ZYGOTE = r"""
import gc, importlib, json, os, runpy, signal, socket, sys, time
for name in sys.argv[2].split(","):
    importlib.import_module(name)
# Frozen, the preloaded objects are not walked by a child's collections: walking them would copy their pages into
# the child.
gc.freeze()
PRELOADED_MODULES = set(sys.modules)
channel = socket.socket(fileno=int(sys.argv[1]))
requests = channel.makefile("r")

def serve():
    monitors = []
    for line in requests:
        request = json.loads(line)
        monitors = [monitor for monitor in monitors if not os.waitpid(monitor, os.WNOHANG)[0]]
        if "status" in request:  # started, not waited for: a monitor reports the pid, waits and writes the status
            pid_reader, pid_writer = os.pipe()
            monitor = os.fork()
            if monitor == 0:
                child = os.fork()
                if child == 0:
                    os.close(pid_reader)
                    os.close(pid_writer)
                    return {**request, **request["ranks"][0]}
                os.write(pid_writer, str(child).encode())
                status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
                with open(request["status"] + ".part", "w") as status_file:
                    status_file.write(str(status))
                os.rename(request["status"] + ".part", request["status"])
                os._exit(0)
            os.close(pid_writer)
            pid = int(os.read(pid_reader, 32))
            os.close(pid_reader)
            monitors.append(monitor)
            channel.sendall((json.dumps({"pid": pid}) + "\n").encode())
            continue
        children = []
        for rank in request["ranks"]:  # one process, or each rank of a job
            child = os.fork()
            if child == 0:
                return {**request, **rank}
            children.append(child)
        statuses = wait(children, request["timeout"], request["end_on_failure"])
        channel.sendall((json.dumps({"returncodes": statuses}) + "\n").encode())
    os._exit(0)  # no requests left; nothing of the zygote's needs a shutdown


# Each child's exit status, or "timeout". With end_on_failure, a rank that fails ends the others a few seconds
# later, as torchrun's agent does, rather than leaving them to wait for it in a collective.
def wait(children, timeout, end_on_failure):
    deadline, statuses, failed_at = time.monotonic() + timeout, {}, None
    while len(statuses) < len(children):
        for child in children:
            if child not in statuses:
                done, code = os.waitpid(child, os.WNOHANG)
                if done:
                    statuses[child] = os.waitstatus_to_exitcode(code)
                    if statuses[child] != 0 and failed_at is None and end_on_failure:
                        failed_at = time.monotonic()
        now = time.monotonic()
        if now > deadline or (failed_at is not None and now > failed_at + 5):
            for child in children:
                if child not in statuses:
                    os.killpg(child, signal.SIGKILL)
                    os.waitpid(child, 0)
                    statuses[child] = "timeout" if now > deadline else -signal.SIGKILL
        time.sleep(0.01)
    return [statuses[child] for child in children]


request = serve()
os.setpgid(0, 0)  # a timeout kills the script and whatever it started
channel.close()
stdin = os.open(os.devnull, os.O_RDONLY)
os.dup2(stdin, 0)
for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
    if path is None:  # stderr into stdout's file, as subprocess.STDOUT
        os.dup2(1, fd)
    else:
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
argv = request["argv"]
del request, stdin, fd, path


def run_as_main():
    import builtins, importlib.machinery, types
    main = types.ModuleType("__main__")  # the script's, not the zygote's
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    if argv[0] == "-m":  # python -m MODULE: the working directory first on the path, argv[0] the module's file
        sys.argv, sys.path[0] = ["-m", *argv[2:]], os.getcwd()
        sys.path[1:1] = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
        runpy._run_module_as_main(argv[1])  # what `python -m` runs
        return
    # python SCRIPT: argv[0] as given, __file__ absolute, the script's directory first on the path
    script = os.path.abspath(argv[0])
    sys.argv, sys.path[0] = list(argv), os.path.dirname(script)
    sys.path[1:1] = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    main.__file__ = script
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
    with open(script, "rb") as source:
        code = compile(source.read(), script, "exec")
    exec(code, main.__dict__)


# The status the interpreter ends with on an uncaught SystemExit: None is 0, an integer itself, anything else is
# printed on stderr and is 1.
def exit_status(error: SystemExit) -> int:
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code & 0xFF
    print(error.code, file=sys.stderr)
    return 1


# The script's module and the modules it imported leave sys.modules; the script's and its own modules' globals are
# cleared as the shutdown clears a module (names with one leading underscore first), in the reverse order of their
# imports, so that each object is freed as its last reference goes (a buffered file flushes before the file under
# it closes); the cycles left are collected. The libraries' modules are left alone.
def tear_down_what_the_launch_imported():
    import sysconfig
    libraries = tuple(sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib"))
    imported = [sys.modules.pop(name) for name in reversed([n for n in sys.modules if n not in PRELOADED_MODULES])]
    main = sys.modules.pop("__main__", None)
    for module in [*imported, main]:
        path = getattr(module, "__file__", None)
        if module is not None and (module is main or (path and not path.startswith(libraries))):
            namespace = vars(module)
            for first in (True, False):
                for key in list(namespace):
                    if key != "__builtins__" and (not first or (key[:1] == "_" and key[1:2] != "_")):
                        namespace[key] = None


# End as the interpreter's shutdown ends `python SCRIPT`, in its order: wait for the threads that are not daemons,
# run atexit, flush stdout and stderr (120 if that fails), tear down what the launch imported and made (so that
# their finalizers run and the files they left open are flushed), and end on SIGINT's default action after an
# uncaught KeyboardInterrupt. The preloaded modules are not torn down: in this copy of the zygote that would only
# free memory, and it took most of a launch's exit (0.4 of 0.5 s of CPU, measured).
def flush_std_streams() -> bool:
    flushed = True
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            flushed = False
    return flushed


def end(status: int, interrupted: bool):
    import atexit, ctypes, threading
    threading._shutdown()
    atexit._run_exitfuncs()
    atexit._clear()  # as the shutdown drops the callbacks, and with them what they hold
    if not flush_std_streams():
        status = 120
    tear_down_what_the_launch_imported()
    gc.collect()
    flush_std_streams()
    ctypes.CDLL(None).fflush(None)  # C's buffered output, as exit() flushes it
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


status, interrupted = 0, False
try:
    run_as_main()
except SystemExit as error:
    status = exit_status(error)
except BaseException as error:  # told as the interpreter tells it, without the zygote's and runpy's frames
    trace = error.__traceback__
    while trace is not None and trace.tb_frame.f_code.co_filename in ("<string>", "<frozen runpy>"):
        trace = trace.tb_next
    sys.excepthook(type(error), error.with_traceback(trace), trace)
    status, interrupted = 1, isinstance(error, KeyboardInterrupt)
    del trace
end(status, interrupted)
"""


class Zygote:
    def __init__(self):
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(theirs.fileno()), ",".join(PRELOADED)],
                                        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self.channel, self.replies = ours, ours.makefile("r")

    def run(self, argvs: list[list[str]], cwd: Path, envs: list[dict], timeout: float,
            end_on_failure: bool = True) -> list[tuple[int | None, str, str]]:
        """(exit status or None on a timeout, stdout, stderr) of each ``argvs[i]`` run with ``envs[i]``, all at the
        same time."""
        with tempfile.TemporaryDirectory() as folder:
            ranks = [{"argv": argv, "env": env, "stdout": f"{folder}/stdout{i}", "stderr": f"{folder}/stderr{i}"}
                     for i, (argv, env) in enumerate(zip(argvs, envs, strict=True))]
            reply = self.ask({"cwd": str(cwd), "timeout": timeout, "ranks": ranks, "end_on_failure": end_on_failure})
            return [(None if status == "timeout" else status, Path(rank["stdout"]).read_text(errors="replace"),
                     Path(rank["stderr"]).read_text(errors="replace"))
                    for status, rank in zip(reply["returncodes"], ranks)]

    def start(self, args: list[str], cwd: Path, env: dict, stdout: Path, stderr: Path | None) -> "Started":
        """``args`` (``python SCRIPT ...``) started, not waited for: stdout to the file ``stdout``, stderr to
        ``stderr`` or into stdout's file."""
        status = Path(tempfile.mkdtemp(prefix="warm-python-")) / "status"
        rank = {"argv": args[1:], "env": env, "stdout": str(stdout), "stderr": None if stderr is None else str(stderr)}
        return Started(args, self.ask({"cwd": str(cwd), "status": str(status), "ranks": [rank]})["pid"], status)

    def ask(self, request: dict) -> dict:
        """The zygote's reply to ``request``."""
        self.channel.sendall((json.dumps(request) + "\n").encode())
        reply = self.replies.readline()
        if not reply:
            raise RuntimeError(f"the warm Python (pid {self.process.pid}) ended: exit status {self.process.wait()}")
        return json.loads(reply)

    def close(self):
        self.replies.close()
        self.channel.close()  # the zygote reads the end of its requests and exits
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


_zygote: Zygote | None = None


def forkable(args, env) -> bool:
    """Whether ``args`` is ``python SCRIPT.py ...`` or ``python -m MODULE ...`` whose environment a fork of this
    process can give."""
    if len(args) < 2 or args[0] != sys.executable:
        return False
    if not (args[1].endswith(".py") or (args[1] == "-m" and len(args) > 2 and args[2] not in NOT_FORKED_MODULES)):
        return False
    return env is None or all(env.get(name) == os.environ.get(name) for name in ENV_READ_AT_IMPORT)


def zygote() -> Zygote:
    global _zygote
    if _zygote is None or _zygote.process.poll() is not None:
        _zygote = Zygote()
        atexit.register(_zygote.close)
    return _zygote


def run(args, *, cwd, timeout: float, env: dict | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=check)``,
    forked from a warm Python where it can be (see the module's docstring)."""
    args = [str(arg) for arg in args]
    if not forkable(args, env):
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=check)
    [(returncode, stdout, stderr)] = zygote().run([args[1:]], Path(cwd).resolve(),
                                                  [dict(os.environ if env is None else env)], timeout)
    if returncode is None:
        raise subprocess.TimeoutExpired(args, timeout, stdout, stderr)
    result = subprocess.CompletedProcess(args, returncode, stdout, stderr)
    if check:
        result.check_returncode()
    return result


class Started:
    """A script started from the warm Python, with the part of ``subprocess.Popen``'s interface that tests use:
    ``pid``, ``args``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``. Its exit status
    comes from the zygote's monitor of it (this process is not its parent)."""

    def __init__(self, args: list[str], pid: int, status: Path):
        self.args, self.pid, self.returncode, self._status = args, pid, None, status

    def poll(self) -> int | None:
        if self.returncode is None and self._status.exists():
            self.returncode = int(self._status.read_text())
            shutil.rmtree(self._status.parent, ignore_errors=True)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # ended since: as Popen, nothing to signal
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(args, *, cwd, stdout: Path, stderr: Path | None = None, env: dict | None = None):
    """``subprocess.Popen(args, cwd=cwd, env=env, ...)`` with stdout written to the file ``stdout`` and stderr to
    ``stderr`` (or into stdout's file), forked from the warm Python where it can be: a process that a test waits
    for, polls or signals (Ctrl-C, SIGTERM, SIGKILL) as it would a Popen."""
    args = [str(arg) for arg in args]
    if not forkable(args, env):
        with open(stdout, "w") as out, open(stderr or os.devnull, "w") as err:
            return subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=err if stderr else subprocess.STDOUT)
    for path in (stdout, stderr or stdout):  # there once this returns, as Popen's files are
        open(path, "w").close()
    return zygote().start(args, Path(cwd).resolve(), dict(os.environ if env is None else env), Path(stdout),
                          None if stderr is None else Path(stderr))


def free_port() -> int:
    """A port of this host that nothing listens on now, for a job's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(args, *, world_size: int, cwd, timeout: float, rank_args: list[list[str]] | None = None,
              end_on_failure: bool = True) -> list[subprocess.CompletedProcess]:
    """``args`` (``python SCRIPT ...`` or ``python -m MODULE ...``) as the ``world_size`` ranks of one job on this
    host, each forked from the warm Python with the variables torchrun gives its workers (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), as srun or a
    hand launch starts ranks: data-parallel runs without torchrun's agent and the fresh interpreters it starts.
    Tests about torchrun itself (its agent, restarts, signals) launch it instead. Rank r appends ``rank_args[r]``
    to ``args``. A rank that fails ends the others 5 s later, as torchrun's agent would, unless not
    ``end_on_failure`` (srun's ranks, which each end on their own). The ranks' results, by rank."""
    args = [str(arg) for arg in args]
    if not forkable(args, None):
        raise ValueError(f"run_ranks forks python SCRIPT or python -m MODULE, not {args[:3]}")
    launcher = {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port())}
    envs = [{**os.environ, **launcher, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(world_size)]
    argvs = [[*args[1:], *map(str, rank_args[rank] if rank_args else [])] for rank in range(world_size)]
    results = zygote().run(argvs, Path(cwd).resolve(), envs, timeout, end_on_failure)
    if any(returncode is None for returncode, _, _ in results):
        raise subprocess.TimeoutExpired(args, timeout, "".join(out for _, out, _ in results),
                                        "".join(err for _, _, err in results))
    return [subprocess.CompletedProcess([args[0], *argv], *result) for argv, result in zip(argvs, results)]

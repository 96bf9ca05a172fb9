"""What each launch of a run ran: the code (git commit, and any uncommitted change saved beside the run), the
libraries, the hosts and the command line. A table of runs can then say which code made each figure, and a
multi-node job whose nodes hold different code stops before it trains."""
import datetime
import fnmatch
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig

from training.atomic import atomic_file
from training.distributed import DistributedContext, all_gather_objects
from training.elastic import torchrun_command

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PATCH_DIR = "code"  # in the run directory: one patch per launch that ran uncommitted changes
PATCH_NAME = re.compile(r"launch_(\d+)\.patch")  # named after the step the launch started at
GIT_TIMEOUT_S = 30
MAX_UNTRACKED_NAMES = 20  # a launch record lists this many untracked files at most (and counts them all)
# New (untracked) source and config files of the project's packages are saved with a launch's patch, up to this
# many bytes in all: a new optimizer's module is some kilobytes; a stray data file there would bloat every run.
SOURCE_SUFFIXES = (".py", ".yaml")
MAX_SAVED_UNTRACKED_BYTES = 2**20
# Set by a launch script for the torchrun it runs: the script's command line with its settings, as shell words.
LAUNCH_SCRIPT_VARIABLE = "TRAIN_LAUNCH_SCRIPT"


class DifferentCodeOnRanks(ValueError):
    """The ranks of one job run different code: their updates would silently disagree."""


def git(root: Path, *args: str) -> bytes | None:
    """``git -C root args``'s output, or None where git or the checkout is missing (or too slow to answer)."""
    try:
        result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def checkout_commit(root: Path) -> str | None:
    """The commit checked out at ``root``; None where ``root`` is not the top of a git checkout that git can read
    (an installed copy, a tarball, a checkout another user owns, a folder inside some other repository, which
    would give that repository's commit)."""
    top = git(root, "rev-parse", "--show-toplevel")
    commit = git(root, "rev-parse", "HEAD")
    if top is None or commit is None or Path(os.fsdecode(top.strip())).resolve() != Path(root).resolve():
        return None
    return commit.decode().strip()


def code_version(root: Path = PROJECT_ROOT) -> dict:
    """The commit checked out at ``root`` (:func:`checkout_commit`), the uncommitted change to its code (``diff``,
    a patch in bytes, empty when clean) and the untracked files that git does not ignore (``untracked``).

    The change is that of the tracked files and, as new files, the untracked source and config files of the
    project's packages (a new optimizer's module and config, not yet added): ``untracked_saved``, up to
    ``MAX_SAVED_UNTRACKED_BYTES`` in all. Other untracked files (they may be anything) are only named, each with
    why it was left out (``untracked_left_out``). A copy of the project installed inside a user's own repository
    reports no commit rather than theirs.
    """
    commit = checkout_commit(root)
    if commit is None:
        return {"commit": None, "diff": b"", "untracked": [], "untracked_saved": [], "untracked_left_out": {}}
    diff = git(root, "diff", "HEAD", "--binary") or b""
    listed = git(root, "ls-files", "--others", "--exclude-standard", "-z")
    untracked = sorted(os.fsdecode(name) for name in (listed or b"").split(b"\0") if name)
    saved, left_out = [], {}
    packages = {package.name for package in project_packages(root)}
    for name in untracked:
        path = root / name
        if Path(name).parts[0] not in packages or path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            left_out[name] = "not a source or config file of the project's packages"
        elif sum(len(patch) for patch in saved) + path.stat().st_size > MAX_SAVED_UNTRACKED_BYTES:
            left_out[name] = f"past the {MAX_SAVED_UNTRACKED_BYTES // 2**10} KiB of new files a launch saves"
        elif (patch := new_file_patch(root, name)) is None:
            left_out[name] = "git could not write it as a patch"
        else:
            saved.append(patch)
    untracked_saved = [name for name in untracked if name not in left_out]
    return {"commit": commit, "diff": diff + b"".join(saved), "untracked": untracked,
            "untracked_saved": untracked_saved, "untracked_left_out": left_out}


def new_file_patch(root: Path, name: str) -> bytes | None:
    """The untracked file ``name`` as a patch that creates it (``git apply`` on the commit), or None where git
    cannot write one."""
    try:
        result = subprocess.run(["git", "-C", str(root), "diff", "--no-index", "--no-ext-diff", "--binary", "--",
                                 os.devnull, name], capture_output=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 1 and result.stdout else None  # 1: the files differ


def library_versions() -> dict:
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        versions["triton"] = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        pass
    if torch.cuda.is_available():
        versions["cuda"] = torch.version.cuda or torch.version.hip
        versions["cudnn"] = torch.backends.cudnn.version()
        try:
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (RuntimeError, AttributeError, TypeError):  # a build without NCCL: nothing to record
            pass
    return versions


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model and the threads torch uses: what a run or a measurement ran on."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with open("/proc/cpuinfo") as cpuinfo:
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    return f"{model or platform.processor()} ({torch.get_num_threads()} threads)"


# The packages of the install that a training rank never runs: the entry points people run beside it (tables,
# figures, benches), whose edits change nothing a run computes.
NOT_RUN_BY_RANKS = ("scripts",)


def project_packages(root: Path) -> list[Path]:
    """The project's package directories under ``root``, as pyproject.toml declares them (none without it)."""
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return []
    with open(pyproject, "rb") as f:
        patterns = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(path for path in root.iterdir()
                  if path.is_dir() and any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns))


def project_source(root: Path = PROJECT_ROOT) -> dict[str, str]:
    """{path relative to ``root``: sha256 of its bytes} for every source file a rank may run: train.py and the
    Python and YAML files of the project's packages, whether git knows them or not (a copy without ``.git``, an
    edited file), and whether or not this process has imported them yet (the optimizers load after the check)."""
    files = [root / "train.py"] + [path for package in project_packages(root) if package.name not in NOT_RUN_BY_RANKS
                                   for suffix in SOURCE_SUFFIXES for path in package.rglob(f"*{suffix}")
                                   if "__pycache__" not in path.parts]
    return {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(files) if path.is_file()}


def rank_code(code: dict, root: Path = PROJECT_ROOT) -> dict:
    """What each rank reports of its code: the commit, a digest of its uncommitted change, and its source files
    (:func:`project_source`) with one digest over them all."""
    diff, source = code["diff"], project_source(root)
    return {"host": socket.gethostname(), "commit": code["commit"],
            "diff_sha256": hashlib.sha256(diff).hexdigest() if diff else None,
            "source_sha256": hashlib.sha256(json.dumps(source).encode()).hexdigest(), "source": source}


def check_same_code(ranks: list[dict]) -> None:
    """Raise :class:`DifferentCodeOnRanks` when the ranks report different code: another commit or uncommitted
    change where git knows it, or other source files imported, which also catches a copy without ``.git``.

    Each rank steps its own optimizer on all-reduced gradients: different code on two nodes would train a model
    whose copies drift apart, with nothing to show for it but a worse loss.
    """
    versions = {}
    for rank, report in enumerate(ranks):
        if report["commit"] is not None:
            versions.setdefault((report["commit"], report["diff_sha256"]), []).append((rank, report["host"]))
    if len(versions) > 1:
        lines = [f"commit {commit[:12]}{' with uncommitted changes ' + digest[:12] if digest else ''}: ranks "
                 + ", ".join(f"{rank} ({host})" for rank, host in members)
                 for (commit, digest), members in versions.items()]
        raise DifferentCodeOnRanks("the ranks of this job run different code:\n  " + "\n  ".join(lines)
                                   + "\ncheck out the same commit, without local changes, on every node")
    reference = ranks[0]["source"]
    for rank, report in enumerate(ranks[1:], start=1):
        # A file one rank lacks differs too.
        differ = sorted(name for name in reference.keys() | report["source"].keys()
                        if reference.get(name) != report["source"].get(name))
        if differ:
            raise DifferentCodeOnRanks(
                f"the ranks of this job run different code: rank {rank} ({report['host']}) holds other source "
                f"files than rank 0 ({ranks[0]['host']}): {', '.join(differ)}\ncopy the same code to every node "
                f"(commit {ranks[0]['commit'] or 'unknown'} on rank 0, {report['commit'] or 'unknown'} on rank {rank})")


def launch_command() -> dict:
    """How this run was started: its Hydra overrides (a sweep point's own, wherever Hydra runs it: not the
    ``.submitit/%j`` folder that submitit's wrapper gets as its argument), torchrun's command line (None outside
    torchrun) and the launch script that ran torchrun, with its settings (None without one)."""
    overrides = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else sys.argv[1:]
    torchrun = torchrun_command()
    script = os.environ.get(LAUNCH_SCRIPT_VARIABLE) if torchrun is not None else None
    return {"command": overrides, "torchrun": torchrun, "script": script}


def launcher_words() -> str:
    """The start of the command line that launched this process, up to its training script, as shell words:
    the launch script with its settings (scripts/launch_single_node.sh exports them), else torchrun with its
    arguments, else python. Followed by this process's arguments it launches the same processes again."""
    launch = launch_command()
    if launch["script"]:
        return launch["script"]
    arguments, torchrun = sys.argv[1:], launch["torchrun"]
    if torchrun is not None and torchrun[len(torchrun) - len(arguments):] == arguments:
        launcher = torchrun[:len(torchrun) - len(arguments)]
        # By its path (torchrun's agent was started as `python -m torch.distributed.run` from the venv's PATH, say):
        # a shell without the venv finds the same program.
        return shlex.join([shutil.which(launcher[0]) or launcher[0], *launcher[1:]])
    return shlex.join([sys.executable, sys.argv[0]])


class ProvenanceWriteError(ValueError):
    """The record of the code a launch runs could not be saved; the message says why and how to go on."""


def patch_files(run_dir: Path) -> list[Path]:
    """The patches that launches into ``run_dir`` saved, each named after the step its launch started at."""
    return sorted(path for path in (Path(run_dir) / PATCH_DIR).glob("launch_*.patch")
                  if PATCH_NAME.fullmatch(path.name))


def launch_record(run_dir: Path, step: int, code: dict, ranks: list[dict], device: torch.device) -> dict:
    """The launch's record for metrics.jsonl; an uncommitted change (new source files of the project's packages
    among it: :func:`code_version`) is saved as ``code/launch_<step>.patch`` in ``run_dir`` (``git apply`` it on the
    commit to get the code back), and named by its digest; the untracked files left out are named, with why.

    The patches of launches at ``step`` or later go first: a resume from ``step`` drops those launches' records
    from the log (:meth:`training.metrics.MetricsLogger.discard_after`), and a patch must not outlive its record.
    """
    for stale in patch_files(run_dir):
        if int(PATCH_NAME.fullmatch(stale.name).group(1)) >= step:
            stale.unlink()
    patch = None
    if code["diff"]:
        path = Path(run_dir) / PATCH_DIR / f"launch_{step:08d}.patch"  # as PATCH_NAME reads it
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path, "wb") as f:
                f.write(code["diff"])
        except OSError as err:  # a full disk or quota, a vanished or read-only directory
            raise ProvenanceWriteError(
                f"could not save this launch's uncommitted changes to {path} ({err.strerror or err}): a run must "
                "record the code it ran; free space or fix the directory, then launch again (train.resume=true "
                "continues from the last checkpoint)") from None
        patch = str(path.relative_to(run_dir))
    left_out = list(code["untracked_left_out"].items())
    return {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **launch_command(), "commit": code["commit"], "patch": patch,
            "patch_sha256": hashlib.sha256(code["diff"]).hexdigest() if patch else None,
            "untracked_saved": code["untracked_saved"][:MAX_UNTRACKED_NAMES],
            "untracked_left_out": [list(item) for item in left_out[:MAX_UNTRACKED_NAMES]],
            "untracked_left_out_count": len(left_out),
            "ranks": [{"host": report["host"], "commit": report["commit"], "source_sha256": report["source_sha256"]}
                      for report in ranks],
            "untracked": code["untracked"][:MAX_UNTRACKED_NAMES], "untracked_count": len(code["untracked"]),
            "versions": library_versions(),
            "device": device_name(device), "world_size": len(ranks),
            "hosts": sorted({report["host"] for report in ranks})}


def describe_launch(launch: dict) -> str:
    """One log line: ``code 1dd955f72c9c (uncommitted changes: code/launch_00000000.patch) | python ... | ...``."""
    if launch["commit"] is None:
        code = f"code: commit unknown (no git checkout at {PROJECT_ROOT} that git can read)"
    else:
        notes = []
        if launch["patch"]:
            new = launch["untracked_saved"]
            notes.append(f"uncommitted changes: {launch['patch']}"
                         + (f", with {len(new)} new file(s): {', '.join(new)}" if new else ""))
        if launch["untracked_left_out_count"]:
            more = ", ..." if launch["untracked_left_out_count"] > len(launch["untracked_left_out"]) else ""
            notes.append(f"{launch['untracked_left_out_count']} untracked file(s) not saved: "
                         + ", ".join(f"{name} ({why})" for name, why in launch["untracked_left_out"]) + more)
        code = f"code {launch['commit'][:12]}" + (f" ({'; '.join(notes)})" if notes else "")
    versions = " | ".join(f"{name} {version}" for name, version in launch["versions"].items())
    return f"{code} | {versions} | {launch['world_size']} x {launch['device']} on {', '.join(launch['hosts'])}"


def code_on_every_rank(ctx: DistributedContext) -> tuple[dict, list[dict]]:
    """This rank's code and every rank's report of its own; raises :class:`DifferentCodeOnRanks` on every rank
    alike when they differ."""
    code = code_version()
    ranks = all_gather_objects(rank_code(code), ctx)
    check_same_code(ranks)
    return code, ranks

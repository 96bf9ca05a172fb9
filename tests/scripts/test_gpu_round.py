"""scripts/gpu_round.sh, checked on the CPU before a GPU's short lease is spent on it: every part's command is one
its script accepts, and the parts are the ones the Speed page quotes."""
import os
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests import warm_python

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_round.sh"


def dry_run(tmp_path, **env) -> dict[str, list[str]]:
    """Part name -> its command, as the script would run it."""
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), str(tmp_path / "authors")],
                            env={**os.environ, "GPU_ROUND_DRY_RUN": "1", **env}, capture_output=True, text=True,
                            check=True, cwd=ROOT)
    commands = {}
    for line in result.stdout.splitlines():
        name, _, command = line.partition(":")
        if command.strip().startswith("python"):
            commands[name] = shlex.split(command)
    return commands


def test_the_round_has_every_part_the_speed_page_quotes_and_skips_autotune_unless_asked(tmp_path):
    parts = list(dry_run(tmp_path))
    assert set(parts[:2]) == {"tests", "authors"}  # untimed, side by side: in either order
    assert parts[2:] == ["newton_schulz", "train_optimizers", "train_mfu", "train_mars_m", "optimizer_overhead",
                         "authors_trainers"]
    assert "train_autotune" in dry_run(tmp_path, GPU_ROUND_SKIP="")
    assert list(dry_run(tmp_path, GPU_ROUND_SKIP="tests authors")) == [
        "newton_schulz", "train_optimizers", "train_mfu", "train_mars_m", "optimizer_overhead", "authors_trainers",
        "train_autotune"]


def test_the_authors_trainers_are_timed_from_the_checkout_given_and_skipped_without_one(tmp_path):
    command = dry_run(tmp_path)["authors_trainers"]
    assert command[command.index("--authors-dir") + 1] == str(tmp_path / "authors")
    assert command[command.index("--output-dir") + 1] == str(tmp_path / "out")
    result = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], env={**os.environ, "GPU_ROUND_DRY_RUN": "1"},
                            capture_output=True, text=True, check=True, cwd=ROOT)
    assert "authors_trainers: skipped, no checkout of AGI-Arena/MARS given" in result.stdout.splitlines()
    assert not any(line.startswith("authors_trainers:") and "python" in line for line in result.stdout.splitlines())


@pytest.mark.slow
# runpy's note that a script it runs as __main__ was imported as a module by another test: meant here.
@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")
def test_every_part_is_a_command_its_script_accepts(tmp_path, monkeypatch, capsys):
    """A label or option renamed in a bench script would cost a GPU round; argparse checks each argument it
    reads before reaching the appended --help, so an unknown option or choice fails here."""
    for name, command in dry_run(tmp_path, GPU_ROUND_SKIP="").items():
        assert command[:2] == ["python3", "-m"], name
        if command[2] == "pytest":
            result = warm_python.run([sys.executable, *command[1:], "--help"], cwd=ROOT, timeout=300)
            assert result.returncode == 0, f"{name}: {result.stderr[-500:]}"
            continue
        # The bench scripts in this process, as `python -m` runs them (their imports are this suite's already), on a
        # machine with a GPU as the round's: their --device cuda is checked against the CUDA devices there are.
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(sys, "argv", [command[2], *command[3:], "--help"])
        with pytest.raises(SystemExit) as exit:
            runpy.run_module(command[2], run_name="__main__", alter_sys=True)
        assert exit.value.code == 0, f"{name}: {capsys.readouterr().err[-500:]}"

"""scripts/launch_single_node.sh counts the GPUs with nvidia-smi, or says in one line how to give the count."""
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What the script runs besides nvidia-smi and torchrun.
TOOLS = ("bash", "dirname", "date", "grep", "mktemp", "rm")


def launch(tmp_path: Path, fake_tools: dict[str, str], **env: str) -> subprocess.CompletedProcess:
    """The script on a PATH that holds only its tools and ``fake_tools`` (name: bash body)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for name in TOOLS:
        (bin_dir / name).symlink_to(subprocess.run(["bash", "-c", f"command -v {name}"], capture_output=True,
                                                   text=True, check=True).stdout.strip())
    for name, body in fake_tools.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    base = {key: value for key, value in os.environ.items() if key != "NPROC"}
    return subprocess.run([str(bin_dir / "bash"), str(REPO / "scripts/launch_single_node.sh"), "optimizer=adamw"],
                          env={**base, **env, "PATH": str(bin_dir), "TORCHRUN_ARGS": str(tmp_path / "args")},
                          capture_output=True, text=True, timeout=60)


TORCHRUN = {"torchrun": 'printf "%s\\n" "$@" > "$TORCHRUN_ARGS"\n'}


@pytest.mark.parametrize("nvidia_smi, cause", [
    ({}, "nvidia-smi is not on PATH"),
    ({"nvidia-smi": 'echo "NVIDIA-SMI has failed because it could not communicate with the driver"; exit 9\n'},
     "nvidia-smi -L failed (NVIDIA-SMI has failed because it could not communicate with the driver)"),
])
def test_without_a_working_nvidia_smi_one_line_says_what_is_missing_and_how_to_set_the_gpu_count(tmp_path,
                                                                                                  nvidia_smi, cause):
    result = launch(tmp_path, {**TORCHRUN, **nvidia_smi})
    assert result.returncode == 1 and not (tmp_path / "args").exists()
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: {cause}") and "NPROC=8 scripts/launch_single_node.sh" in line, line


def test_one_process_per_gpu_that_nvidia_smi_lists_or_as_many_as_nproc_says(tmp_path):
    listing = 'printf "GPU 0: NVIDIA H100 (UUID: a)\\nGPU 1: NVIDIA H100 (UUID: b)\\n"\n'
    result = launch(tmp_path, {**TORCHRUN, "nvidia-smi": listing})
    assert result.returncode == 0, result.stderr
    assert "--nproc_per_node=2" in (tmp_path / "args").read_text().splitlines()
    result = launch(tmp_path / "nproc", TORCHRUN, NPROC="3")
    assert result.returncode == 0, result.stderr
    assert "--nproc_per_node=3" in (tmp_path / "nproc" / "args").read_text().splitlines()

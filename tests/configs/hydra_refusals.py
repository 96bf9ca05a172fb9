"""What Hydra refuses, each case set once on the command line and once in a config file of the user's own directory,
with the one line train.py gives for each (``configs/composition_errors.py``): shared by the tests of the check
(tests/configs/test_compose.py) and of train.py's launch (tests/test_one_line_errors.py)."""
from pathlib import Path
from typing import NamedTuple


class HydraCase(NamedTuple):
    override: str  # on the command line
    on_command_line: str  # the start of the line told for it
    group: str  # the config group of the user's own file, mine.yaml, that sets the same
    file_text: str
    in_file: str | None  # the start of the line told for the file ({file}: its path); None: not refused


HYDRA_CASES = {
    "unknown option": HydraCase(
        "optimizer=mars-adam",
        "unknown option optimizer=mars-adam: did you mean optimizer=mars-adamw? the options of optimizer are adamw, ",
        "experiment", "# @package _global_\ndefaults:\n  - override /optimizer: mars-adam\n",
        "unknown option optimizer=mars-adam in {file}: did you mean optimizer=mars-adamw? the options of optimizer "
        "are adamw, "),
    "not a number": HydraCase(
        "optimizer.lr=fast", "optimizer.lr must be a number, not 'fast'",
        "optimizer", "defaults:\n  - adamw\n  - _self_\nlr: fast\n",
        "optimizer.lr in {file} must be a number, not 'fast'"),
    "not a whole number": HydraCase(
        "train.max_iters=1e3", "train.max_iters must be a whole number, not 1e3: write 1000",
        "experiment", "# @package _global_\ntrain:\n  max_iters: 1e3\n",
        "train.max_iters in {file} must be a whole number, not 1000.0: write 1000"),
    # In a file, ~ is a plain string that the code expands where it reads a path.
    "tilde in a path": HydraCase(
        "data.dir=~/data/mine",
        "data.dir=~/data/mine: Hydra's override grammar takes no unquoted ~, and the shell expands none after '=': "
        "write data.dir=$HOME/data/mine or 'data.dir=\"~/data/mine\"'",
        "data", "defaults:\n  - custom\n  - _self_\ndir: ~/data/mine\n", None),
    "several values without -m": HydraCase(
        "optimizer.lr=1e-3,3e-3",
        "optimizer.lr=1e-3,3e-3 gives several values, which only a sweep runs: add -m to sweep over them",
        "experiment", "# @package _global_\noptimizer:\n  lr: 1e-3,3e-3\n",
        "optimizer.lr in {file} must be a number, not '1e-3,3e-3': give one value; several are a sweep, run with -m "
        "from the command line (python train.py -m ... optimizer.lr=1e-3,3e-3)"),
}


def users_config(config_dir: Path, case: HydraCase) -> tuple[Path, list[str]]:
    """The user's own ``<group>/mine.yaml`` of ``case`` under ``config_dir``, and the arguments that choose it."""
    (config_dir / case.group).mkdir(parents=True)
    mine = config_dir / case.group / "mine.yaml"
    mine.write_text(case.file_text)
    return mine, ["--config-dir", str(config_dir), f"{case.group}=mine"]

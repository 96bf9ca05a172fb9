import os
import shlex
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    """The two commands of the README's first code block: set up and train, set up and test."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index("```bash") + 1
    return lines[start : lines.index("```", start)]


def test_readme_opens_with_a_train_command_and_a_test_command():
    train_command, test_command = readme_commands()
    assert train_command.endswith("python train.py")
    assert "pytest" in test_command


def test_ci_runs_the_readme_test_command():
    _, test_command = readme_commands()
    assert test_command in (REPO / ".ci" / "run").read_text()


def readme_train_overrides() -> list[str]:
    """Every key=value argument of a `train.py` command in the README's code blocks, as bash passes it on."""
    text = (REPO / "README.md").read_text().replace("\\\n", " ")
    overrides = []
    for block in text.split("```bash")[1:]:
        for line in block.split("```")[0].splitlines():
            command = line.split("#")[0]
            if "train.py" not in command:
                continue
            arguments = shlex.split(command.split("train.py", 1)[1])
            # bash expands $HOME (and any variable) inside a word, but `~` only at a word's start.
            overrides += [os.path.expandvars(a) for a in arguments if "=" in a and not a.startswith("-")]
    return overrides


def test_every_train_override_in_the_readme_parses_as_hydra_reads_it():
    overrides = readme_train_overrides()
    assert any(o.startswith("data.dir=") for o in overrides)  # the examples of issue 14 are among them
    OverridesParser.create().parse_overrides(overrides)  # raises on what Hydra's grammar refuses (`data.dir=~/x`)


def test_the_readme_data_dir_examples_point_at_the_users_home():
    for override in readme_train_overrides():
        if override.startswith("data.dir="):
            assert override.removeprefix("data.dir=").startswith(os.path.expanduser("~")), override

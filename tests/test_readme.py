from pathlib import Path

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

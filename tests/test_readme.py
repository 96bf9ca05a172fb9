from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme_lines = (REPO / "README.md").read_text().splitlines()
    test_command = readme_lines[3]
    assert "pytest" in test_command
    assert test_command in (REPO / ".ci" / "run").read_text()

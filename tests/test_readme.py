import os
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

from tests import warm_python

REPO = Path(__file__).resolve().parents[1]
DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "results" / "README.md"]


def readme_commands() -> list[str]:
    """The commands of the README's first code block: set up and train, set up and test."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index("```bash") + 1
    return lines[start : lines.index("```", start)]


def readme_opening() -> str:
    """The README's first paragraph after its first code block, as one line."""
    text = (REPO / "README.md").read_text()
    after = text.split("```", 2)[2].removeprefix("\n").lstrip("\n")
    return after.split("\n\n", 1)[0].replace("\n", " ")


SETUP = "python3 -m venv .venv && "


def test_readme_opens_with_exactly_two_commands_each_setting_up_a_fresh_machine_and_running_its_job():
    train_command, test_command = readme_commands()  # exactly two: a third would need one of them run before it
    for command in (train_command, test_command):
        assert command.startswith(SETUP), command  # each runs on a fresh machine on its own
    steps = [step.strip() for step in test_command.split("&&")]
    installs = [i for i, step in enumerate(steps) if step.startswith(".venv/bin/pip install")
                and ".[test]" in shlex.split(step)]
    runs = [i for i, step in enumerate(steps) if step.startswith(".venv/bin/python -m pytest")]
    assert installs and runs == [len(steps) - 1] and installs[0] < runs[0]  # pytest, installed before it runs
    assert train_command.endswith(" && .venv/bin/python train.py")


def test_the_fast_tier_is_named_after_the_commands_as_an_option_of_the_second():
    _, test_command = readme_commands()
    opening = readme_opening()
    option = '-m "not slow"'
    assert option not in test_command and f"add `{option}` to its pytest command" in opening, opening
    fast_tier = shlex.split(test_command.rsplit("&&", 1)[1]) + shlex.split(option)
    assert fast_tier[:3] == [".venv/bin/python", "-m", "pytest"] and fast_tier[-2:] == ["-m", "not slow"]


def test_the_readme_gives_the_default_runs_measured_time_on_an_idle_two_core_machine_for_its_steps():
    from configs.compose import compose_config

    opening = readme_opening()
    measured = re.search(r"\(`\.venv/bin/python train\.py`, (\d+) steps\) took (\d+) min (\d+) s on an idle "
                         r"(\d+)-core", opening)
    assert measured, opening
    steps, minutes, seconds, cores = map(int, measured.groups())
    assert steps == compose_config([]).train.max_iters  # a longer default run is measured again
    assert cores == 2 and minutes * 60 + seconds <= 180  # CI's machine, where the default run keeps to 3 minutes


def test_ci_runs_the_readme_test_command():
    _, test_command = readme_commands()
    assert test_command in (REPO / ".ci" / "run").read_text()
    # Workers (-n) come from pytest-xdist: the test extra must install it.
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert "-n" not in shlex.split(test_command) or any(extra.startswith("pytest-xdist") for extra in extras)


def train_overrides(page: Path) -> list[str]:
    """Every key=value argument of a `train.py` command in the page's bash blocks, as bash passes it on."""
    text = page.read_text().replace("\\\n", " ")
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


def documented_train_overrides() -> list[str]:
    return [override for page in DOC_PAGES for override in train_overrides(page)]


def test_every_train_override_in_the_readme_and_docs_parses_as_hydra_reads_it():
    overrides = documented_train_overrides()
    # The custom-corpus examples (`data.dir=$HOME/...`) are among them: `~` there is what Hydra's grammar refuses.
    assert any(o.startswith("data.dir=") for o in train_overrides(REPO / "README.md"))
    OverridesParser.create().parse_overrides(overrides)  # raises on what Hydra's grammar refuses (`data.dir=~/x`)


def test_the_documented_data_dir_examples_point_at_the_users_home():
    for override in documented_train_overrides():
        if override.startswith("data.dir="):
            assert override.removeprefix("data.dir=").startswith(os.path.expanduser("~")), override


def anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_in_the_readme_and_docs_points_at_a_file_and_heading_that_exist():
    for page in DOC_PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.exists(), f"{page.name}: {target}"
            if fragment and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.MULTILINE)
                assert fragment in map(anchor, headings), f"{page.name}: {target}"


def test_the_docs_name_no_path_outside_the_repository():
    for page in DOC_PAGES:
        for target in re.findall(r"\]\(([^)\s#]+)", page.read_text()):
            if not re.match(r"[a-z]+:", target):
                assert (page.parent / target).resolve().is_relative_to(REPO), f"{page.name}: {target}"
        assert "../shared" not in page.read_text(), page.name


TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".sbatch", ".toml", ".txt", ""}
# A number after '#' or after the word issue names a tracker entry, which a reader of the tree cannot follow;
# hexadecimal colours are not such numbers.
ISSUE_REFERENCE = re.compile(r"(?<![&\w])#\d{1,4}\b(?![0-9a-fA-F])|\bissues? #?\d+\b", re.IGNORECASE)


def test_no_file_of_the_tree_refers_to_an_issue_by_number():
    roots = ["README.md", "train.py", "pyproject.toml", ".ci", "docs", "configs", "data", "evaluation", "mars",
             "model", "reporting", "scripts", "results", "tests", "training"]
    files = [p for root in roots for p in ([REPO / root] if (REPO / root).is_file() else (REPO / root).rglob("*"))]
    offenders = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
                 for path in files if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts
                 for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                 if ISSUE_REFERENCE.search(line)]
    assert not offenders, "\n".join(offenders)



def documented_train_command(page: Path, flag: str) -> list[str]:
    """The one `python train.py ...` command of the page's bash blocks that passes ``flag``, run by this Python."""
    blocks = page.read_text().replace("\\\n", " ").split("```bash")[1:]
    commands = [shlex.split(line.split("#")[0]) for block in blocks for line in block.split("```")[0].splitlines()
                if line.startswith("python train.py ")]
    (command,) = [command for command in commands if flag in command]
    return [sys.executable, *command[1:]]


@pytest.mark.slow
@pytest.mark.parametrize("page", ["README.md", "docs/configuration.md"])
def test_the_documented_help_lists_every_preset_and_cfg_job_prints_values_unchecked_as_the_docs_say(page):
    shown = warm_python.run(documented_train_command(REPO / page, "--help"), cwd=REPO, timeout=300)
    assert shown.returncode == 0, shown.stderr
    for group in ("model", "optimizer", "data", "experiment"):
        presets = sorted(path.stem for path in (REPO / "configs" / group).glob("*.yaml"))
        assert f"\n{group}: {', '.join(presets)}\n" in shown.stdout, shown.stdout
    printed = warm_python.run(documented_train_command(REPO / page, "--cfg"), cwd=REPO, timeout=300)
    assert printed.returncode == 0 and "  name: muon\n" in printed.stdout, printed.stderr
    # The docs say that values are not checked: a gamma the launch refuses is printed as given.
    unchecked = warm_python.run([sys.executable, "train.py", "--cfg", "job", "optimizer.gamma=-0.1"], cwd=REPO,
                                timeout=300)
    assert unchecked.returncode == 0 and "  gamma: -0.1\n" in unchecked.stdout, unchecked.stderr
    assert "`optimizer.gamma=-0.1`" in (REPO / page).read_text()


def test_no_page_lists_the_optimizer_configs_by_hand_so_a_new_one_needs_no_docs_edit():
    names = [path.stem for path in (REPO / "configs" / "optimizer").glob("*.yaml")]
    for page in DOC_PAGES:
        for line in page.read_text().splitlines():
            named = [name for name in names if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", line)]
            assert len(named) < 4, f"{page.name} lists the optimizers by hand (configs/optimizer/ has them): {line}"

"""Each launch records the code it ran (commit, uncommitted change, untracked files), and ranks holding different
code stop before they train."""
import subprocess
from pathlib import Path

import pytest
import torch

from reporting.run_labels import code_label
from training.provenance import (MAX_SAVED_UNTRACKED_BYTES, DifferentCodeOnRanks, check_same_code, checkout_commit,
                                 code_version, device_name, describe_launch, launch_record, project_source, rank_code)

GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-c", "init.defaultBranch=main"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A git checkout with one commit of two files."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "optimizer.py").write_text("lr = 1e-3\n")
    (repo / "model.py").write_text("layers = 2\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    return repo


def test_a_clean_checkout_reports_its_commit_and_no_change(checkout):
    code = code_version(checkout)
    assert code == {"commit": git(checkout, "rev-parse", "HEAD").strip(), "diff": b"", "untracked": [],
                    "untracked_saved": [], "untracked_left_out": {}}


def test_the_saved_patch_applied_on_the_commit_gives_back_the_code_that_ran(checkout, tmp_path):
    (checkout / "optimizer.py").write_text("lr = 3e-3\n")  # edited, not committed
    (checkout / "model.py").unlink()
    (checkout / "notes.txt").write_text("untracked\n")
    code = code_version(checkout)
    assert code["untracked"] == ["notes.txt"] and code["diff"]
    launch = launch_record(tmp_path / "run", 250, code, [rank_code(code)], torch.device("cpu"))
    assert launch["patch"] == "code/launch_00000250.patch"
    assert launch["untracked"] == ["notes.txt"] and launch["untracked_count"] == 1

    again = tmp_path / "again"
    git(tmp_path, "clone", "-q", str(checkout), str(again))
    git(again, "checkout", "-q", launch["commit"])
    git(again, "apply", str(tmp_path / "run" / launch["patch"]))
    assert (again / "optimizer.py").read_text() == "lr = 3e-3\n" and not (again / "model.py").exists()


@pytest.fixture
def project_checkout(tmp_path) -> Path:
    """A git checkout laid out as this project: pyproject.toml naming its packages, one module committed."""
    repo = tmp_path / "project"
    (repo / "mars").mkdir(parents=True)
    (repo / "configs" / "optimizer").mkdir(parents=True)
    (repo / "pyproject.toml").write_text('[tool.setuptools.packages.find]\ninclude = ["mars*", "configs*"]\n')
    (repo / "mars" / "__init__.py").write_text("")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    return repo


def test_new_source_files_of_the_projects_packages_are_saved_so_the_record_rebuilds_the_code(project_checkout,
                                                                                              tmp_path):
    # An optimizer being written: its module and config not yet added to git.
    (project_checkout / "mars" / "adopt.py").write_text("class Adopt:\n    pass\n")
    (project_checkout / "configs" / "optimizer" / "adopt.yaml").write_text("name: adopt\nlr: 1e-3\n")
    (project_checkout / "mars" / "table.py").write_bytes(b"#" * (MAX_SAVED_UNTRACKED_BYTES + 1))  # too big to save
    (project_checkout / "notes.txt").write_text("ideas\n")  # not the project's source
    code = code_version(project_checkout)
    assert code["untracked_saved"] == ["configs/optimizer/adopt.yaml", "mars/adopt.py"]
    assert code["untracked_left_out"] == {
        "mars/table.py": "past the 1024 KiB of new files a launch saves",
        "notes.txt": "not a source or config file of the project's packages"}
    launch = launch_record(tmp_path / "run", 0, code, [rank_code(code, project_checkout)], torch.device("cpu"))
    assert launch["patch"] == "code/launch_00000000.patch"
    assert ("uncommitted changes: code/launch_00000000.patch, with 2 new file(s): configs/optimizer/adopt.yaml, "
            "mars/adopt.py; 2 untracked file(s) not saved: mars/table.py (past the 1024 KiB of new files a launch "
            "saves), notes.txt (not a source or config file of the project's packages)") in describe_launch(launch)

    again = tmp_path / "again"
    git(tmp_path, "clone", "-q", str(project_checkout), str(again))
    git(again, "checkout", "-q", launch["commit"])
    git(again, "apply", str(tmp_path / "run" / launch["patch"]))
    assert (again / "mars" / "adopt.py").read_text() == "class Adopt:\n    pass\n"
    assert (again / "configs" / "optimizer" / "adopt.yaml").read_text() == "name: adopt\nlr: 1e-3\n"
    assert not (again / "mars" / "table.py").exists() and not (again / "notes.txt").exists()

    # The table's code column tells the run apart from a clean one, and from one with other new files.
    (project_checkout / "mars" / "adopt.py").write_text("class Adopt:\n    eps = 1e-6\n")
    other = code_version(project_checkout)
    other_launch = launch_record(tmp_path / "other", 0, other, [rank_code(other, project_checkout)],
                                 torch.device("cpu"))
    for path in ("mars/adopt.py", "mars/table.py", "configs/optimizer/adopt.yaml", "notes.txt"):
        (project_checkout / path).unlink()
    clean = code_version(project_checkout)
    clean_launch = launch_record(tmp_path / "clean", 0, clean, [rank_code(clean, project_checkout)],
                                 torch.device("cpu"))
    labels = [code_label(record) for record in (launch, other_launch, clean_launch)]
    assert len(set(labels)) == 3 and labels[2] == launch["commit"][:7] and labels[0].startswith(labels[2] + "+")


def test_a_clean_launch_writes_no_patch(checkout, tmp_path):
    code = code_version(checkout)
    launch = launch_record(tmp_path / "run", 0, code, [rank_code(code)] * 2, torch.device("cpu"))
    assert launch["patch"] is None and not (tmp_path / "run").exists()
    assert launch["world_size"] == 2 and len(launch["hosts"]) == 1
    assert launch["device"] == device_name(torch.device("cpu")) and launch["device"].endswith(" threads)")
    assert describe_launch(launch).startswith(f"code {code['commit'][:12]} | python ")


def test_a_launch_removes_the_patches_of_launches_whose_records_a_resume_from_its_step_drops(checkout, tmp_path):
    run = tmp_path / "run"
    (run / "code").mkdir(parents=True)
    for name in ("launch_00000000.patch", "launch_00000250.patch", "launch_00000300.patch", "mine.patch"):
        (run / "code" / name).write_text("old")
    (checkout / "optimizer.py").write_text("lr = 3e-3\n")
    code = code_version(checkout)
    launch_record(run, 250, code, [rank_code(code)], torch.device("cpu"))  # resumed from step 250
    assert sorted(path.name for path in (run / "code").iterdir()) == ["launch_00000000.patch",
                                                                    "launch_00000250.patch", "mine.patch"]
    assert (run / "code" / "launch_00000250.patch").read_bytes() == code["diff"]
    git(checkout, "commit", "-qam", "second")
    clean = code_version(checkout)  # no change to save: the old launch's patch at this step goes all the same
    launch_record(run, 0, clean, [rank_code(clean)], torch.device("cpu"))
    assert [path.name for path in (run / "code").iterdir()] == ["mine.patch"]


def test_the_commit_is_read_from_the_top_of_a_work_tree_only(tmp_path):
    # Also how scripts/check_against_authors names the authors' commit.
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "checkout"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (tmp_path / "inside").mkdir()
    assert checkout_commit(tmp_path) == head
    assert checkout_commit(tmp_path / "inside") is None
    assert checkout_commit(tmp_path / "absent") is None


def test_a_copy_that_is_not_the_top_of_a_checkout_reports_no_commit(checkout, tmp_path):
    # The project installed inside another repository (a virtual environment in a user's project) is not that
    # repository's code.
    (checkout / "project").mkdir()
    assert code_version(checkout / "project")["commit"] is None
    assert code_version(tmp_path)["commit"] is None  # no checkout at all
    code = code_version(tmp_path)
    launch = launch_record(tmp_path / "run", 0, code, [rank_code(code)], torch.device("cpu"))
    assert describe_launch(launch).startswith("code: commit unknown")


def report(commit, diff_sha256=None, host="node0", source=None):
    source = source or {"train.py": "1" * 64}
    return {"host": host, "commit": commit, "diff_sha256": diff_sha256, "source": source,
            "source_sha256": str(sorted(source.items()))}


def test_ranks_on_one_commit_without_changes_or_with_the_same_changes_may_train():
    check_same_code([report("a" * 40), report("a" * 40, host="node1")])
    check_same_code([report("a" * 40, "d" * 64), report("a" * 40, "d" * 64, host="node1")])
    check_same_code([report("a" * 40), report(None, host="node1")])  # the same files, without git on node1


def test_a_source_file_one_rank_alone_holds_is_a_difference():
    with pytest.raises(DifferentCodeOnRanks, match=r"rank 1 \(node0\) holds other source files .*: mars/muon.py"):
        check_same_code([report("a" * 40), report(None, source={"train.py": "1" * 64, "mars/muon.py": "3" * 64})])


def test_every_source_file_of_the_project_is_reported_before_it_is_imported():
    # The optimizers' modules load after the ranks compare their code: they must be in the report all the same.
    source = project_source()
    assert {"train.py", "mars/torch_backend.py", "mars/triton_backend.py", "training/provenance.py",
            "configs/optimizer/mars-adamw.yaml"} <= source.keys()
    assert not any(name.startswith(("tests/", "scripts/", ".venv/")) for name in source)


def test_ranks_importing_different_source_files_stop_naming_the_files():
    # node1 holds a copy without .git (no commit) with one file changed: only the files tell.
    ours = report("a" * 40, source={"train.py": "1" * 64, "training/schedule.py": "2" * 64})
    other = report(None, host="node1", source={"train.py": "1" * 64, "training/schedule.py": "4" * 64})
    with pytest.raises(DifferentCodeOnRanks, match=r"rank 1 \(node1\) holds other source files than rank 0 "
                                                   r"\(node0\): training/schedule.py"):
        check_same_code([ours, other])


@pytest.mark.parametrize("other", [report("b" * 40, host="node1"), report("a" * 40, "d" * 64, host="node1")])
def test_ranks_running_different_code_stop_naming_the_ranks_and_hosts(other):
    expected = r"(?s)different code.*ranks 0 \(node0\), 1 \(node0\)\n.*ranks 2 \(node1\).*same commit"
    with pytest.raises(DifferentCodeOnRanks, match=expected):
        check_same_code([report("a" * 40), report("a" * 40), other])


def test_this_repository_reports_the_commit_git_sees():
    repo = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip(f"{repo} is not a git checkout")
    assert code_version()["commit"] == head.stdout.strip()

"""A local sweep (train.py -m) survives a bad point, resumes in its own directory and says how it ended."""
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import matplotlib.pyplot as plt

from configs.compose import compose_config
from data.embedded import prepare_embedded
from reporting.run_selection import load_runs
from scripts.make_table import make_table
from scripts.plot_curves import CLIPPED_NOTE, NOT_DRAWN_NOTE, every_point_lines, group_figure
from reporting.failure_band import FAILED_BAND, FAILED_NOTE
from scripts.plot_sweep import panel_figure, sweep_lines
from training.metrics import read_metrics
from tests import warm_python
from tests.shell import shell_without_the_venv

REPO = Path(__file__).resolve().parents[2]
TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
        "train.eval_iters=2", "train.warmup_iters=0", "train.log_interval=1", "train.device=cpu"]


def sweep(sweep_dir, *overrides):
    return warm_python.run([sys.executable, "train.py", "-m", f"hydra.sweep.dir={sweep_dir}", *TINY, *overrides],
                           cwd=REPO, timeout=600)


def point(sweep_dir, index) -> Path:
    found, = Path(sweep_dir).glob(f"{index}_*")
    return found


def point_names(sweep_dir) -> list[str]:
    """The sweep's point directories (not its .submitit/ or .outcomes/)."""
    return sorted(path.name for path in Path(sweep_dir).iterdir() if path.is_dir() and path.name[0] != ".")


def failure(run_dir) -> dict | None:
    path = Path(run_dir) / "failure.json"
    return json.loads(path.read_text()) if path.exists() else None


def last_step(run_dir) -> int:
    return max((r["step"] for r in read_metrics(run_dir) if "train/loss" in r), default=0)


@pytest.mark.slow
def test_a_diverging_and_a_refused_point_are_recorded_and_every_other_point_runs(tmp_path):
    # Hydra's order: the first override varies slowest, so the refused and the diverging point come first.
    result = sweep(tmp_path, "train.max_iters=3", "train.eval_interval=3", "optimizer.lr=1e8,1e-3",
                   "optimizer.gamma=-0.1,0.025")
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("3 of 4 sweep points failed"), result.stderr
    refused, diverged, refused_too, good = (point(tmp_path, i) for i in range(4))
    for run_dir in (refused, refused_too):
        record = failure(run_dir)
        assert record["kind"] == "refused" and record["reason"] == "optimizer.gamma must be >= 0, got -0.1", record
        assert record["step"] == 0 and "optimizer.gamma=-0.1" in record["overrides"]
        assert f"failed: {run_dir}: optimizer.gamma must be >= 0" in result.stderr
    record = failure(diverged)
    assert record["kind"] == "diverged" and "non-finite training loss" in record["reason"], record
    # The step whose loss went non-finite (its update not applied), named once: the reason alone says how.
    assert record["step"] == last_step(diverged) + 1 and " step " not in record["reason"], record
    assert "optimizer.lr=100000000.0" in record["overrides"]
    assert failure(good) is None and last_step(good) == 3


@pytest.mark.slow
def test_a_sweep_whose_points_run_as_jobs_of_their_own_reports_this_launchs_failed_points(tmp_path):
    # submitit's local executor: each point runs in a process of its own, as a SLURM job would.
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    jobs = ["hydra/launcher=submitit_local", "train.max_iters=2", "train.eval_interval=2"]
    result = sweep(tmp_path, *jobs, "optimizer.gamma=0.025,-0.1")
    assert result.returncode == 1, result.stderr
    last_lines = result.stderr.strip().splitlines()[-2:]
    assert last_lines == [f"failed: {point(tmp_path, 1)}: optimizer.gamma must be >= 0, got -0.1 | rerun it alone: "
                          f"bash {point(tmp_path, 1)}/rerun.sh",
                          "1 of 2 sweep points failed (each one's failure.json says why); the others ran"]
    assert failure(point(tmp_path, 1))["kind"] == "refused" and last_step(point(tmp_path, 0)) == 2
    # The resume command is the launching one (a job runs submitit's program, not train.py), in resume.sh, which
    # each point's closing summary names.
    command = (tmp_path / "resume.sh").read_text().splitlines()[-1].split(" && exec ")[1]
    assert shlex.split(command) == [sys.executable, "train.py", "-m", *TINY, *jobs, "optimizer.gamma=0.025,-0.1",
                                    f"hydra.sweep.dir={tmp_path}", "train.resume=true"], command
    assert (f"resume (raise train.max_iters to train on): bash {tmp_path}/resume.sh"
            in (point(tmp_path, 0) / "train.log").read_text())
    # Later launches in the same directory report their own points only.
    resumed = subprocess.run(["sh", str(tmp_path / "resume.sh")], cwd=REPO, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 1 and "1 of 2 sweep points failed" in resumed.stderr, resumed.stderr
    again = sweep(tmp_path, *jobs, "optimizer.gamma=0.025", "train.resume=true")
    assert again.returncode == 0 and "failed" not in again.stderr, again.stderr


@pytest.mark.slow
def test_a_single_run_that_fails_records_why_and_a_later_launch_that_trains_clears_it(tmp_path):
    command = [sys.executable, "train.py", f"hydra.run.dir={tmp_path}", *TINY, "train.max_iters=3",
               "train.eval_interval=3"]
    result = warm_python.run([*command, "optimizer.lr=1e8"], cwd=REPO, timeout=600)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and last.startswith("error: diverged at step "), result.stderr
    # The advice ends on the exact command that resumes the run, as the closing summary gives it.
    assert last.endswith(f": cd {REPO} && {shlex.join([*command, 'optimizer.lr=1e8'][:2])} {shlex.join(TINY)} "
                         f"train.max_iters=3 train.eval_interval=3 optimizer.lr=1e8 hydra.run.dir={tmp_path} "
                         "train.resume=true"), last
    assert failure(tmp_path)["kind"] == "diverged" and failure(tmp_path)["overrides"][-1] == "optimizer.lr=1e8"
    result = warm_python.run([*command, "train.overwrite=true"], cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    assert failure(tmp_path) is None


@pytest.mark.slow
def test_a_run_ends_with_a_summary_naming_its_losses_checkpoint_and_the_commands_to_resume_and_tabulate(tmp_path):
    result = warm_python.run([sys.executable, "train.py", f"hydra.run.dir={tmp_path}", *TINY, "train.max_iters=4",
                              "train.eval_interval=2"], cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    losses = {r["step"]: r["val/loss"] for r in read_metrics(tmp_path) if "val/loss" in r}
    best_step = min(losses, key=losses.get)
    log = result.stdout  # Hydra's console log
    assert (f"run finished at step 4 of 4 (train.max_iters) | val loss best {losses[best_step]:.4f} at step "
            f"{best_step}, final {losses[4]:.4f} at step 4") in log, log
    assert f"last checkpoint: {tmp_path}/checkpoints/ckpt_00000004.pt | run dir: {tmp_path}" in log
    assert f"hydra.run.dir={tmp_path} train.resume=true" in log
    assert f"table: {sys.executable} -m scripts.make_table {tmp_path}" in log


def start_sweep_until_point_trains(sweep_dir: Path, index: int, overrides: list[str]):
    """Launch the sweep into ``sweep_dir`` in the background; (its process, the file its output goes to) once its
    point ``index`` has trained a step."""
    output = sweep_dir / "sweep.out"
    process = warm_python.start([sys.executable, "train.py", "-m", f"hydra.sweep.dir={sweep_dir}", *TINY, *overrides],
                                cwd=REPO, stdout=output)
    deadline = time.monotonic() + 300
    while not any(last_step(run_dir) >= 1 for run_dir in sweep_dir.glob(f"{index}_*")):
        assert process.poll() is None and time.monotonic() < deadline, f"the sweep's point {index} did not train"
        time.sleep(0.02)
    return process, output


def printed_commands(log: str) -> dict[str, str]:
    """The commands of a run's closing summary, by what they do: ``{"resume": ..., "table": ...}``."""
    found = dict(re.findall(r"\] - (resume|table)[^:]*: (.+)$", log, flags=re.MULTILINE))
    assert set(found) == {"resume", "table"}, log
    return found


@pytest.mark.slow
def test_every_command_a_run_prints_runs_as_printed_from_another_directory_in_a_shell_without_the_venv(tmp_path):
    # Launched from a directory of its own with a relative run directory, the printed lines run from a third one.
    launched_in, elsewhere = tmp_path / "launched_in", tmp_path / "elsewhere"
    launched_in.mkdir()
    elsewhere.mkdir()
    first = warm_python.run([sys.executable, str(REPO / "train.py"), "hydra.run.dir=run", *TINY, "train.max_iters=2",
                             "train.eval_interval=2"], cwd=launched_in, timeout=600)
    assert first.returncode == 0, first.stderr
    for name, command in printed_commands(first.stdout).items():
        ran = subprocess.run(["bash", "-c", command], cwd=elsewhere, env=shell_without_the_venv(), capture_output=True,
                             text=True, timeout=600)
        assert ran.returncode == 0, f"{name}: {command}\n{ran.stdout}{ran.stderr}"
        if name == "table":
            assert (launched_in / "val_loss_table.md").is_file(), ran.stdout + ran.stderr
            assert "Shakespeare (embedded)" in ran.stdout, ran.stdout
        else:  # the run had finished: the resume finds nothing left to train
            assert "nothing to do" in ran.stdout + ran.stderr, ran.stdout + ran.stderr


@pytest.mark.slow
def test_an_interrupted_sweep_starts_no_other_point_and_resumes_in_place_with_its_script_retraining_nothing(tmp_path):
    # Six points: one diverges (lr 1e8), one is refused (lr -1e-3); SIGINT once the second point trains.
    overrides = ["train.max_iters=6", "train.eval_interval=3", "train.checkpoint_interval=3",
                 "optimizer.lr=1e-3,2e-3,1e8,-1e-3,3e-3,4e-3"]
    process, output = start_sweep_until_point_trains(tmp_path, 1, overrides)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=300) != 0
    first = point(tmp_path, 0)
    checkpoint_time = {path: path.stat().st_mtime_ns for path in first.glob("checkpoints/*.pt")}
    first_log = (first / "metrics.jsonl").read_text()
    # The sweep stopped after the interrupted point: the next one is neither announced nor given a directory.
    log = output.read_text()
    assert last_step(first) == 6 and point_names(tmp_path) == [first.name, point(tmp_path, 1).name], log
    assert [int(index) for index in re.findall(r"\t#(\d+) : ", log)] == [0, 1], log  # Hydra's announcements
    resume = f"bash {tmp_path}/resume.sh"
    assert log.splitlines()[-1] == (f"error: the sweep stopped on SIGINT during {point(tmp_path, 1)} (its checkpoint "
                                    "holds its state); no further point starts. Finish every point (finished ones "
                                    f"are skipped) with: {resume}"), log
    assert f"] - resume: {resume}\n" in log  # the interrupted point's closing summary names the same command

    # Run as printed, from another directory, in a shell where the venv was never activated.
    result = subprocess.run(["bash", "-c", resume], cwd=tmp_path.parent, env=shell_without_the_venv(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "2 of 6 sweep points failed" in result.stderr, result.stderr
    assert {path: path.stat().st_mtime_ns for path in first.glob("checkpoints/*.pt")} == checkpoint_time
    assert (first / "metrics.jsonl").read_text() == first_log  # finished: not retrained
    assert sorted(run_dir.name.split("_")[0] for run_dir in tmp_path.glob("*_*")) == [str(i) for i in range(6)]
    for index in (0, 1, 4, 5):
        assert failure(point(tmp_path, index)) is None and last_step(point(tmp_path, index)) == 6
    assert failure(point(tmp_path, 2))["kind"] == "diverged" and failure(point(tmp_path, 3))["kind"] == "refused"
    second = read_metrics(point(tmp_path, 1))
    assert [r["step"] for r in second if "train/loss" in r] == list(range(1, 7))  # resumed: each step once

    # The table and the figures show every point, the failed ones with their reason.
    table = script("make_table", tmp_path, "--out", tmp_path / "table.md")
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| Shakespeare (embedded) | 1x32 |")]
    assert sorted(float(row[4]) for row in rows) == [-1e-3, 1e-3, 2e-3, 3e-3, 4e-3, 1e8], table
    assert [row[4] for row in rows if "failed (diverged)" in " | ".join(row)] == ["1e+08"], table
    assert [row[4] for row in rows if "failed (refused)" in " | ".join(row)] == ["-0.001"], table
    curves = script("plot_curves", tmp_path, "--every-point", "--out", tmp_path / "curves").split()
    sweeps = script("plot_sweep", tmp_path, "--out", tmp_path / "sweeps").split()
    assert [Path(path).name for path in curves] == [f"val_loss_vs_{axis}_embedded_1x32_every_point.png"
                                                    for axis in ("tokens", "time")]
    assert [Path(path).name for path in sweeps] == ["lr_sweep_embedded_1x32_384.png"], sweeps
    assert all(Path(path).stat().st_size > 0 for path in curves + sweeps)


def val_losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["val/loss"] for r in read_metrics(run_dir) if "val/loss" in r}


def setting_rows(table: str) -> dict[tuple[str, str], list[str]]:
    """The table of every setting's rows of the tiny model, by (lr, gamma)."""
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| Shakespeare (embedded) | 1x32 |")]
    return {(row[4], row[5]): row for row in rows}


@pytest.mark.slow
def test_a_sweep_with_a_finite_blow_up_and_a_refused_gamma_gives_a_table_and_figures_that_tell_the_truth(tmp_path):
    # lr 10 blows up without a NaN (the val loss from 10.8 to over 100); gamma -0.1 is refused at every lr.
    result = sweep(tmp_path, "train.max_iters=4", "train.eval_interval=2", "optimizer.gamma=0.025,-0.1",
                   "optimizer.lr=10,1e-3,3e-3")
    assert result.returncode == 1 and "4 of 6 sweep points failed" in result.stderr, result.stderr
    blown, healthy = point(tmp_path, 0), [point(tmp_path, 1), point(tmp_path, 2)]
    initial = val_losses(blown)[0]
    assert val_losses(blown)[2] > initial and 4 not in val_losses(blown)  # stopped at the evaluation of step 2
    record = failure(blown)
    assert record["kind"] == "diverged" and record["step"] == 2, record
    assert record["reason"] == (f"val loss {val_losses(blown)[2]:.4g}, above 1.1 x the step-0 val loss "
                                f"{initial:.4g} (train.diverged_val_loss_ratio)")
    # The sweep's advice names this one point's rerun.sh, once: a script in its directory that reruns it alone.
    [told] = [line for line in result.stderr.splitlines() if line.startswith(f"failed: {blown}: ")]
    assert told.startswith(f"failed: {blown}: diverged at step 2: {record['reason']}; last good checkpoint: "), told
    assert "lower optimizer.lr or raise train.warmup_iters in its rerun.sh" in told
    rerun = told.split(" | rerun it alone: ")[1]
    assert rerun == f"bash {blown}/rerun.sh" and (result.stdout + result.stderr).count(rerun) == 1, result.stdout
    script = (blown / "rerun.sh").read_text()
    words = shlex.split(script.split(" && exec ")[1].replace("\\\n", ""))  # as sh reads its continued lines
    assert "-m" not in words and "optimizer.lr=10" in words and "optimizer.gamma=0.025" in words, script
    assert words[-2:] == [f"hydra.run.dir='{blown}'", "train.resume=true"]
    assert "  optimizer.lr=10 \\\n" in script  # one setting a line: changed by editing that line

    runs = load_runs([str(tmp_path)])
    rows = setting_rows(make_table(runs))
    assert rows[("10", "0.025")][8:10] == ["failed (diverged)", f"{val_losses(blown)[2]:.3f}"]
    assert f"(diverged at step 2: {record['reason']})" in rows[("10", "0.025")][13]
    for lr, run_dir in zip(("0.001", "0.003"), healthy):
        trained = [loss for step, loss in val_losses(run_dir).items() if step > 0]
        assert rows[(lr, "0.025")][8:10] == [f"{min(trained):.3f}", f"{trained[-1]:.3f}"]  # best, final; not step 0
    assert [row[8] for key, row in rows.items() if key[1] == "-0.1"] == ["failed (refused)"] * 3

    [lr_lines] = sweep_lines(runs, "lr").values()
    figure = panel_figure(lr_lines, "lr", "lr")
    axes = figure.axes[0]
    assert [line.get_xdata().tolist() for line in axes.containers[0].lines[:1]] == [[1e-3, 3e-3]]
    assert len(axes.containers) == 1  # the gamma -0.1 line, every point refused, has no curve nor legend entry
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend == ["MARS-approx, gamma 0.025", "MARS-approx, gamma 0.025, lr 10: diverged at step 2"]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    assert axes.get_legend().get_window_extent(renderer).width <= axes.get_window_extent(renderer).width
    # The blow-up on the top edge, above every healthy point: the lowest marker is the best healthy point.
    [blow_up] = [line for line in axes.lines if line.get_marker() == "^"]
    assert (blow_up.get_xdata().tolist(), blow_up.get_ydata().tolist()) == ([10.0], [FAILED_BAND])
    assert blow_up.get_transform() == axes.get_xaxis_transform()
    healthy_means = axes.containers[0].lines[0].get_ydata()
    assert axes.get_ylim()[0] <= min(healthy_means) < max(healthy_means) <= axes.get_ylim()[1]
    [note] = [text for text in axes.texts if text.get_text() != FAILED_NOTE]
    assert note.get_text().replace("\n  ", " ").splitlines()[1:] == [  # one entry each, wrapped to the axes
        f"MARS-approx, gamma -0.1, lr {lr}: optimizer.gamma must be >= 0, got -0.1" for lr in ("0.001", "0.003", "10")]
    plt.close(figure)
    figure = panel_figure(next(iter(sweep_lines(runs, "gamma").values())), "gamma", "gamma")
    assert figure.axes[0].get_xlim()[0] > -0.05  # the refused gamma -0.1 does not stretch the axis
    plt.close(figure)

    [curves] = every_point_lines(runs).values()
    figure = group_figure(curves, "tokens", "every point")
    axes = figure.axes[0]
    assert axes.get_ylim()[1] < initial + 0.1  # the healthy runs' range, from step 0 down
    [triangles] = [line for line in axes.lines if line.get_marker() == "^"]
    assert triangles.get_xdata().size == 1 and [text.get_text() for text in axes.texts] == ["\n".join(
        [f"{CLIPPED_NOTE} (up to {val_losses(blown)[2]:.4g})", NOT_DRAWN_NOTE,
         *(f"MARS-approx, gamma=-0.1, lr={lr} (refused; no evaluation)" for lr in ("0.001", "0.003", "10.0"))]),
        FAILED_NOTE]
    assert len(axes.get_legend().get_texts()) == 3  # the refused points, which draw nothing, have no entry
    plt.close(figure)

    # Followed with a lower lr, run as printed from a shell without the venv, the script trains the point in its
    # directory, and it fails no more.
    (blown / "rerun.sh").write_text(script.replace("  optimizer.lr=10 \\\n", "  optimizer.lr=1e-3 \\\n"))
    rerun_result = subprocess.run(rerun, shell=True, cwd=tmp_path, env=shell_without_the_venv(), capture_output=True,
                                  text=True, timeout=600)
    assert rerun_result.returncode == 0, rerun_result.stderr
    assert failure(blown) is None and last_step(blown) == 4 and not (blown / "rerun.sh").exists()


@pytest.mark.slow
def test_a_sweep_whose_every_point_diverged_has_no_best_and_no_figure_but_a_line_saying_so(tmp_path):
    result = sweep(tmp_path, "train.max_iters=4", "train.eval_interval=2", "optimizer.lr=10,20")
    assert result.returncode == 1 and "2 of 2 sweep points failed" in result.stderr, result.stderr
    rows = setting_rows(make_table(load_runs([str(tmp_path)])))
    assert [row[8] for row in rows.values()] == ["failed (diverged)"] * 2
    plotted = warm_python.run([sys.executable, "-m", "scripts.plot_sweep", str(tmp_path), "--out", tmp_path / "sweeps"],
                              cwd=REPO, timeout=300)
    assert plotted.returncode == 1 and plotted.stderr.strip().splitlines()[-1] == (
        "error: every point of the lr sweep of 1x32, Shakespeare (embedded), 256 tokens failed: nothing to plot "
        "(scripts.make_table gives each one's reason)"), plotted.stderr
    assert not (tmp_path / "sweeps").exists()


@pytest.mark.slow
def test_a_run_that_trains_on_past_its_blow_up_is_marked_diverged_at_its_end_and_step_0_is_not_its_best(tmp_path):
    result = warm_python.run([sys.executable, "train.py", f"hydra.run.dir={tmp_path}", *TINY, "train.max_iters=4",
                              "train.eval_interval=2", "optimizer.lr=10", "train.stop_on_diverged_val_loss=false"],
                             cwd=REPO, timeout=600)
    losses = val_losses(tmp_path)
    assert result.returncode == 1 and sorted(losses) == [0, 2, 4], result.stderr  # trained to its end
    best_step = min((step for step in losses if step > 0), key=losses.get)
    assert f"val loss best {losses[best_step]:.4f} at step {best_step}, final {losses[4]:.4f}" in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("error: diverged at step 2: val loss ")
    assert failure(tmp_path)["kind"] == "diverged" and failure(tmp_path)["step"] == 2


def script(name, *args) -> str:
    """The standard output of ``python -m scripts.<name> args...``, which must succeed."""
    result = warm_python.run([sys.executable, "-m", f"scripts.{name}", *map(str, args)], cwd=REPO,
                             timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.slow
def test_finished_points_keep_the_last_or_no_checkpoint_as_asked_and_a_resume_of_the_sweep_retrains_nothing(tmp_path):
    overrides = ["train.max_iters=4", "train.eval_interval=2", "train.checkpoint_interval=2",
                 "train.finished_checkpoints=last,none"]
    assert sweep(tmp_path, *overrides).returncode == 0
    last, none = point(tmp_path, 0), point(tmp_path, 1)
    assert [path.name for path in (last / "checkpoints").iterdir()] == ["ckpt_00000004.pt"]
    assert [path.name for path in (none / "checkpoints").iterdir()] == ["deleted_at_finish.json"]
    logs = {run_dir: (run_dir / "metrics.jsonl").read_text() for run_dir in (last, none)}
    result = sweep(tmp_path, *overrides, "train.resume=true")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("already at train.max_iters=4: nothing to do") == 2, result.stdout
    assert {run_dir: (run_dir / "metrics.jsonl").read_text() for run_dir in (last, none)} == logs


@pytest.mark.slow
def test_a_resume_that_raises_max_iters_continues_every_point_in_its_directory(tmp_path):
    # Train the sweep on: the points' names leave out how long and how often they log, so the same directories.
    first = sweep(tmp_path, "train.max_iters=2", "train.eval_interval=2", "optimizer.lr=1e-3,2e-3")
    assert first.returncode == 0, first.stderr
    points = point_names(tmp_path)
    longer = sweep(tmp_path, "train.max_iters=4", "train.eval_interval=1", "optimizer.lr=1e-3,2e-3",
                   "train.resume=true")
    assert longer.returncode == 0, longer.stderr
    assert point_names(tmp_path) == points
    for index in (0, 1):
        records = read_metrics(point(tmp_path, index))
        assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3, 4]  # steps 1-2 once, then 3-4
        assert [r["changed"] for r in records if "changed" in r] == [
            {"train.eval_interval": [2, 1], "train.max_iters": [2, 4]}]


@pytest.mark.slow
def test_a_point_an_earlier_launch_named_otherwise_is_named_with_how_to_move_it_not_trained_again(tmp_path):
    first = sweep(tmp_path, "train.max_iters=2", "train.eval_interval=2", "optimizer.lr=1e-3,2e-3")
    assert first.returncode == 0, first.stderr
    kept = point(tmp_path, 0)
    old_name = kept.rename(tmp_path / f"{kept.name},train.max_iters=2")  # as versions that named max_iters did
    longer = ["train.max_iters=4", "train.eval_interval=2", "optimizer.lr=1e-3,2e-3", "train.resume=true"]
    result = sweep(tmp_path, *longer)
    assert result.returncode == 1 and "1 of 2 sweep points failed" in result.stderr, result.stderr
    reason = failure(kept)["reason"]
    assert reason.startswith(f"{old_name} holds this sweep point") and "would train again from step 0" in reason
    assert last_step(old_name) == 2 and last_step(point(tmp_path, 1)) == 4  # nothing trained twice
    move = reason.split("Move the point into place (")[1].split(")")[0]
    assert subprocess.run(move, shell=True).returncode == 0
    again = sweep(tmp_path, *longer)
    assert again.returncode == 0, again.stderr
    assert [r["step"] for r in read_metrics(kept) if "train/loss" in r] == [1, 2, 3, 4]


@pytest.mark.slow
def test_resuming_a_finished_run_needs_neither_its_checkpoint_loaded_nor_its_data(tmp_path):
    shards = tmp_path / "shards"
    shutil.copytree(prepare_embedded(), shards)
    command = [sys.executable, "train.py", f"hydra.run.dir={tmp_path / 'run'}", *TINY, "data=custom",
               f"data.dir={shards}", "train.max_iters=2", "train.eval_interval=2"]
    assert warm_python.run(command, cwd=REPO, timeout=600).returncode == 0
    shutil.rmtree(shards)  # a finished sweep point whose data moved away since
    result = warm_python.run([*command, "train.resume=true"], cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "already at train.max_iters=2: nothing to do (raise train.max_iters to train on)" in result.stdout


@pytest.mark.slow
def test_a_point_whose_overrides_make_a_name_too_long_for_the_file_system_runs_and_resumes_in_its_directory(
        tmp_path):
    # Hydra names a point by its overrides; past 255 bytes the file system refuses the name (ENAMETOOLONG).
    many = ["train.seed=7", "train.grad_clip=0.5", "train.decay_iters=100", "train.warmup_iters=1",
            "train.min_lr=0", "optimizer.weight_decay=0.01", "optimizer.gamma=0.02"]
    result = sweep(tmp_path, "train.max_iters=1", "train.eval_interval=1", *many, "optimizer.lr=2e-3,1e-3")
    assert result.returncode == 0, result.stderr
    long_point, short_point = point(tmp_path, 0), point(tmp_path, 1)
    assert len(long_point.name) <= 200 and long_point.name.startswith("0_")
    assert last_step(long_point) == 1 and last_step(short_point) == 1
    again = subprocess.run(["sh", str(tmp_path / "resume.sh")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert point_names(tmp_path) == sorted([long_point.name, short_point.name])  # the resume found the same two


@pytest.mark.parametrize("path", ["/runs/plain-dir_1.5", "/sweep/3_optimizer.gamma=0.025,optimizer.lr=0.001",
                                  "/odd/it's [here] {x} \\back", "/odd\\'s\\"])
def test_a_directory_in_a_resume_line_reads_back_as_itself_through_hydras_override_grammar(path):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from training.sweep import hydra_value
    [override] = OverridesParser.create().parse_overrides([f"hydra.run.dir={hydra_value(path)}"])
    assert override.value() == path


def files(run_dir: Path) -> dict[str, bytes]:
    return {path.relative_to(run_dir).as_posix(): path.read_bytes() for path in sorted(run_dir.rglob("*"))
            if path.is_file()}


def steps_trained(run_dir) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir) if "train/loss" in r]


@pytest.mark.slow
def test_a_sweep_resumed_while_its_first_launch_is_suspended_skips_what_that_launch_holds_and_fails_no_point(
        tmp_path):
    # As SLURM suspends a job: the first launch stopped (SIGSTOP) while it trains point 0, resume.sh run meanwhile.
    overrides = ["train.max_iters=4", "train.eval_interval=2", "optimizer.lr=1e-3,2e-3"]
    first, output = start_sweep_until_point_trains(tmp_path, 0, overrides)
    first.send_signal(signal.SIGSTOP)
    try:
        second = subprocess.run(["bash", str(tmp_path / "resume.sh")], cwd=REPO, capture_output=True, text=True,
                                timeout=600)
    finally:
        first.send_signal(signal.SIGCONT)
    held, started = point(tmp_path, 0), point(tmp_path, 1)
    assert second.returncode == 0 and "failed" not in second.stderr, second.stderr
    assert f"skipped {held}: another launch is training it (host " in second.stdout, second.stdout
    # A point the resume starts for the first time is started, not warned about.
    assert f"starting {started} from step 0: no checkpoint of this point yet" in second.stdout, second.stdout
    assert "has no checkpoint yet" not in second.stdout + second.stderr
    resumed_files = files(started)
    assert first.wait(timeout=600) == 0
    first_output = output.read_text()
    assert f"skipped {started}: it finished already, at step 4" in first_output, first_output
    assert "failed" not in first_output and files(started) == resumed_files  # the finished point left as it was
    for run_dir in (held, started):
        assert failure(run_dir) is None and steps_trained(run_dir) == [1, 2, 3, 4]
    rows = setting_rows(make_table(load_runs([str(tmp_path)])))
    assert len(rows) == 2 and not any("failed" in " ".join(row) for row in rows.values()), rows


@pytest.mark.slow
def test_a_sweep_launched_twice_at_once_into_one_directory_trains_each_point_once_and_fails_none(tmp_path):
    # A job submitted twice: whichever launch reaches a point second finds it held, or finished, and skips it.
    command = [sys.executable, "train.py", "-m", f"hydra.sweep.dir={tmp_path}", *TINY, "train.max_iters=4",
               "train.eval_interval=2", "optimizer.lr=1e-3,2e-3,3e-3"]
    launches = [warm_python.start(command, cwd=REPO, stdout=tmp_path / f"{i}.out", stderr=tmp_path / f"{i}.err")
                for i in range(2)]
    returncodes = [launch.wait(timeout=600) for launch in launches]
    outputs = [((tmp_path / f"{i}.out").read_text(), (tmp_path / f"{i}.err").read_text()) for i in range(2)]
    assert returncodes == [0, 0], outputs
    skipped = [line for stdout, _ in outputs for line in stdout.splitlines() if "skipped " in line]
    assert len(skipped) == 3, outputs  # each point trained by one launch, skipped by the other
    for index in range(3):
        assert failure(point(tmp_path, index)) is None and steps_trained(point(tmp_path, index)) == [1, 2, 3, 4]


def lr_1d_ratios(sweep_dir) -> dict[str, float]:
    """Each point's last checkpoint's ratio of its 1-D rate to its lr, by the point's lr as the table writes it."""
    ratios = {}
    for run_dir in Path(sweep_dir).glob("*_*"):
        checkpoint = torch.load(sorted(run_dir.glob("checkpoints/ckpt_*.pt"))[-1], weights_only=False)
        lr = OmegaConf.load(run_dir / ".hydra" / "config.yaml").optimizer.lr
        ratios[f"{lr:g}"] = checkpoint["optimizer"]["param_groups"][0]["lr_1d_ratio"]
    return ratios


@pytest.mark.slow
def test_a_sweep_of_lr_says_which_rates_each_point_ran_and_moves_lr_1d_in_step_where_asked(tmp_path):
    # MARS's lr_1d stays at its configured value across a sweep of lr, and the table says so; moved in step with lr
    # by ${lr_times:R} (docs/sweeps.md), each point runs and shows its own.
    kept, moved = tmp_path / "kept", tmp_path / "moved"
    lrs = ["train.max_iters=1", "train.eval_interval=1", "optimizer.lr=1e-3,2e-3"]
    assert sweep(kept, *lrs).returncode == 0
    assert sweep(moved, *lrs, "optimizer.lr_1d=${lr_times:0.5}").returncode == 0
    lr_1d = compose_config([]).optimizer.lr_1d  # the default run's, MARS-AdamW's
    expected = [(kept, {"0.001": f"lr_1d {lr_1d:g}", "0.002": f"lr_1d {lr_1d:g}"},
                 {"0.001": lr_1d / 1e-3, "0.002": lr_1d / 2e-3}),
                (moved, {"0.001": "lr_1d 0.0005", "0.002": "lr_1d 0.001"}, {"0.001": 0.5, "0.002": 0.5})]
    for sweep_dir, other_lrs, ratios in expected:
        table = script("make_table", sweep_dir, "--out", sweep_dir / "table.md")
        assert {lr: row[6] for (lr, _), row in setting_rows(table).items()} == other_lrs, table
        assert lr_1d_ratios(sweep_dir) == pytest.approx(ratios)
    assert "a sweep of lr leaves them where they are unless it moves them too" in table

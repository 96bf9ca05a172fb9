"""Faults of the data, the device, the logging and the run directory stop train.py with one line that names the
cause and the fix: no traceback, a non-zero exit status, nothing saved lost. Each test provokes the real fault."""
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from data.embedded import prepare_embedded
from data.shards import read_shard, write_shard
from tests import warm_python
from tests.configs.hydra_refusals import HYDRA_CASES, users_config

REPO = Path(__file__).resolve().parents[1]
SMALL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=16",
         "train.eval_iters=1", "train.warmup_iters=1", "train.max_iters=2", "train.device=cpu"]
# Root reads and writes whatever the permissions say (CI runs as root): these capabilities make it so.
ROOT_FILE_ACCESS = "dac_override,dac_read_search"


def without_root_file_access() -> list[str]:
    """A command prefix that runs its command with the permissions of files enforced, even for root."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without util-linux's setpriv: cannot drop root's file access")
    drop = f"-{ROOT_FILE_ACCESS.replace(',', ',-')}"
    return ["setpriv", f"--inh-caps={drop}", f"--bounding-set={drop}"]


def train(run_dir, *overrides, prefix=(), env=None, cwd=REPO):
    return warm_python.run([*prefix, sys.executable, str(REPO / "train.py"), f"hydra.run.dir={run_dir}", *SMALL,
                            *overrides], cwd=cwd, timeout=300, env=environment(env or {}))


def environment(changes: dict) -> dict:
    """This process's environment with ``changes`` (None: the variable removed) and the repository importable."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **changes}
    return {key: value for key, value in env.items() if value is not None}


def assert_one_line(result, *phrases) -> str:
    """The run failed, printed no traceback, and its last line of stderr is the error naming ``phrases``."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: "), output
    for phrase in phrases:
        assert phrase in last, last
    return last


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A copy of the embedded corpus (train.bin, val.bin, manifest.json) to damage."""
    copy = tmp_path / "corpus"
    shutil.copytree(prepare_embedded(), copy)
    return copy


def edit_manifest(directory: Path, edit) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    edit(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
@pytest.mark.parametrize("edit, phrases", [
    (lambda m: m["shards"][0].pop("split"), ["shards[0] has no 'split'", "prepare the corpus again"]),
    (lambda m: m.update(vocab_size="50257"), ["vocab_size is '50257', not an integer", "prepare the corpus again"]),
], ids=["shard-without-split", "vocab-size-string"])
def test_a_manifest_with_a_missing_or_mistyped_field_is_refused_by_name(tmp_path, corpus, edit, phrases):
    edit_manifest(corpus, edit)
    assert_one_line(train(tmp_path / "run", f"data.dir={corpus}"), str(corpus / "manifest.json"), *phrases)


@pytest.mark.slow
@pytest.mark.parametrize("content", [b"", b"\xff\xfe not json"], ids=["empty", "undecodable"])
def test_an_empty_or_undecodable_manifest_is_refused(tmp_path, corpus, content):
    (corpus / "manifest.json").write_bytes(content)
    assert_one_line(train(tmp_path / "run", f"data.dir={corpus}"), "manifest.json", "prepare the corpus again")


@pytest.mark.slow
def test_a_shard_path_that_is_a_directory_is_named_as_one(tmp_path, corpus):
    (corpus / "val.bin").unlink()
    (corpus / "val.bin").mkdir()
    assert_one_line(train(tmp_path / "run", f"data.dir={corpus}"), f"{corpus / 'val.bin'} is a directory")


@pytest.mark.slow
def test_a_data_dir_that_is_a_file_is_named_as_one(tmp_path, corpus):
    assert_one_line(train(tmp_path / "run", f"data.dir={corpus / 'val.bin'}"), "is a file, not a directory")


@pytest.mark.slow
def test_a_data_dir_without_shards_names_the_command_that_makes_them(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    last = assert_one_line(train(tmp_path / "run", "data=custom", f"data.dir={empty}"), f"{empty} has no train shards",
                           f"`{sys.executable} -m data.prepare files YOUR_FILES... --out {empty}`")
    assert "README" not in last


@pytest.mark.slow
@pytest.mark.parametrize("unreadable", ["val.bin", "manifest.json", "."], ids=["shard", "manifest", "directory"])
def test_unreadable_data_is_refused_naming_the_file(tmp_path, corpus, unreadable):
    target = corpus / unreadable
    target.chmod(0)
    prefix = without_root_file_access()
    probe = subprocess.run([*prefix, "cat", str(target / "manifest.json" if target.is_dir() else target)],
                           capture_output=True)
    assert probe.returncode != 0, "the test's process can still read the file: the fault would not happen"
    last = assert_one_line(train(tmp_path / "run", f"data.dir={corpus}", prefix=prefix), "cannot read",
                           "Permission denied", "make it readable")
    assert str(corpus) in last


@pytest.fixture
def corpus_of_many_shards(tmp_path, corpus) -> Path:
    """The embedded corpus cut into 48 train shards and 4 val shards (no manifest)."""
    many = tmp_path / "many"
    many.mkdir()
    for split, count in (("train", 48), ("val", 4)):
        for k, piece in enumerate(np.array_split(np.array(read_shard(corpus / f"{split}.bin")), count)):
            write_shard(many / f"{split}_{k:06d}.bin", piece)
    return many


def limit_open_files(limit: int):
    """A preexec_fn: the process may hold ``limit`` open files (``ulimit -n``)."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


@pytest.mark.slow
def test_a_corpus_of_more_shards_than_the_open_file_limit_trains(tmp_path, corpus_of_many_shards):
    result = subprocess.run([sys.executable, str(REPO / "train.py"), f"hydra.run.dir={tmp_path / 'run'}", *SMALL,
                             f"data.dir={corpus_of_many_shards}", "train.eval_iters=4"], cwd=REPO,
                            capture_output=True, text=True, timeout=300, env=environment({}),
                            preexec_fn=limit_open_files(32))
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert next(r["data"] for r in records if "data" in r)["train"]["shards"] == 48


OPEN_FILES_UNTIL_THE_LIMIT = """
import os, sys
from pathlib import Path
from data.loader import load_split
held = []
try:
    while True:
        held.append(open(os.devnull))
except OSError:
    pass
held.pop().close()  # one descriptor left: enough to list the directory, not to keep a shard open beside it
load_split(Path(sys.argv[1]), "train", 50257)
"""


@pytest.mark.slow
def test_a_shard_that_the_open_file_limit_keeps_closed_says_to_raise_the_limit(tmp_path, corpus_of_many_shards):
    result = subprocess.run([sys.executable, "-c", OPEN_FILES_UNTIL_THE_LIMIT, str(corpus_of_many_shards)],
                            cwd=REPO, capture_output=True, text=True, timeout=300, env=environment({}),
                            preexec_fn=limit_open_files(64))
    last = result.stderr.strip().splitlines()[-1]
    assert "cannot open" in last and "train_" in last, result.stderr
    assert "as many files open as its limit allows (ulimit -n: 64): raise it, e.g. `ulimit -n " in last, last
    assert "make it readable" not in last


def out_of_date_manifest(corpus: Path, vocab_size: int) -> None:
    """Shards whose manifest promises ids below ``vocab_size`` while every fifth token is above it."""
    for name in ("train.bin", "val.bin"):
        tokens = np.array(read_shard(corpus / name)) % vocab_size
        tokens[::5] = vocab_size + 500
        write_shard(corpus / name, tokens)
    edit_manifest(corpus, lambda m: (m.update(vocab_size=vocab_size, max_token_id=vocab_size - 1),
                                     [shard.update(max_token_id=vocab_size - 1) for shard in m["shards"]]))


@pytest.mark.slow
def test_token_ids_beyond_the_vocabulary_behind_an_out_of_date_manifest_stop_the_run_by_name(tmp_path, corpus):
    out_of_date_manifest(corpus, 1000)
    assert_one_line(train(tmp_path / "run", f"data.dir={corpus}", "model.vocab_size=1024"),
                    "holds token id 1500", "model.vocab_size is 1024", "prepare the corpus")


@pytest.mark.slow
@pytest.mark.parametrize("override", ["optimizer.lr=inf", "optimizer.gamma=nan", "optimizer.betas=[0.9,inf]"])
def test_non_finite_hyperparameters_are_refused_at_start(tmp_path, override):
    result = train(tmp_path / "run", override)
    assert_one_line(result, f"{override.split('=')[0]}=", "is not a finite number")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before any step


def users_optimizer_config(config_dir: Path, text: str) -> Path:
    """A user's own ``optimizer/mine.yaml`` under ``config_dir``, holding ``text``; its path."""
    (config_dir / "optimizer").mkdir(parents=True)
    mine = config_dir / "optimizer" / "mine.yaml"
    mine.write_text(text)
    return mine


@pytest.mark.slow
@pytest.mark.parametrize("where", ["--config-dir", "hydra.searchpath"])
def test_a_yaml_syntax_error_in_the_users_own_config_is_named_by_file_line_and_column(tmp_path, where):
    config_dir = tmp_path / "my-configs"
    # The list of betas is not closed.
    mine = users_optimizer_config(config_dir, "defaults:\n  - adamw\n  - _self_\nbetas: [0.9, 0.95\nlr: 0.001\n")
    # Hydra takes its options before the overrides
    added = [f"hydra.searchpath=[file://{config_dir}]"] if where == "hydra.searchpath" else [where, str(config_dir)]
    result = warm_python.run([sys.executable, str(REPO / "train.py"), *added, f"hydra.run.dir={tmp_path / 'run'}",
                              *SMALL, "optimizer=mine"], cwd=REPO, timeout=300, env=environment({}))
    assert_one_line(result, f"{mine} is not valid YAML", "line 5, column 3", "expected ',' or ']'",
                    "line 4, column 8", "fix the syntax")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["command line", "own config file"])
def test_an_unknown_key_is_one_line_with_the_nearest_key_not_hydras_advice_to_append_it(tmp_path, where):
    config_dir = tmp_path / "my-configs"
    mine = users_optimizer_config(config_dir, "defaults:\n  - mars-adamw\n  - _self_\ngama: 0.05\n")
    arguments = ["optimizer.gammma=0.1"] if where == "command line" else ["--config-dir", str(config_dir),
                                                                           "optimizer=mine"]
    result = warm_python.run([sys.executable, str(REPO / "train.py"), *arguments, f"hydra.run.dir={tmp_path / 'run'}",
                              *SMALL], cwd=REPO, timeout=300, env=environment({}))
    key, at = ("optimizer.gammma", "") if where == "command line" else ("optimizer.gama", f" in {mine}")
    last = assert_one_line(result, f"unknown config key {key}{at}: did you mean optimizer.gamma?")
    assert result.stderr.strip() == last and "To append" not in result.stdout + result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("device", ["foo", "mps"])
def test_a_device_the_trainer_cannot_run_on_is_refused(tmp_path, device):
    assert_one_line(train(tmp_path / "run", f"train.device={device}"), f"train.device={device}", "cpu")


@pytest.mark.slow
def test_wandb_online_without_credentials_says_how_to_log_in_or_run_without(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "WANDB_CONFIG_DIR": str(home / "wandb"), "NETRC": str(home / "netrc"),
           "WANDB_API_KEY": None, "WANDB_MODE": None}
    result = train(tmp_path / "run", "wandb.mode=online", env=env)
    assert_one_line(result, "wandb.mode=online", "No API key", "wandb login", "wandb.mode=offline")


@pytest.mark.slow
def test_a_stray_wandb_variable_left_in_the_shell_is_named(tmp_path):
    result = train(tmp_path / "run", "wandb.mode=offline", env={"WANDB_MODE": "bogus"})
    assert_one_line(result, "wandb.mode=offline could not start a wandb run", "mode")


@pytest.mark.slow
def test_a_run_directory_in_a_read_only_directory_is_refused_before_logging_starts(tmp_path):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    result = train(read_only / "run", prefix=without_root_file_access())
    assert_one_line(result, f"cannot write the run directory {read_only / 'run'}", "Permission denied",
                    "hydra.run.dir")


@pytest.mark.slow
def test_a_read_only_run_directory_refuses_the_resume_and_keeps_the_run(tmp_path):
    run_dir = tmp_path / "run"
    first = train(run_dir)
    assert first.returncode == 0, first.stderr
    saved = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    for path in [run_dir, *run_dir.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    result = train(run_dir, "train.resume=true", "train.max_iters=4", prefix=without_root_file_access())
    assert_one_line(result, "cannot write the run directory", "Permission denied")
    assert {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()} == saved


@pytest.mark.slow
def test_a_default_run_directory_under_a_read_only_working_directory_is_refused(tmp_path):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    result = subprocess.run([*without_root_file_access(), sys.executable, str(REPO / "train.py"), *SMALL],
                            cwd=read_only, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert_one_line(result, f"cannot write the run directory {read_only / 'outputs'}", "hydra.run.dir")


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_with_one_line_and_keeps_the_checkpoints(tmp_path):
    run_dir = tmp_path / "run"
    process = warm_python.start([sys.executable, str(REPO / "train.py"), f"hydra.run.dir={run_dir}", *SMALL,
                                 "train.max_iters=100000", "train.checkpoint_interval=2", "train.log_interval=1",
                                 # steps long enough for the second signal to arrive during one
                                 "model.n_layer=4", "model.n_embd=256", "train.batch_size=8", "train.block_size=64"],
                                cwd=REPO, env=environment({}), stdout=tmp_path / "out", stderr=tmp_path / "err")
    deadline = time.monotonic() + 300
    while not list((run_dir / "checkpoints").glob("ckpt_*.pt")):
        assert process.poll() is None and time.monotonic() < deadline, "the run wrote no checkpoint"
        time.sleep(0.05)
    saved = {path: path.read_bytes() for path in (run_dir / "checkpoints").glob("ckpt_*.pt")}
    process.send_signal(signal.SIGINT)
    # Two separate signals: Python runs a handler between bytecodes, so two signals sent during one long torch
    # call would be handled once. The second goes once the first is handled (its warning is in the job's log).
    while "received SIGINT" not in (run_dir / "train.log").read_text():
        assert process.poll() is None and time.monotonic() < deadline, "the first Ctrl-C was not handled"
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    process.wait(timeout=300)
    result = subprocess.CompletedProcess(process.args, process.returncode, (tmp_path / "out").read_text(),
                                         (tmp_path / "err").read_text())
    assert_one_line(result, "second Ctrl-C", "train.resume=true")
    for path, content in saved.items():  # the first signal may add a checkpoint; none is lost or torn
        assert path.read_bytes() == content
    assert not list((run_dir / "checkpoints").glob("*.tmp"))


@pytest.mark.slow
def test_launcher_variables_left_in_the_shell_are_named_with_how_to_clear_them(tmp_path):
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": None, "MASTER_ADDR": None, "MASTER_PORT": None}
    assert_one_line(train(tmp_path / "run", env=env), "RANK=0 WORLD_SIZE=2",
                    "LOCAL_RANK, MASTER_ADDR, MASTER_PORT unset", "unset RANK WORLD_SIZE")


@pytest.mark.slow
@pytest.mark.parametrize("rank", ["0", "1"])
def test_a_full_set_of_launcher_variables_left_in_the_shell_ends_the_wait_with_one_line(tmp_path, rank):
    # Every variable torchrun sets, yet no other rank comes: after train.distributed_timeout_s, one line.
    env = {"RANK": rank, "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(warm_python.free_port()), "TORCHELASTIC_RUN_ID": None}
    last = assert_one_line(train(tmp_path / "run", "train.distributed_timeout_s=3", env=env),
                           f"rank {rank} of WORLD_SIZE=2 could not join the process group", "within 3s",
                           "unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT")
    assert f"127.0.0.1:{env['MASTER_PORT']}" in last


@pytest.mark.slow
@pytest.mark.parametrize("split", ["train", "val"])
def test_a_token_id_beyond_the_vocabulary_in_one_ranks_batch_stops_every_rank_of_an_srun_launch(tmp_path, corpus,
                                                                                                 split):
    # srun starting each rank itself (no torchrun agent to end the others): with sequential windows of 16 tokens,
    # rank 0's first batch is tokens 0-32, rank 1's 32-64; only rank 1 would meet the id at token 40, in its
    # first training step or in the evaluation at step 0.
    tokens = np.array(read_shard(corpus / f"{split}.bin"))
    tokens[40] = 60_000  # beyond model.vocab_size (50304); the manifest says otherwise
    write_shard(corpus / f"{split}.bin", tokens)
    edit_manifest(corpus, lambda m: [shard.update(max_token_id=50_000) for shard in m["shards"]])
    timeout_s = 300
    started = time.monotonic()
    overrides = [f"data.dir={corpus}", "data.sampling=sequential", "train.eval_iters=2"]
    ranks = srun_ranks(tmp_path, [overrides, overrides], timeout_s)
    outputs = [(rank.stdout, rank.stderr) for rank in ranks]
    assert time.monotonic() - started < timeout_s / 2  # neither waited for the other until the timeout
    assert [rank.returncode != 0 for rank in ranks] == [True, True], outputs
    output = "".join(out + err for out, err in outputs)
    assert "Traceback" not in output, output
    message = outputs[0][1].strip().splitlines()[-1]
    assert message.startswith("error: ") and "holds token id 60000 at token 40" in message, output
    assert output.count("holds token id 60000") == 1, output  # told once, by rank 0


def srun_ranks(tmp_path, overrides_of_rank, timeout_s: int) -> list[subprocess.CompletedProcess]:
    """Two ranks started as srun starts them, each ending on its own (no torchrun agent to end the others), rank r
    with its overrides; forked from the warm Python (``warm_python.run_ranks``). Their results once both ended."""
    return warm_python.run_ranks([sys.executable, "train.py", f"hydra.run.dir={tmp_path / 'run'}", *SMALL,
                                  f"train.distributed_timeout_s={timeout_s}"], world_size=2, cwd=REPO,
                                 timeout=2 * timeout_s, rank_args=overrides_of_rank, end_on_failure=False)


@pytest.mark.slow
def test_data_no_rank_can_use_is_told_once_and_data_one_rank_lacks_stops_the_other_rank_too(tmp_path, corpus):
    timeout_s = 300
    edit_manifest(corpus, lambda m: m.update(max_token_id=60_000))  # past model.vocab_size: every rank's fault
    started = time.monotonic()
    ranks = srun_ranks(tmp_path / "alike", [[f"data.dir={corpus}"]] * 2, timeout_s)
    outputs = [(rank.stdout, rank.stderr) for rank in ranks]
    output = "".join(out + err for out, err in outputs)
    assert [rank.returncode != 0 for rank in ranks] == [True, True] and "Traceback" not in output, output
    assert output.count("token ids up to 60000, but model.vocab_size is") == 1, output  # told once, by rank 0
    # A directory only rank 1 lacks (a node without the shared file system): rank 0 stops too, naming rank 1's fault.
    ranks = srun_ranks(tmp_path / "one", [[], [f"data.dir={tmp_path / 'not-mounted'}"]], timeout_s)
    outputs = [(rank.stdout, rank.stderr) for rank in ranks]
    output = "".join(out + err for out, err in outputs)
    assert time.monotonic() - started < timeout_s / 2, output  # no rank waited for the other until the timeout
    assert [rank.returncode != 0 for rank in ranks] == [True, True] and "Traceback" not in output, output
    assert outputs[0][1].strip().splitlines()[-1].startswith("error: rank 1 stopped: "), output
    assert "not-mounted" in outputs[1][1].strip().splitlines()[-1], output


HYDRA_REFUSALS = [pytest.param(case, where, id=f"{name}, {where}") for name, case in HYDRA_CASES.items()
                  for where in ("command line", "own config file") if where == "command line" or case.in_file]


@pytest.mark.parametrize("case, where", HYDRA_REFUSALS)
def test_what_hydra_refuses_is_one_error_line_with_the_fix_not_hydras_block(tmp_path, case, where):
    mine, choosing_mine = users_config(tmp_path / "my-configs", case)
    arguments, expected = (([case.override], case.on_command_line) if where == "command line"
                           else (choosing_mine, case.in_file.format(file=mine)))
    # Hydra takes its options (--config-dir) before the overrides
    result = warm_python.run([sys.executable, str(REPO / "train.py"), *arguments, *SMALL,
                              f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, timeout=300, env=environment({}))
    last = assert_one_line(result)
    assert last.startswith(f"error: {expected}") and result.stderr.strip() == last, result.stderr
    assert "HYDRA_FULL_ERROR" not in result.stdout + result.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_wandb_online_with_its_server_unreachable_stops_within_its_timeout_leaving_the_directory_to_a_rerun(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    with socket.socket() as closed_port:  # bound, never listening: every connection to it is refused
        closed_port.bind(("127.0.0.1", 0))
        env = {"HOME": str(home), "WANDB_CONFIG_DIR": str(home / "wandb"), "NETRC": str(home / "netrc"),
               "WANDB_BASE_URL": f"http://127.0.0.1:{closed_port.getsockname()[1]}", "WANDB_API_KEY": "0" * 40,
               "WANDB_MODE": None}
        started = time.monotonic()
        result = train(tmp_path / "run", "wandb.mode=online", "wandb.init_timeout_s=1", env=env)
        waited = time.monotonic() - started
    assert_one_line(result, "wandb.mode=online could not start a wandb run within wandb.init_timeout_s=1",
                    "connection refused", "wandb.mode=disabled in the same run directory")
    assert waited < 90, waited  # wandb's own init_timeout, which alone made the launch wait ~140 s
    assert not (tmp_path / "run" / "wandb").exists()
    rerun = train(tmp_path / "run", "wandb.mode=disabled")
    assert rerun.returncode == 0, rerun.stderr

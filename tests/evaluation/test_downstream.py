"""The downstream suite end to end, offline: a checkpoint written by train.py, exported and scored by
lm-evaluation-harness on a four-question local task, against the same accuracy computed by hand with our model."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from data.tokenizer import gpt2_encoding
from evaluation.authors_downstream import RESULTS, TASKS
from evaluation.downstream import markdown_table
from evaluation.checkpoints import load_model
from tests import warm_python
from tests.evaluation.test_export_hf import small_checkpoint
from tests.test_one_line_errors import assert_one_line

REPO = Path(__file__).resolve().parents[2]
TINY_TASK = REPO / "tests" / "evaluation" / "tiny_task"
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    warm_python.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", "model.n_layer=2", "model.n_head=2",
                     "model.n_embd=32", "model.activation=gelu_tanh", "model.scale_attn_by_inverse_layer_idx=true",
                     "train.batch_size=2", "train.block_size=32", "train.max_iters=4", "train.eval_interval=4",
                     "train.checkpoint_interval=4", "train.device=cpu"], cwd=REPO, check=True, timeout=600)
    result = warm_python.run([sys.executable, "-m", "evaluation.downstream", "--checkpoint", str(run_dir), "--tasks",
                              "tiny_choice", "--include-path", str(TINY_TASK), "--batch-size", "2"],
                             cwd=REPO, env=OFFLINE, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, result


def hand_accuracy(run_dir) -> tuple[float, float]:
    """acc and acc_norm as lm_eval defines them for multiple choice: the choice with the highest log-likelihood
    of " <choice>" after the question, and of that log-likelihood divided by the choice's length in characters."""
    model, _ = load_model(run_dir, torch.device("cpu"))
    model.eval()
    encoding = gpt2_encoding()
    acc = acc_norm = 0
    documents = [json.loads(line) for line in (TINY_TASK / "tiny_choice.jsonl").read_text().splitlines()]
    for doc in documents:
        context = encoding.encode(doc["question"])
        likelihoods = []
        for choice in doc["choices"]:
            continuation = encoding.encode(" " + choice)
            tokens = torch.tensor([context + continuation])
            with torch.no_grad():
                logits, _ = model(tokens[:, :-1])
            log_probs = torch.log_softmax(logits.double(), dim=-1)[0, len(context) - 1:]
            likelihoods.append(log_probs[torch.arange(len(continuation)), torch.tensor(continuation)].sum().item())
        normalised = [ll / len(choice) for ll, choice in zip(likelihoods, doc["choices"])]
        acc += max(range(len(likelihoods)), key=likelihoods.__getitem__) == doc["answer"]
        acc_norm += max(range(len(normalised)), key=normalised.__getitem__) == doc["answer"]
    return acc / len(documents), acc_norm / len(documents)


@pytest.mark.slow
def test_lm_eval_accuracy_on_the_exported_checkpoint_equals_the_hand_computation(scored_run):
    run_dir, _ = scored_run
    results = json.loads((run_dir / "downstream" / "results.json").read_text())["results"]["tiny_choice"]
    acc, acc_norm = hand_accuracy(run_dir)
    assert results["acc,none"] == pytest.approx(acc) and results["acc_norm,none"] == pytest.approx(acc_norm)


@pytest.mark.slow
def test_the_table_puts_the_run_beside_the_authors_rows_of_its_size(scored_run):
    run_dir, result = scored_run
    table = (run_dir / "downstream" / "table.md").read_text()
    assert "| model | tiny_choice | Avg. |" in table and "(this run)" in table
    assert "(authors)" not in table  # no authors' row for a 2 x 32 model
    assert (run_dir / "downstream" / "hf" / "config.json").is_file()
    assert table.splitlines()[0] in result.stdout


def test_a_paper_size_run_is_shown_under_the_authors_rows_with_acc_norm_where_there_is_one():
    results = {"hellaswag": {"acc,none": 0.30, "acc_norm,none": 0.3712}, "boolq": {"acc,none": 0.5511}}
    table = markdown_table(results, ["hellaswag", "boolq"], "GPT-2 small, run", "small")
    lines = table.splitlines()
    assert lines[0] == "| model | HellaSwag | BoolQ | Avg. |"
    assert "| MARS-AdamW (authors) | 36.91 | 55.84 | - |" in lines
    assert lines[-1] == "| GPT-2 small, run (this run) | 37.12 | 55.11 | 46.12 |"


def test_the_authors_averages_are_the_means_of_their_rows():  # guards the transcription of their table
    for rows in RESULTS.values():
        for values in rows.values():
            assert len(values) == len(TASKS) + 1
            assert sum(values[:-1]) / len(TASKS) == pytest.approx(values[-1], abs=0.011)


@pytest.mark.slow
def test_an_unknown_task_is_one_line_of_error(scored_run, tmp_path):
    run_dir, _ = scored_run
    result = warm_python.run([sys.executable, "-m", "evaluation.downstream", "--checkpoint", str(run_dir), "--tasks",
                              "tiny_choise", "--include-path", str(TINY_TASK), "--out", str(tmp_path)],
                             cwd=REPO, env=OFFLINE, timeout=900)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "knows no task tiny_choise" in result.stderr


def test_a_hub_task_without_network_is_one_line_naming_the_offline_ways_and_writes_nothing(tmp_path):
    # The datasets library's offline mode fails as no network does (ConnectionError), without its retries for 30 s;
    # an empty Hugging Face cache, so that no copy of the task's data is read instead.
    env = {**OFFLINE, "HF_HOME": str(tmp_path / "hf-home")}
    out = tmp_path / "downstream"
    result = warm_python.run([sys.executable, "-m", "evaluation.downstream", "--checkpoint",
                              str(small_checkpoint(tmp_path / "good.pt")), "--tasks", "arc_easy", "--out", str(out)],
                             cwd=REPO, env=env, timeout=900)
    assert_one_line(result, "lm_eval could not fetch the data of task arc_easy", "Couldn't reach 'allenai/ai2_arc'",
                    "--include-path DIR --tasks NAME", "HF_DATASETS_OFFLINE=1", "nothing was written")
    assert result.stderr.strip().startswith("error: ")  # the line alone, no traceback before it
    assert not out.exists()

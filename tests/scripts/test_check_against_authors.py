"""scripts.check_against_authors without the authors' code (which the repository does not hold): the refusal of a
directory that is not their checkout, and the comparison machinery, run on our optimizers against themselves."""
import copy
import json
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from model import GPT, GPTConfig
from scripts import check_against_authors as check
from tests import warm_python

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
VARIANTS = {variant.name: variant for variant in check.VARIANTS}


@pytest.fixture(autouse=True)
def one_thread():
    """One thread, as the script runs (main sets it): a toy model's steps take milliseconds so, where two threads
    on a busy machine take seconds; restored for the tests after these."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def our_sides(variant: check.Variant) -> tuple[check.Side, check.Side]:
    """Two of our optimizers for ``variant`` over copies of the toy GPT (ours: same names and shapes as theirs)."""
    base = check.tiny_model(GPT, GPTConfig)
    window = check.lr_window(STEPS)
    return (check.our_side(variant, copy.deepcopy(base), window),
            check.our_side(variant, copy.deepcopy(base), window))


@pytest.mark.slow
def test_a_directory_that_is_not_their_checkout_is_refused_in_one_line_naming_the_missing_file(tmp_path):
    (tmp_path / "MARS").mkdir()
    (tmp_path / "MARS" / "model.py").write_text("")
    result = warm_python.run([sys.executable, "-m", "scripts.check_against_authors", "--authors-dir", str(tmp_path),
                              "--output-dir", str(tmp_path / "results")],
                             cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"--authors-dir {tmp_path} does not look like a checkout of AGI-Arena/MARS: MARS/opt.py is missing"]
    assert not (tmp_path / "results").exists()


def test_a_checkout_missing_one_file_is_refused_naming_that_file(tmp_path):
    for relative in check.AUTHORS_FILES[:-1]:
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    with pytest.raises(SystemExit, match="MARS_M/optimizers/moonlight.py is missing"):
        check.check_authors_dir(tmp_path)
    with pytest.raises(SystemExit, match="no such directory"):
        check.check_authors_dir(tmp_path / "absent")


@pytest.mark.slow
@pytest.mark.parametrize("name", VARIANTS)
def test_each_of_our_variants_against_itself_is_bitwise_at_every_step(name):
    rows = check.compare_sides(*our_sides(VARIANTS[name]), STEPS)
    assert [row["step"] for row in rows] == list(range(STEPS))
    assert all(row["bitwise"] and row["max_abs_diff"] == 0.0 for row in rows)
    assert rows[-1]["our_lr"] == rows[-1]["their_lr"] > 0
    assert check.summarise(rows) == {"bitwise": True, "first_differing_step": None, "first_differing_tensors": [],
                                     "max_abs_diff": 0.0, "max_rel_diff": 0.0}


@pytest.mark.parametrize("name", ["mars-adamw-exact-torch", "mars-m-exact"])
def test_a_learning_rate_perturbed_from_step_4_is_reported_as_differing_from_step_4(name):
    ours, other = our_sides(VARIANTS[name])
    set_lr = other.set_lr

    def perturbed_set_lr(step: int) -> float:
        lr = set_lr(step)
        if step >= 4:
            for group in other.optimizer.param_groups:
                group["lr"] *= 1 + 1e-3
        return lr
    other.set_lr = perturbed_set_lr
    rows = check.compare_sides(ours, other, STEPS)
    assert [row["bitwise"] for row in rows] == [True] * 4 + [False] * (STEPS - 4)
    summary = check.summarise(rows)
    assert summary["first_differing_step"] == 4 and not summary["bitwise"]
    assert 0 < summary["max_abs_diff"] < 1e-3
    assert "transformer.h.0.attn.c_attn.weight" in summary["first_differing_tensors"] == rows[4]["differing"]
    assert 0 < summary["max_abs_diff"] / max(row["travelled"] for row in rows) <= summary["max_rel_diff"] < 1e-2
    assert (f"| {name} | no | 4 | {summary['max_abs_diff']:.1e} | {summary['max_rel_diff']:.1e} |"
            in check.markdown_table({name: summary}, STEPS))


def test_the_gradients_clip_c_t_on_some_steps_and_not_on_others():
    shapes = {name: param.shape for name, param in check.tiny_model(GPT, GPTConfig).named_parameters()}
    correction = 0.025 * 0.95 / (1 - 0.95)  # the presets' gamma * beta1 / (1 - beta1)
    gradients = [check.step_gradients(shapes, step, "step") for step in range(STEPS)]
    clipped = {name: {(now[name] + correction * (now[name] - before[name])).norm().item() > 1
                      for before, now in zip(gradients, gradients[1:])}
               for name, shape in shapes.items() if len(shape) == 2}
    assert {True, False} in clipped.values()


def test_the_gradients_are_a_function_of_name_step_and_kind_alone():
    shapes = {"a": torch.Size([3, 2]), "b": torch.Size([3, 2])}
    first = check.step_gradients(shapes, 2, "step")
    assert torch.equal(first["a"], check.step_gradients({"a": shapes["a"]}, 2, "step")["a"])
    assert not torch.equal(first["a"], first["b"])
    assert not torch.equal(first["a"], check.step_gradients(shapes, 3, "step")["a"])
    assert not torch.equal(first["a"], check.step_gradients(shapes, 2, "look-ahead")["a"])


def test_main_writes_the_table_and_the_record_of_every_step(tmp_path, monkeypatch):
    # Their side stood in for by ours: main's wiring and report without their code.
    variant = VARIANTS["mars-m-approx"]
    stand_in = replace(variant, build_theirs=lambda authors, model, window: check.our_side(variant, model, window))
    monkeypatch.setattr(check, "VARIANTS", [stand_in])
    monkeypatch.setattr(check, "load_authors_code",
                        lambda authors_dir, device: SimpleNamespace(model=SimpleNamespace(GPT=GPT,
                                                                                          GPTConfig=GPTConfig)))
    check.main(["--authors-dir", str(tmp_path), "--steps", str(STEPS), "--only", "mars-m-approx",
                "--output-dir", str(tmp_path / "results")])
    table = (tmp_path / "results" / "check_against_authors_cpu.md").read_text()
    assert "| mars-m-approx | yes | - | 0 | 0 |" in table
    assert "torch.compile disabled" in table and "not a git work tree" in table
    record = json.loads((tmp_path / "results" / "check_against_authors_cpu.json").read_text())
    assert record["command"].startswith("python -m scripts.check_against_authors --authors-dir")
    assert record["authors_commit"] is None and record["steps"] == STEPS
    assert record["summaries"] == {"mars-m-approx": {"bitwise": True, "first_differing_step": None,
                                                     "first_differing_tensors": [], "max_abs_diff": 0.0,
                                                     "max_rel_diff": 0.0}}
    assert len(record["per_step"]["mars-m-approx"]) == STEPS
    assert record["model"]["initial_weights_equal"] and "initial weights equal, tensor for tensor" in table


def test_a_model_that_draws_its_weights_otherwise_is_reported_naming_them():
    def gpt_drawing_once_first(config):
        torch.rand(1)  # one draw before the modules: every weight after it comes out different
        return GPT(config)
    model = check.compare_models(SimpleNamespace(model=SimpleNamespace(GPT=gpt_drawing_once_first,
                                                                       GPTConfig=GPTConfig)))
    assert not model["initial_weights_equal"]
    assert "transformer.wte.weight" in model["differing_weights"]
    assert model["loss_abs_diff"] > 0
    assert "NOT equal: " in check.model_paragraph(model)


def test_too_few_steps_for_the_schedule_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        check.main(["--authors-dir", str(tmp_path), "--steps", "5"])


def test_the_triton_variants_run_where_our_triton_backend_does(tmp_path, monkeypatch):
    # Under TRITON_INTERPRET=1 (tests/conftest.py) the CPU runs the kernels; their side stood in for by our
    # reference backend, so the row is Triton's kernels against the reference rule, through main's wiring.
    variant = VARIANTS["mars-lion-approx-triton"]
    reference = replace(variant, overrides=("optimizer.mars_type=mars-lion", "optimizer.backend=reference"))
    stand_in = replace(variant, build_theirs=lambda authors, model, window: check.our_side(reference, model, window))
    monkeypatch.setattr(check, "VARIANTS", [stand_in])
    monkeypatch.setattr(check, "load_authors_code",
                        lambda authors_dir, device: SimpleNamespace(model=SimpleNamespace(GPT=GPT,
                                                                                          GPTConfig=GPTConfig)))
    check.main(["--authors-dir", str(tmp_path), "--steps", str(STEPS), "--output-dir", str(tmp_path / "results")])
    record = json.loads((tmp_path / "results" / "check_against_authors_cpu.json").read_text())
    assert list(record["summaries"]) == ["mars-lion-approx-triton"]
    assert record["summaries"]["mars-lion-approx-triton"]["max_rel_diff"] < 1e-2
    # Without the interpreter the CPU cannot run them: left out by default, refused when asked for.
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not check.runs_on(variant, torch.device("cpu")) and check.runs_on(variant, torch.device("cuda"))
    with pytest.raises(SystemExit):
        check.main(["--authors-dir", str(tmp_path), "--only", "mars-lion-approx-triton"])


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of a machine without a GPU")
def test_asking_for_cuda_without_a_gpu_is_refused_in_one_line(tmp_path):
    result = warm_python.run([sys.executable, "-m", "scripts.check_against_authors", "--authors-dir", str(tmp_path),
                              "--device", "cuda", "--output-dir", str(tmp_path / "results")],
                             cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 2 and "--device cuda: torch sees no CUDA device here" in result.stderr

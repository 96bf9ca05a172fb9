"""Every entry point of scripts/ and evaluation/ refuses an argument it cannot use with one line naming the flag,
before it does anything (reporting/arguments.py)."""
import argparse
import importlib

import pytest
import torch

from reporting import arguments

# A device this machine lacks: cuda where there is none (what a CPU-only torch build is asked for), else one more.
NO_SUCH_DEVICE = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
AUTHORS = ["--authors-dir", "."]  # parsed as a path only: the values below are refused before it is looked at

# (entry point, its arguments, the flag the refusal names)
REFUSED = [
    ("evaluation.sample", ["--checkpoint", "run", "--temperature", "nan"], "--temperature"),
    ("evaluation.sample", ["--checkpoint", "run", "--temperature", "-0.5"], "--temperature"),
    ("evaluation.sample", ["--checkpoint", "run", "--num-samples", "0"], "--num-samples"),
    ("evaluation.sample", ["--checkpoint", "run", "--max-new-tokens", "-5"], "--max-new-tokens"),
    ("evaluation.sample", ["--checkpoint", "run", "--top-k", "-3"], "--top-k"),
    ("evaluation.sample", ["--checkpoint", "run", "--seed", "-1"], "--seed"),
    ("evaluation.sample", ["--checkpoint", "run", "--seed", str(2**64)], "--seed"),
    ("evaluation.sample", ["--checkpoint", "run", "--device", NO_SUCH_DEVICE], "--device"),
    ("evaluation.sample", ["--checkpoint", "run", "--device", "tpu"], "--device"),
    ("evaluation.hellaswag", ["--checkpoint", "run", "--limit", "0"], "--limit"),
    ("evaluation.hellaswag", ["--checkpoint", "run", "--batch-size", "0"], "--batch-size"),
    ("evaluation.hellaswag", ["--checkpoint", "run", "--device", NO_SUCH_DEVICE], "--device"),
    ("evaluation.downstream", ["--checkpoint", "run", "--batch-size", "-2"], "--batch-size"),
    ("evaluation.downstream", ["--checkpoint", "run", "--limit", "nan"], "--limit"),
    ("evaluation.downstream", ["--checkpoint", "run", "--limit", "0"], "--limit"),
    ("evaluation.downstream", ["--checkpoint", "run", "--num-fewshot", "-1"], "--num-fewshot"),
    ("evaluation.downstream", ["--checkpoint", "run", "--include-path", "no/such/tasks"], "--include-path"),
    ("evaluation.downstream", ["--checkpoint", "run", "--device", NO_SUCH_DEVICE], "--device"),
    ("evaluation.downstream", ["--checkpoint", "run", "--tasks", " , "], "--tasks"),
    ("evaluation.export_hf", ["--out", "hf"], "--checkpoint"),
    ("scripts.bench_data", ["--tokens", "0"], "--tokens"),
    ("scripts.bench_data", ["--shards", "-1"], "--shards"),
    ("scripts.bench_data", ["--batch-size", "0"], "--batch-size"),
    ("scripts.bench_data", ["--block-size", "0"], "--block-size"),
    ("scripts.bench_data", ["--batches", "0"], "--batches"),
    ("scripts.bench_data", ["--rounds", "0"], "--rounds"),
    ("scripts.bench_data", ["--copies", "0"], "--copies"),
    ("scripts.bench_mars_m", ["--reps", "0"], "--reps"),
    ("scripts.bench_mars_m", ["--step-reps", "0"], "--step-reps"),
    ("scripts.bench_mars_m", ["--warmup", "-1"], "--warmup"),
    ("scripts.bench_mars_m", ["--device", NO_SUCH_DEVICE], "--device"),
    ("scripts.bench_newton_schulz", ["--reps", "0"], "--reps"),
    ("scripts.bench_newton_schulz", ["--device", NO_SUCH_DEVICE], "--device"),
    ("scripts.bench_train", ["--batch-size", "0"], "--batch-size"),
    ("scripts.bench_train", ["--block-size", "0"], "--block-size"),
    ("scripts.bench_train", ["--steps", "0"], "--steps"),
    ("scripts.bench_train", ["--warmup", "-1"], "--warmup"),
    ("scripts.bench_train", ["--loss-chunk-sizes", "0", "-64"], "--loss-chunk-sizes"),
    ("scripts.bench_train", ["--device", NO_SUCH_DEVICE], "--device"),
    ("scripts.bench_optimizer", ["--reps", "0"], "--reps"),
    ("scripts.bench_optimizer", ["--warmup", "-1"], "--warmup"),
    ("scripts.bench_optimizer", ["--device", NO_SUCH_DEVICE], "--device"),
    ("scripts.bench_optimizer", ["--compiled", "--host-time"], "--host-time"),
    ("scripts.bench_triton_kernel", ["--block-sizes", "0"], "--block-sizes"),
    ("scripts.bench_triton_kernel", ["--num-warps", "-4"], "--num-warps"),
    ("scripts.check_against_authors", [*AUTHORS, "--steps", "2"], "--steps"),
    ("scripts.check_against_authors", [*AUTHORS, "--device", "tpu"], "--device"),
    ("scripts.check_trainer_against_authors", [*AUTHORS, "--steps", "0"], "--steps"),
    ("scripts.check_trainer_against_authors", [*AUTHORS, "--steps", "3"], "--steps"),  # within the warmup
    ("scripts.check_trainer_against_authors", [*AUTHORS, "--eval-interval", "0"], "--eval-interval"),
    ("scripts.check_trainer_against_authors", [*AUTHORS, "--eval-iters", "-1"], "--eval-iters"),
    ("scripts.bench_authors_trainers", [*AUTHORS, "--skip", "-1"], "--skip"),
    ("scripts.bench_authors_trainers", [*AUTHORS, "--steps", "10", "--skip", "10"], "--steps"),
    ("scripts.eval_sampling_gap", ["--steps", "0"], "--steps"),
    ("scripts.eval_sampling_gap", ["--seeds", "1", "two"], "--seeds"),
    ("scripts.small_study", ["--jobs", "0"], "--jobs"),
    ("scripts.plot_curves", [], "runs"),
    ("scripts.plot_sweep", ["outputs/*", "--bogus"], "--bogus"),
]


@pytest.mark.parametrize("module, argv, flag", REFUSED, ids=[f"{m.split('.')[1]} {' '.join(a)}" for m, a, _ in REFUSED])
def test_an_argument_the_command_cannot_use_is_refused_in_one_line_naming_its_flag(module, argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(module).main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and captured.out == "", captured
    [line] = captured.err.splitlines()
    assert line.startswith("error: ") and flag in line and "train.device" not in line, line


def test_the_refusals_say_what_the_value_must_be():
    def refusal(parse, text: str) -> str:
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            parse(text)
        return str(refused.value)

    assert refusal(arguments.positive_int, "0") == "must be an integer >= 1, not 0"
    assert refusal(arguments.positive_int, "2.5") == "must be an integer >= 1, not '2.5'"
    assert refusal(arguments.non_negative_float, "inf") == "must be a finite number >= 0, not inf"
    assert refusal(arguments.positive_float, "0") == "must be a finite number > 0, not 0"
    assert refusal(arguments.seed, "-1") == f"must be an integer from 0 to {arguments.SEED_MAX}, not -1"
    assert refusal(arguments.device, "tpu") == "tpu is not a device this trainer runs on: use auto, cpu, cuda or cuda:N"
    if not torch.cuda.is_available():
        assert refusal(arguments.device, "cuda") == "cuda but CUDA is not available here: use cpu or auto"
    assert (arguments.positive_int("3"), arguments.non_negative_float("0"), arguments.seed(str(arguments.SEED_MAX))) \
        == (3, 0.0, arguments.SEED_MAX)

"""The paper's downstream suite on a checkpoint: export to Hugging Face format, then lm-evaluation-harness.

    python -m evaluation.downstream --checkpoint outputs/<run> [--tasks arc_easy,hellaswag,...] \\
        [--batch-size 16] [--device cuda] [--dtype bfloat16] [--limit 100] [--num-fewshot 0] [--out DIR]

Default tasks: the nine of the MARS authors' FineWeb-Edu table (ARC-Easy, ARC-Challenge, BoolQ, HellaSwag,
OpenBookQA, PIQA, WinoGrande, MMLU, SciQ). lm_eval fetches those from the Hugging Face Hub on first use (or
reads its cache): they need network once. Local tasks (an lm_eval task YAML with local data files) run offline:
``--include-path DIR --tasks <name>``. Writes, in ``--out`` (default: ``<run dir>/downstream``): the exported
model (``hf/``), lm_eval's raw results (``results.json``) and a markdown table of ours beside the authors'
(``table.md``). Every task's data is loaded before anything is written: without network (or its cache), the
command stops with one line and ``--out`` as it was.
"""
import dataclasses
import json
import logging
from pathlib import Path

from configs.models import GPT2_SHAPES
from evaluation.authors_downstream import RESULTS as AUTHORS_RESULTS
from evaluation.authors_downstream import TASKS as PAPER_TASKS
from reporting import arguments
from training.atomic import atomic_file

log = logging.getLogger(__name__)

MODEL_SIZES = {(n_layer, n_embd): size for size, (n_layer, _, n_embd) in GPT2_SHAPES.items()}


def run_dir_of(checkpoint: Path) -> Path:
    """The run directory of a checkpoint file (``<run>/checkpoints/ckpt_*.pt``), or ``checkpoint`` if a directory."""
    return checkpoint if checkpoint.is_dir() else checkpoint.parent.parent


def task_manager_for(tasks: list[str], include_path: Path | None = None):
    """lm_eval's ``TaskManager`` of its own tasks and those in ``include_path``, which must know each of ``tasks``."""
    from lm_eval.tasks import TaskManager

    task_manager = TaskManager(include_path=str(include_path) if include_path else None)
    unknown = [task for task in tasks if task not in task_manager.all_tasks]
    if unknown:
        raise ValueError(f"lm_eval knows no task {', '.join(unknown)}: check the names (python -m lm_eval ls tasks), "
                         "or pass --include-path for a local task YAML")
    return task_manager


def check_task_data(tasks: list[str], task_manager) -> None:
    """Load each task's data as lm_eval will (the Hub's tasks are downloaded on first use, then read from the
    cache), so that a missing network stops the command before it writes anything; the evaluation reads it again,
    from the cache."""
    from lm_eval.tasks import get_task_dict

    for task in tasks:
        try:
            if hasattr(task_manager, "load"):  # lm_eval's 2026 task manager, which deprecated get_task_dict
                task_manager.load(task)
            else:
                get_task_dict([task], task_manager)
        except ConnectionError as err:
            raise ValueError(f"lm_eval could not fetch the data of task {task} ({' '.join(str(err).split())}): the "
                             "Hub's tasks need network once (lm_eval caches their data; later runs read the cache, "
                             "offline too with HF_DATASETS_OFFLINE=1), or score a local task offline with "
                             "--include-path DIR --tasks NAME; nothing was written") from None


def evaluate(hf_dir: Path, tasks: list[str], task_manager, *, batch_size: int = 8, device: str = "cpu",
             dtype: str = "float32", limit: int | float | None = None, num_fewshot: int | None = None) -> dict:
    """lm_eval's results for the exported model in ``hf_dir`` (its ``results`` dict: task -> metric -> value)."""
    import lm_eval

    return lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(hf_dir), "dtype": dtype}, tasks=tasks, batch_size=batch_size,
        device=device, limit=limit, num_fewshot=num_fewshot, task_manager=task_manager, log_samples=False,
    )


def accuracy(task_results: dict) -> float | None:
    """The task's accuracy in %: ``acc_norm`` where lm_eval reports it, else ``acc`` (the authors' reading)."""
    for metric in ("acc_norm,none", "acc,none"):
        if task_results.get(metric) is not None:
            return 100 * task_results[metric]
    return None


def model_size(model_config: dict) -> str:
    """GPT-2's size of a ``model`` config section (``small``, the authors' rows' key), else its depth x width; a
    LLaMA model's label (``llama-60m``): the authors have no rows for it."""
    if model_config.get("arch", "gpt2") != "gpt2":
        from reporting.run_labels import model_label  # with torch (the registry): not for GPT-2's readers

        return model_label(model_config)
    return MODEL_SIZES.get((model_config["n_layer"], model_config["n_embd"]),
                           f"{model_config['n_layer']}x{model_config['n_embd']}")


def markdown_table(results: dict, tasks: list[str], label: str, size: str) -> str:
    """Our row beside the authors' rows for the same model size (when they published one), task by task."""
    titles = [PAPER_TASKS.get(task, task) for task in tasks]
    ours = [accuracy(results.get(task, {})) for task in tasks]
    lines = [f"| model | {' | '.join(titles)} | Avg. |", "|---" * (len(tasks) + 2) + "|"]
    for row_label, values in AUTHORS_RESULTS.get(size, {}).items():
        by_task = dict(zip(PAPER_TASKS, values))
        cells = [by_task.get(task) for task in tasks]
        average = values[-1] if list(tasks) == list(PAPER_TASKS) else None
        lines.append(f"| {row_label} (authors) | " + " | ".join(format_cell(c) for c in cells)
                     + f" | {format_cell(average)} |")
    known = [value for value in ours if value is not None]
    average = sum(known) / len(known) if known and len(known) == len(ours) else None
    lines.append(f"| {label} (this run) | " + " | ".join(format_cell(v) for v in ours) + f" | {format_cell(average)} |")
    return "\n".join(lines) + "\n"


def format_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = arguments.OneLineParser(prog="python -m evaluation.downstream", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="a checkpoint written by train.py, or a run directory (its newest checkpoint)")
    parser.add_argument("--tasks", default=",".join(PAPER_TASKS), help="comma-separated lm_eval task names")
    parser.add_argument("--batch-size", type=arguments.positive_int, default=8)
    parser.add_argument("--device", type=arguments.device, default="cpu", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--limit", type=arguments.positive_float,
                        help="evaluate the first N documents of each task, or this fraction of them (a quick run)")
    parser.add_argument("--num-fewshot", type=arguments.non_negative_int,
                        help="examples in each prompt (default: each task's own, 0)")
    parser.add_argument("--include-path", type=arguments.existing_directory,
                        help="a directory of local lm_eval task YAMLs")
    parser.add_argument("--out", type=Path, help="output directory (default: <run dir>/downstream)")
    args = parser.parse_args(argv)
    tasks = [task.strip() for task in args.tasks.split(",") if task.strip()]
    if not tasks:
        parser.error(f"argument --tasks: names no task in {args.tasks!r}: give comma-separated lm_eval task names")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out = args.out or run_dir_of(args.checkpoint) / "downstream"
    limit = int(args.limit) if args.limit is not None and args.limit >= 1 else args.limit
    # torch and transformers take seconds to import: not for the readers of model_size and markdown_table
    from evaluation.checkpoints import checkpoint_source, load_model
    from evaluation.export_hf import save_hf
    from model import arch_of
    from reporting.run_labels import display_model

    try:
        model, checkpoint = load_model(args.checkpoint, gpt2_text_for="the downstream suite")
        task_manager = task_manager_for(tasks, args.include_path)
        check_task_data(tasks, task_manager)  # before anything is written: no network leaves --out as it was
        # out/hf is this command's own copy, rewritten by each evaluation
        hf_dir = save_hf(model, out / "hf", checkpoint_source(checkpoint), overwrite=True)
        evaluation = evaluate(hf_dir, tasks, task_manager, batch_size=args.batch_size, device=str(args.device),
                              dtype=args.dtype, limit=limit, num_fewshot=args.num_fewshot)
        size = model_size({"arch": arch_of(model.config), **dataclasses.asdict(model.config)})
        table = markdown_table(evaluation["results"], tasks, f"{display_model(size)}, {args.checkpoint}", size)
        note = (f"\nAccuracy in %: acc_norm where lm_eval reports it, else acc. lm_eval "
                f"{evaluation.get('lm_eval_version', '')}, limit {limit}, few-shot "
                f"{args.num_fewshot if args.num_fewshot is not None else 'task default'}, {args.dtype} on "
                f"{args.device}. Authors' rows: AGI-Arena/MARS README (FineWeb-Edu), see "
                "evaluation/authors_downstream.py.\n")
        write_results(out, evaluation, table + note)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    except OSError as err:  # a read-only or full --out
        raise SystemExit(f"error: could not write {err.filename or out} ({err.strerror or err}): pass a writable "
                         "--out with space for the model and its results") from None
    print(table + note, end="")
    log.info("wrote %s and %s", out / "results.json", out / "table.md")


def write_results(out: Path, evaluation: dict, table: str) -> None:
    """lm_eval's raw results as ``results.json`` and the table as ``table.md``, each replaced whole."""
    from lm_eval.utils import handle_non_serializable

    with atomic_file(out / "results.json") as f:
        f.write(json.dumps(evaluation, indent=2, default=handle_non_serializable))
    with atomic_file(out / "table.md") as f:
        f.write(table)

if __name__ == "__main__":
    main()

"""HellaSwag (Zellers et al., 2019, arXiv 1905.07830) zero-shot accuracy of a trained model, scored as llm.c and
nanoGPT score it (the scorer, shared with the training loop, and how it scores: ``training/hellaswag.py``).

    python -m evaluation.hellaswag --checkpoint outputs/my-run [--data FILE] [--limit N] [--download]

``--download`` fetches the official validation file (rowanz/hellaswag ``data/hellaswag_val.jsonl``, 10,042 items)
into the data cache (``$MARS_DATA_CACHE/hellaswag`` or ``~/.cache/mars-gpt2/hellaswag``); nothing is downloaded
otherwise.
"""
import contextlib
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from evaluation.checkpoints import load_model
from reporting import arguments
from training.hellaswag import VAL_URL, Item, correct_counts, default_val_path, load_items


def download_val(path: Path | None = None) -> Path:
    """Fetch the official validation file (about 11 MB) to ``path`` (default: the data cache)."""
    path = Path(path or default_val_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        urllib.request.urlretrieve(VAL_URL, partial)
    except (urllib.error.URLError, OSError) as err:
        raise ConnectionError(f"could not download {VAL_URL} ({err}): fetch it by hand and pass --data FILE") from None
    os.replace(partial, path)
    return path


def evaluate_hellaswag(model, items: list[Item], device, autocast=contextlib.nullcontext(), batch_size: int = 16,
                       max_length: int | None = None) -> dict:
    """``{"acc", "acc_norm", "items"}``: accuracy by summed and by per-token log-likelihood of the endings."""
    if not items:
        raise ValueError("no HellaSwag items to evaluate")
    correct, correct_norm = correct_counts(model, items, device, autocast, batch_size, max_length)
    return {"acc": correct / len(items), "acc_norm": correct_norm / len(items), "items": len(items)}


def _parser() -> arguments.OneLineParser:
    parser = arguments.OneLineParser(prog="python -m evaluation.hellaswag", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="a checkpoint written by train.py, or a run directory (its newest checkpoint)")
    parser.add_argument("--data", type=Path, help=f"HellaSwag JSONL file (default: {default_val_path()})")
    parser.add_argument("--limit", type=arguments.positive_int, help="evaluate the first N items only")
    parser.add_argument("--download", action="store_true",
                        help="fetch the official validation file into the data cache if it is not there")
    parser.add_argument("--batch-size", type=arguments.positive_int, default=16,
                        help="items per forward pass (4 sequences each)")
    parser.add_argument("--device", type=arguments.device, default="auto", help="auto, cpu, cuda or cuda:N")
    return parser


def main(argv: list[str] | None = None) -> None:
    from configs.schema import Precision
    from training.runtime import autocast_context, resolve_dtype

    args = _parser().parse_args(argv)
    try:
        data = args.data or default_val_path()
        if not data.is_file():
            if args.data or not args.download:
                raise FileNotFoundError(f"{data} does not exist: pass --download to fetch the validation file "
                                        "(needs network), or --data FILE")
            download_val(data)
        model, checkpoint = load_model(args.checkpoint, args.device, gpt2_text_for="HellaSwag")
        autocast = autocast_context(args.device, resolve_dtype(Precision.auto, args.device))
        scores = evaluate_hellaswag(model, load_items(data, args.limit), args.device, autocast, args.batch_size,
                                    max_length=model.config.block_size)
    except (ValueError, FileNotFoundError, ConnectionError) as err:
        raise SystemExit(f"error: {err}") from None
    print(json.dumps({"checkpoint": str(checkpoint), "data": str(data), **scores}))


if __name__ == "__main__":
    main()

"""Measure the data path: batches/s of the loader in both sampling modes, and tokens/s of data.prepare.

    python -m scripts.bench_data                      (from the repository root; about a minute on 2 cores)

Loader: synthetic GPT-2 token shards (``--tokens`` in ``--shards`` shards, written to a temporary directory,
so they sit in the page cache as a training run's hot shards would) are read into GPT-2 small batches
(16 x 1024 by default) on the CPU, without the host-to-device copy. Reported: the median over ``--rounds``
rounds of ``--batches`` batches each. Prepare: the embedded Shakespeare corpus, written ``--copies`` times into
a .jsonl file, is prepared end to end (streamed read, tokenization, shard writing) with 1 and with all
workers. Prints markdown tables and writes them with the command, CPU and date to
``results/bench_data_cpu.md``.
"""
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from configs.schema import Sampling
from data.embedded import clean_play, play_files
from data.loader import TokenBatches, load_split
from data.prepare import files_source, prepare
from data.shards import write_shard
from data.tokenizer import GPT2_VOCAB_SIZE
from reporting import arguments
from reporting.bench_report import run_record, write_report


def bench_loader(directory: Path, sampling: Sampling, batch_size: int, block_size: int, batches: int,
                 rounds: int) -> float:
    """Median batches/s over ``rounds`` of ``batches`` consecutive steps."""
    loader = TokenBatches(load_split(directory, "train", GPT2_VOCAB_SIZE), "train", batch_size=batch_size,
                          block_size=block_size, seed=0, sampling=sampling)
    rates = []
    for r in range(rounds + 1):  # round 0 warms up
        start = time.perf_counter()
        for step in range(r * batches, (r + 1) * batches):
            loader.batch(step)
        if r:
            rates.append(batches / (time.perf_counter() - start))
    return statistics.median(rates)


def bench_prepare(work: Path, copies: int, workers: int) -> tuple[int, float]:
    """(tokens, seconds) to prepare ``copies`` of the embedded corpus from a .jsonl file with ``workers``."""
    corpus = work / "plays.jsonl"
    if not corpus.exists():
        plays = [json.dumps({"text": clean_play(p.read_text(encoding="utf-8"))}) + "\n" for p in play_files()]
        corpus.write_text("".join(plays) * copies, encoding="utf-8")
    start = time.perf_counter()
    manifest = prepare(files_source([corpus]), work / f"out-{workers}", val_tokens=100_000, workers=workers)
    return sum(manifest["tokens"].values()), time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = arguments.OneLineParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=arguments.positive_int, default=40_000_000,
                        help="synthetic tokens for the loader bench")
    parser.add_argument("--shards", type=arguments.positive_int, default=4)
    parser.add_argument("--batch-size", type=arguments.positive_int, default=16)
    parser.add_argument("--block-size", type=arguments.positive_int, default=1024)
    parser.add_argument("--batches", type=arguments.positive_int, default=500, help="batches per timed round")
    parser.add_argument("--rounds", type=arguments.positive_int, default=5)
    parser.add_argument("--copies", type=arguments.positive_int, default=4,
                        help="copies of the embedded corpus to prepare")
    parser.add_argument("--output-dir", type=Path, default=Path("results"))
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    loader_rows, prepare_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for k in range(args.shards):
            write_shard(work / f"train_{k:06d}.bin",
                        rng.integers(0, GPT2_VOCAB_SIZE, size=args.tokens // args.shards, dtype=np.uint16))
        for sampling in Sampling:
            rate = bench_loader(work, sampling, args.batch_size, args.block_size, args.batches, args.rounds)
            tokens_per_s = rate * args.batch_size * args.block_size
            loader_rows.append(f"| {sampling.value} | {rate:,.0f} | {tokens_per_s / 1e6:,.0f} |")
        for workers in sorted({1, os.cpu_count() or 1}):
            tokens, seconds = bench_prepare(work, args.copies, workers)
            prepare_rows.append(f"| {workers} | {tokens:,} | {seconds:.1f} | {tokens / seconds:,.0f} | "
                                f"{tokens / seconds / workers:,.0f} |")

    loader_table = "\n".join([f"| sampling | batches/s ({args.batch_size} x {args.block_size}) | M tokens/s |",
                              "|---|---:|---:|", *loader_rows])
    prepare_table = "\n".join(["| workers | tokens | seconds | tokens/s | tokens/s per worker |",
                               "|---:|---:|---:|---:|---:|", *prepare_rows])
    record = run_record("bench_data", argv, torch.device("cpu"), tokens=args.tokens, shards=args.shards,
                        copies=args.copies, loader=loader_rows, prepare=prepare_rows)
    write_report(args.output_dir, "bench_data_cpu", "Data path on the CPU", record,
                 f"## Loader ({args.tokens:,} synthetic tokens in {args.shards} page-cached shards, no device copy)\n\n"
                 f"{loader_table}\n\n"
                 f"## `data.prepare` ({args.copies} x the embedded corpus as .jsonl, end to end)\n\n{prepare_table}")

if __name__ == "__main__":
    main()

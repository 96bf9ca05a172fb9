"""The command line that the entry points of scripts/ and evaluation/ share: a parser whose every refusal is one
line, and argument types that refuse a value out of range when it is read, so that the line names its flag.

    parser = OneLineParser(prog="python -m evaluation.sample")
    parser.add_argument("--num-samples", type=positive_int, default=1)
    # --num-samples 0 -> error: argument --num-samples: must be an integer >= 1, not 0
"""
import argparse
import math
from collections.abc import Callable
from pathlib import Path

SEED_MAX = 2**64 - 1  # torch.Generator.manual_seed takes 64 bits


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors (a bad value, a missing or unknown argument, ``parser.error``) are one
    line, ``error: argument --flag: why``, with argparse's exit status 2; argparse's own print its usage first,
    several lines of it for a script of many options."""

    def error(self, message: str):
        self.exit(2, f"error: {message}\n")


def _integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    expected = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {expected}, not {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {expected}, not {value}")
        return value

    return parse


def _finite_float(minimum: float, minimum_allowed: bool) -> Callable[[str], float]:
    expected = f"a finite number {'>=' if minimum_allowed else '>'} {minimum:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {expected}, not {text!r}") from None
        if not math.isfinite(value) or value < minimum or (value == minimum and not minimum_allowed):
            raise argparse.ArgumentTypeError(f"must be {expected}, not {text}")
        return value

    return parse


positive_int = _integer(1)  # a count of steps, samples, items, tokens...
non_negative_int = _integer(0)  # 0 meaning none (warmup steps, few-shot examples) or all (top-k)
seed = _integer(0, SEED_MAX)
non_negative_float = _finite_float(0.0, minimum_allowed=True)  # a temperature (0: greedy)
positive_float = _finite_float(0.0, minimum_allowed=False)


def existing_directory(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} {'is a file' if path.exists() else 'does not exist'}: pass a "
                                         "directory")
    return path


def device(name: str):
    """The ``torch.device`` of auto, cpu, cuda or cuda:N, refused where this machine has no such device."""
    from training.runtime import resolve_device  # imports torch: not for the commands that parse no --device

    try:
        return resolve_device(name, given_as="")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None

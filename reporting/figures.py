"""The command line the figure scripts share, and the one line for an output that cannot be written (the table's
too)."""
import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from reporting.arguments import OneLineParser
from reporting.run_selection import load_runs


def plot_command(prog: str, doc: str, default_out: str, plot: Callable[..., list[Path]],
                 argv: list[str] | None = None,
                 add_options: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """The command line of a figure script: run patterns in, the PNG paths written out (or one error line).

    ``add_options`` adds the script's own options, which reach ``plot`` as keyword arguments.
    """
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = OneLineParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories or glob patterns (quote them)")
    parser.add_argument("--out", type=Path, default=Path(default_out), help="directory for the PNG files")
    if add_options:
        add_options(parser)
    args = vars(parser.parse_args(sys.argv[1:] if argv is None else argv))
    patterns, out = args.pop("runs"), args.pop("out")
    try:
        for path in plot(load_runs(patterns), out, **args):
            print(path)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    except OSError as err:  # a full disk, a read-only directory
        raise SystemExit(unwritable_output(err, out)) from None


def unwritable_output(err: OSError, out: Path) -> str:
    """The one line for an output that could not be written (``err`` names the file where it knows it)."""
    return f"error: cannot write {err.filename or out} ({err.strerror or err}): free space, or choose another --out"

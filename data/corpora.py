"""The named corpora: where each one's shards live by default and which command makes them.

Kept apart from ``data.prepare`` so that the trainer can find a corpus without importing ``datasets``.
"""
import logging
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

EMBEDDED, CUSTOM = "embedded", "custom"  # the data configs of no Hub corpus: built in, and any shard directory


@dataclass(frozen=True)
class HubCorpus:
    """A corpus on the Hugging Face Hub that ``python -m data.prepare <name>`` turns into token shards."""

    name: str  # the prepare sub-command and the data config's `name`
    path: str  # the Hub dataset id
    config: str | None = None  # the Hub dataset's config ("subset"), if it has several
    text_column: str = "text"
    # The validation split of the reference preparation the paper's numbers come from (``data.prepare --split``).
    split: str = "first-documents"
    # How many documents the reference preparation saw, when known: the nanogpt split's permutation depends on it.
    documents: int | None = None

    @property
    def directory_name(self) -> str:
        return f"{self.name}-{self.config}" if self.config else self.name


FINEWEB_EDU_SAMPLES = ("sample-10BT", "sample-100BT")
HUB_CORPORA = {
    # nanoGPT's data/openwebtext/prepare.py: 8,009,762 train + 4,007 val documents.
    "openwebtext": HubCorpus("openwebtext", "Skylion007/openwebtext", split="nanogpt", documents=8_013_769),
    # llm.c's dev/data/fineweb.py, which the MARS authors' FineWeb-Edu trainer reads.
    "fineweb-edu": HubCorpus("fineweb-edu", "HuggingFaceFW/fineweb-edu", config=FINEWEB_EDU_SAMPLES[0],
                             split="llm.c"),
    # GaLore's torchrun_main.py, which the optimizer papers' LLaMA tables follow: data/c4.py.
    "c4": HubCorpus("c4", "allenai/c4", config="en", split="galore"),
}


def take_data_dir_as_custom(data_cfg) -> None:
    """``data=embedded`` (the default) with a ``data.dir`` reads that directory, not Shakespeare: make the run
    ``data=custom``, so that its log, its recorded config and the tables name the directory it read."""
    if data_cfg.name == EMBEDDED and data_cfg.dir is not None:
        log.info("data.dir=%s without data=custom: training on that directory as data=custom", data_cfg.dir)
        data_cfg.name = CUSTOM


def data_root() -> Path:
    """Where prepared corpora live unless told otherwise: $MARS_DATA_CACHE, else ~/.cache/mars-gpt2."""
    base = os.environ.get("MARS_DATA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "mars-gpt2"
    )
    return Path(base)


class DataCacheError(ValueError):
    """The data cache cannot be written; the message names the variable that moves it."""


def unwritable_cache(path: Path, err: OSError) -> DataCacheError:
    """The error for a corpus that cannot be written at ``path``, its default place under :func:`data_root`."""
    now = (f"MARS_DATA_CACHE={os.environ['MARS_DATA_CACHE']}" if os.environ.get("MARS_DATA_CACHE")
           else f"unset, so the cache is {data_root()}")
    return DataCacheError(f"cannot write {err.filename or path} ({err.strerror or err}): set MARS_DATA_CACHE to a "
                          f"directory this user can write, with room for the corpus (now {now}); on a cluster, one "
                          "that every node sees")


def default_directory(corpus: HubCorpus) -> Path:
    return data_root() / corpus.directory_name


def prepare_command(name: str, out: str | os.PathLike | None = None) -> str:
    """The command that creates the shard directory of data config ``name`` (at ``out``, if not the default)."""
    # This interpreter and the directory by their paths: the command runs as printed from any directory, in a shell
    # without the venv activated.
    python = f"{shlex.quote(sys.executable)} -m data.prepare"
    out = shlex.quote(os.path.abspath(out)) if out else None
    if name in HUB_CORPORA:
        return f"{python} {name}" + (f" --out {out}" if out else "")
    return f"{python} files YOUR_FILES... --out {out or 'DIR'}"

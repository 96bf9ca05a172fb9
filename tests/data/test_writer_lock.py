"""Processes that find a shard directory empty at once (the ranks and launches on a fresh data cache, two
data.prepare jobs given one --out) all end with the same whole directory: one writes it, the others wait."""
import os
import subprocess
import sys
from pathlib import Path

from data.embedded import CORPUS_VERSION
from tests.data.test_prepare import shard_bytes

REPO = Path(__file__).resolve().parents[2]

# Each process, before its first rename of a temporary file, waits until the other one has reached that point too
# (it has written its own temporary file), or is waiting for the directory writer's lock (/proc/locks lists it
# behind the holder): the interleaving in which two launches used to write one `train.bin.tmp` and the second to
# rename it died (`No such file or directory: ...train.bin.tmp -> ...train.bin`), forced rather than left to chance.
MEET_BEFORE_THE_FIRST_RENAME = r"""
import os, runpy, sys, time
from pathlib import Path

meeting, me, other = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(meeting / f"{me}.pid").write_text(str(os.getpid()))
real_replace, renamed = os.replace, []

def waiting_for_a_lock(name):
    pid = (meeting / f"{name}.pid").read_text() if (meeting / f"{name}.pid").exists() else None
    return any(fields[1] == "->" and fields[5] == pid for fields in map(str.split, open("/proc/locks")))

def replace_once_both_wrote(source, target):
    if not renamed and str(source).endswith(".tmp"):
        renamed.append(source)
        (meeting / f"{me}.arrived").touch()
        deadline = time.monotonic() + 120
        while not ((meeting / f"{other}.arrived").exists() or waiting_for_a_lock(other)):
            if time.monotonic() > deadline:
                sys.exit(f"{other} neither reached its first rename nor waited for a lock")
            time.sleep(0.01)
    real_replace(source, target)

os.replace = replace_once_both_wrote
if sys.argv[4] == "embedded":
    import logging
    logging.basicConfig(level=logging.INFO)
    from data.embedded import prepare_embedded
    prepare_embedded()
else:
    sys.argv = ["data.prepare", *sys.argv[5:]]
    runpy.run_module("data.prepare", run_name="__main__")
"""


def at_once(tmp_path: Path, *command: str, env: dict | None = None) -> list[subprocess.CompletedProcess]:
    """``command`` (``embedded``, or ``prepare ARGS...``) run by two processes at once, met before their renames."""
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", **(env or {})}
    processes = [subprocess.Popen([sys.executable, "-c", MEET_BEFORE_THE_FIRST_RENAME, str(meeting), me, other,
                                   *command], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for me, other in (("a", "b"), ("b", "a"))]
    results = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return results


def test_two_launches_on_an_empty_data_cache_both_get_the_embedded_corpus_whole(tmp_path, embedded_corpus_cache):
    cache = tmp_path / "cache"
    results = at_once(tmp_path, "embedded", env={"MARS_DATA_CACHE": str(cache)})
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert shard_bytes(cache / CORPUS_VERSION) == shard_bytes(embedded_corpus_cache)
    assert sorted(p.name for p in cache.iterdir()) == [CORPUS_VERSION]  # no lock left beside it
    assert sorted(p.name for p in (cache / CORPUS_VERSION).iterdir()) == ["manifest.json", "train.bin", "val.bin"]
    assert any("waiting for" in r.stderr for r in results), [r.stderr for r in results]


def test_two_preparations_into_one_out_both_end_with_the_corpus_one_of_them_wrote(tmp_path, jsonl_corpus,
                                                                                 prepared_dir, prepare_settings):
    out = tmp_path / "out"
    results = at_once(tmp_path, "prepare", "files", str(jsonl_corpus), "--out", str(out), "--workers", "1",
                      "--shard-size", str(prepare_settings["shard_size"]),
                      "--val-tokens", str(prepare_settings["val_tokens"]))
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert shard_bytes(out) == shard_bytes(prepared_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meeting", "out"]
    assert any("is already prepared" in r.stderr for r in results), [r.stderr for r in results]

"""What a bench script leaves behind: a record of the run (command, date, device, torch version, its figures) and
a markdown table under a header naming the run, printed and written to ``<output_dir>/<stem>.{md,json}``."""
import datetime
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import torch

from training.provenance import device_name


def run_record(script: str, argv: list[str] | None, device: torch.device, **fields: Any) -> dict[str, Any]:
    """The command that ran ``scripts.<script>`` with ``argv`` (default: this process's arguments), the date, the
    device and the torch version, followed by ``fields``."""
    command = f"python -m scripts.{script} " + shlex.join(argv if argv is not None else sys.argv[1:])
    return {"command": command, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "device": device_name(device), "torch": torch.__version__, **fields}


SOFTWARE = ("torch", "triton")  # the versions a report's header names, where its record has them


def write_report(output_dir: Path, stem: str, title: str, record: dict[str, Any], table: str, notes: str = "") -> None:
    """Write ``table`` under ``title``, the record's device, software versions, date and command, and ``notes``
    (what the figures mean) to ``<output_dir>/<stem>.md`` and ``record`` to ``<stem>.json``, then print the former."""
    software = ", ".join(f"{name} {record[name]}" for name in SOFTWARE if name in record)
    header = (f"# {title}\n\n{record['device']}, {software}, {record['date']}\n\n`{record['command']}`\n\n"
              + (f"{notes}\n\n" if notes else ""))
    output_dir.mkdir(parents=True, exist_ok=True)  # the files first: a closed stdout (``| head``) loses nothing
    (output_dir / f"{stem}.md").write_text(header + table + "\n")
    (output_dir / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(header + table)

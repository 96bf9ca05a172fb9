"""What the pages quote of the harness's output is what it prints: every `error:` example in README.md and docs/
is a message of the code (the same text up to its variable parts), and the log's lines are where the pages say."""
import ast
import re
import sys
from pathlib import Path

import pytest

from tests import warm_python

REPO = Path(__file__).resolve().parents[1]
DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SOURCE = [REPO / "train.py", *(path for package in ("configs", "data", "evaluation", "mars", "model", "scripts",
                                                     "training") for path in sorted((REPO / package).rglob("*.py")))]
ELLIPSIS = " ..."  # an example cut short: the rest of the message follows
MIN_LITERAL = 20  # characters of a message's own text an example must hold to be that message's
MIN_TAIL = 5  # characters of literal text an example cut short ends on, after a formatted value
MAX_VALUE = 120  # characters of one formatted value in an example


def quoted_errors(page: Path) -> list[str]:
    """The inline code spans of ``page`` (outside its code blocks) that quote an error line, without `error: `."""
    prose = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    prose = re.sub(r"\s*\n\s*", " ", prose)  # a span may continue on the next line
    spans = re.findall(r"``(.+?)``|`([^`]+)`", prose)
    quoted = [double or single for double, single in spans]
    # `error: <cause>: <fix>` describes the form of every such line: it quotes none.
    return [text.removeprefix("error: ") for text in quoted if text.startswith("error: ") and "<" not in text]


def message_templates() -> list[list[str | None]]:
    """Every string and f-string of the code as a list of parts: its literal text, None for a formatted value."""
    templates = []
    for path in SOURCE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                templates.append([node.value])
            elif isinstance(node, ast.JoinedStr):
                templates.append([part.value if isinstance(part, ast.Constant) else None for part in node.values])
    return templates


def pattern(parts: list[str | None]) -> str:
    """A regex of the messages the template gives: a formatted value is a path, a number, a setting, a reason of a
    line's length at most (else a value could take all the rest of an example cut short)."""
    return "".join(f".{{1,{MAX_VALUE}}}?" if part is None else re.escape(part) for part in parts)


def literal_length(parts: list[str | None]) -> int:
    return sum(len(part) for part in parts if part is not None)


def could_print(parts: list[str | None], example: str) -> bool:
    """Whether the template ``parts`` gives ``example`` for some values, with at least ``MIN_LITERAL`` characters
    of the template's own text in it (``f"{run_dir}: {reason}"`` gives any line with a colon); an example ending in
    " ..." need only be the start of such a message."""
    # The template's own text must be in the example before a regex tries it: over thousands of strings, one with
    # several formatted values would backtrack for long.
    if not example.endswith(ELLIPSIS):
        return (literal_length(parts) >= MIN_LITERAL and all(part in example for part in parts if part)
                and re.fullmatch(pattern(parts), example, re.S) is not None)
    start = example.removesuffix(ELLIPSIS)
    for cut, part in enumerate(parts):
        if cut and parts[cut - 1] is not None and parts[cut - 1] not in start:
            return False  # nor does any later stop hold it
        head = pattern(parts[:cut])
        # The example stops within this part: after the start of its literal text (with enough of the template's
        # text in the example), or in the formatted value that ends the message (one in the middle would take any
        # text after it).
        if part is None:
            if cut == len(parts) - 1 and literal_length(parts) >= MIN_LITERAL and re.fullmatch(f"{head}.*", start,
                                                                                                re.S):
                return True
            continue
        # After a formatted value, enough of the literal that the value cannot have taken the example's end.
        least = MIN_TAIL if cut and parts[cut - 1] is None else 0
        for split in range(len(start) + 1 - least):
            tail = start[split:]
            if (part.startswith(tail) and literal_length(parts[:cut]) + len(tail) >= MIN_LITERAL
                    and re.fullmatch(head, start[:split], re.S)):
                return True
    return False


EXAMPLES = [(page.relative_to(REPO).as_posix(), example) for page in DOC_PAGES for example in quoted_errors(page)]


def test_the_pages_quote_error_lines_for_this_test_to_check():
    assert {page for page, _ in EXAMPLES} >= {"docs/data.md", "docs/multi-node.md"}


@pytest.mark.parametrize("page, example", EXAMPLES, ids=[f"{page}:{example[:40]}" for page, example in EXAMPLES])
def test_every_error_line_quoted_in_the_pages_is_one_the_code_prints(page, example):
    assert any(could_print(parts, example) for parts in message_templates()), (
        f"{page} quotes `error: {example}`, which no message of the code gives")


def test_an_example_that_differs_from_every_message_is_caught():
    templates = message_templates()
    small_corpus = next(text for _, text in EXAMPLES if text.startswith("the corpus has only"))
    assert any(could_print(parts, small_corpus) for parts in templates)
    assert not any(could_print(parts, small_corpus.replace("rerun with", "rerun the whole command with"))
                   for parts in templates)


@pytest.mark.slow
def test_the_logs_third_line_states_the_global_batch(tmp_path):
    # docs/multi-node.md and the README: the data read, the code run, then the model and the global batch.
    result = warm_python.run([sys.executable, "train.py", f"hydra.run.dir={tmp_path}", "model.n_layer=1",
                              "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
                              "train.grad_accum_steps=3", "train.max_iters=1", "train.eval_iters=1",
                              "train.device=cpu"], cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    lines = [line.split("] - ", 1)[1] for line in (tmp_path / "train.log").read_text().splitlines()]
    assert lines[0].startswith("data embedded: ") and lines[1].startswith("launch: code ")
    assert "global batch 192 tokens (2 x 32 x 3 accumulation x 1 ranks)" in lines[2], lines[2]

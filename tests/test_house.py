"""The shape the code keeps so that the next contributor can read it: a training loop in one screen, without
closures, and a README a newcomer finishes (details live in docs/)."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOOP_LINES = 110  # the loop's def to its last line, docstring included
README_LINES = 250
RUN_MODULE_LINES = 350  # each of the tables' reader's modules: a subject read in one sitting


def test_the_training_loop_reads_in_one_screen_and_train_py_defines_no_closures():
    functions = {node.name: node for node in ast.parse((REPO / "train.py").read_text()).body
                 if isinstance(node, ast.FunctionDef)}
    loop = functions["train_loop"]
    assert loop.end_lineno - loop.lineno + 1 <= LOOP_LINES
    nested = [f"{outer.name}.{node.name}" for outer in functions.values() for node in ast.walk(outer)
              if node is not outer and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert nested == [], "train.py's functions define functions or classes inside them"


def test_the_readme_is_short_enough_to_finish():
    assert len((REPO / "README.md").read_text().splitlines()) <= README_LINES


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_nothing_the_training_loop_runs_imports_the_after_training_evaluation():
    # evaluation/ scores, exports and samples trained models, and may use training/; the arrow never points back.
    upward = {f"{path.relative_to(REPO)} imports {module}" for path in [*(REPO / "training").glob("*.py"),
                                                                       REPO / "train.py"]
              for module in imported_modules(path) if module.split(".")[0] == "evaluation"}
    assert upward == set()


def test_the_tables_reader_stays_three_modules_each_read_in_one_sitting_importing_one_way():
    # Reading a run, choosing which runs count, and labelling them were one 720-line module once.
    modules = ("run_labels", "run_reading", "run_selection")  # each imports only those before it
    lengths = {name: len((REPO / "scripts" / f"{name}.py").read_text().splitlines()) for name in modules}
    assert all(length <= RUN_MODULE_LINES for length in lengths.values()), lengths
    backward = {f"{name} imports {later}" for i, name in enumerate(modules) for later in modules[i:]
                if f"scripts.{later}" in imported_modules(REPO / "scripts" / f"{name}.py")}
    assert backward == set()

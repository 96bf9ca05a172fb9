"""The shape the code keeps so that the next contributor can read it: a training loop in one screen, without
closures, and a README a newcomer finishes (details live in docs/)."""
import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LOOP_LINES = 110  # the loop's def to its last line, docstring included
README_LINES = 250
RUN_MODULE_LINES = 350  # each of the tables' reader's modules: a subject read in one sitting
PRODUCT_PACKAGES = ("mars", "model", "data", "configs", "training", "evaluation", "reporting", "scripts")


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
    lengths = {name: len((REPO / "reporting" / f"{name}.py").read_text().splitlines()) for name in modules}
    assert all(length <= RUN_MODULE_LINES for length in lengths.values()), lengths
    backward = {f"{name} imports {later}" for i, name in enumerate(modules) for later in modules[i:]
                if f"reporting.{later}" in imported_modules(REPO / "reporting" / f"{name}.py")}
    assert backward == set()


def test_scripts_holds_entry_points_people_run():
    # What the entry points share lives in reporting/ (or the package of its subject), not beside them.
    not_run = [path.name for path in (REPO / "scripts").glob("*.py")
               if 'if __name__ == "__main__":' not in path.read_text()]
    assert not_run == []


def marked_slow(node: ast.AST) -> bool:
    return "mark.slow" in ast.unparse(node)


def fast_tests(path: Path) -> list[str]:
    """The tests of a test file that `pytest -m "not slow"` runs."""
    tree = ast.parse(path.read_text())
    if any(isinstance(node, ast.Assign) and "pytestmark" in ast.unparse(node.targets) and marked_slow(node.value)
           for node in tree.body):
        return []
    return [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
            and node.name.startswith("test") and not any(marked_slow(d) for d in node.decorator_list)]


def product_modules() -> dict[str, Path]:
    """Every module of the product by its import name, packages (their __init__) and train.py included."""
    modules = {"train": REPO / "train.py"}
    for package in PRODUCT_PACKAGES:
        for path in (REPO / package).glob("*.py"):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return modules


@functools.cache
def defined_in(package: str) -> dict[str, str]:
    """The module of ``package`` that defines each top-level class or function (``from mars import ADOPT`` imports
    mars.adopt, which mars/__init__.py finds when asked)."""
    return {node.name: f"{package}.{path.stem}" for path in (REPO / package).glob("*.py")
            for node in ast.parse(path.read_text()).body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}


def named_modules(path: Path) -> set[str]:
    """The modules a file imports (`from scripts import x` names scripts.x, `from mars import ADOPT` the module of mars
    defining it) or runs (`-m scripts.x`, train.py)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.update({node.module, *(f"{node.module}.{alias.name}" for alias in node.names)})
            if node.module in PRODUCT_PACKAGES:
                definitions = defined_in(node.module)
                names.update(definitions[alias.name] for alias in node.names if alias.name in definitions)
    text = path.read_text()
    words = re.findall(rf"\b(?:{'|'.join(PRODUCT_PACKAGES)})[./]\w+", text)
    run = {"train"} if "train.py" in text else set()
    named = imported_modules(path) | names | {word.replace("/", ".") for word in words} | run
    return named | {name.split(".")[0] for name in named}  # importing a module runs its package first


def test_the_fast_tier_runs_tests_of_every_test_directory_and_reaches_every_product_module():
    # `pytest -m "not slow"` answers in minutes; it still has to notice a module that no longer imports or runs.
    modules = product_modules()
    fast_files = [path for path in (REPO / "tests").rglob("test_*.py") if fast_tests(path)]
    test_directories = {path.parent for path in (REPO / "tests").rglob("test_*.py")}
    assert test_directories - {path.parent for path in fast_files} == set()
    reached = {name for path in fast_files for name in named_modules(path) if name in modules}
    waiting = list(reached)
    while waiting:  # what a reached module imports runs too
        for name in named_modules(modules[waiting.pop()]) & modules.keys() - reached:
            reached.add(name)
            waiting.append(name)
    assert modules.keys() - reached == set()


@pytest.mark.slow
def test_train_py_starts_without_importing_zero_which_only_a_zero1_run_needs():
    # Importing torch.distributed.optim pulls in FSDP and DTensor: seconds on each launch of train.py.
    probe = "import sys, train; print('torch.distributed.optim' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                              check=True)
    assert imported.stdout.strip() == "False"


def import_graph(level) -> dict[str, set[str]]:
    """Which of the product's modules import which, at their top or inside a function, each named by ``level``
    (its package, or the module itself)."""
    modules = product_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                # `from mars import reference` imports the module mars.reference (mars's __init__ is already running
                # when one of its modules does this); `from mars import MARS` imports mars's __init__.
                submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                imported.update(submodules or {node.module})
        targets = {level(module) for module in imported if module in modules}
        graph.setdefault(level(name), set()).update(targets - {level(name)})
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle of ``graph`` (each found once, from its first node in a depth-first walk)."""
    found, done = [], set()

    def walk(node, path):
        for target in sorted(graph.get(node, ())):
            if target in path:
                found.append(path[path.index(target):] + [target])
            elif target not in done:
                walk(target, path + [target])
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            walk(node, [node])
    return found


def package_of(module: str) -> str:
    return module.split(".")[0]


def test_the_packages_import_one_way_without_a_circle():
    # configs/schema.py once imported the optimizer rows inside a function, which import the schema.
    assert circles(import_graph(package_of)) == []
    assert circles(import_graph(lambda module: module)) == []


def test_the_circle_check_finds_a_circle():
    assert circles({"configs": {"training"}, "training": {"configs", "mars"}, "mars": set()}) == [
        ["configs", "training", "configs"]]


def optimizer_names() -> set[str]:
    """What names an optimizer: its config file (configs/optimizer/), and the classes of mars/ (AST, no torch)."""
    files = {path.stem for path in (REPO / "configs" / "optimizer").glob("*.yaml")}
    classes = {node.name for path in (REPO / "mars").glob("*.py") for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.ClassDef) and not node.name.startswith("_")}
    return files | classes


def optimizer_lists(source: str, names: set[str]) -> list[str]:
    """The module-level list, tuple, set or dict displays of ``source`` that name three optimizers or more (as a
    string or a class): a hand-kept list that the next optimizer would have to join."""
    found = []
    for node in ast.parse(source).body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or not isinstance(
                node.value, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
            continue
        named = {sub.value if isinstance(sub, ast.Constant) else sub.id for sub in ast.walk(node.value)
                 if isinstance(sub, ast.Constant) and sub.value in names or isinstance(sub, ast.Name) and sub.id in names}
        if len(named) >= 3:
            found.append(f"line {node.lineno}: {', '.join(sorted(named))}")
    return found


# Files whose lists name optimizers for another reason than running each: the authors' trainers as recorded, the
# state dicts earlier versions saved.
NOT_OPTIMIZER_LISTS = {"tests/configs/authors_runs.py", "tests/mars/saved_state_dicts.py"}


def test_the_tests_keep_no_list_of_the_optimizers():
    # The shared tests take every optimizer from mars/, configs/registry.py or configs/optimizer/: a list kept by
    # hand (tests/mars/test_step_plan.py, test_ns_batch.py and test_cuda_graph.py had one) leaves the next optimizer
    # untested there.
    names = optimizer_names()
    lists = {f"{path.relative_to(REPO)} {found}" for path in (REPO / "tests").rglob("*.py")
             if str(path.relative_to(REPO)) not in NOT_OPTIMIZER_LISTS
             for found in optimizer_lists(path.read_text(), names)}
    assert lists == set()


def test_the_optimizer_list_check_finds_a_list():
    source = 'CASES = {"muon": lambda p: Muon(p), "mars": lambda p: MARS(p)}\nONE = ["adamw"]\n'
    assert optimizer_lists(source, {"Muon", "MARS", "muon", "adamw"}) == ["line 1: MARS, Muon, muon"]

"""``import mars`` as a drop-in package: what it exports, and how it answers a name it does not define."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Triton hidden from the import system: ``import triton`` fails as where it is not installed.
WITHOUT_TRITON = """
import importlib.abc, sys
class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoTriton())
"""

PROBE = WITHOUT_TRITON + """
import unittest, warnings
import mars
assert not hasattr(mars, "not_an_optimizer")
from mars import torch_backend  # a submodule: the import system asks the package first
assert torch_backend.__name__ == "mars.torch_backend"
class Case(unittest.TestCase):
    def runTest(self):
        with self.assertWarns(UserWarning):  # walks every module's __warningregistry__, mars's too
            warnings.warn("probe")
result = unittest.TextTestRunner(stream=open("/dev/null", "w")).run(Case())
assert result.wasSuccessful(), result.errors
try:
    mars.NotAnOptimizer
except AttributeError as error:
    print(error)
"""


def test_a_name_mars_lacks_is_an_attribute_error_where_triton_cannot_be_imported():
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    message = result.stdout.strip()
    assert message.startswith("module 'mars' has no attribute 'NotAnOptimizer'"), message
    assert "mars.triton_backend" in message and "pip install triton" in message  # which module was not searched

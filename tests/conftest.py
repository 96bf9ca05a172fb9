"""Run Triton kernels under the interpreter on machines without a CUDA device.

Triton reads TRITON_INTERPRET when a kernel is defined, i.e. when the module defining it is imported, so it is
set here, before any test module imports one. With a CUDA device the kernels compile and run on the GPU.
"""
import fcntl
import gc
import os

# The tests' models are tiny: one thread trains them faster than several and uses less CPU, which leaves the
# other cores to pytest-xdist's other workers. Set before torch is imported, so this process and every subprocess
# use it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# inductor's caches do not key their C++ on the kernels ATEN_CPU_CAPABILITY selects: code generated with vector
# intrinsics under one capability fails to compile against another's headers (`at::vec` has not been declared).
# A cache per capability keeps the suite's runs under each (README, Tests) apart.
if os.environ.get("ATEN_CPU_CAPABILITY") and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import getpass
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{os.environ['ATEN_CPU_CAPABILITY']}")

import torch  # noqa: E402

gc.freeze()  # torch's objects live as long as the worker: frozen, no collection walks them again

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest


@pytest.fixture(scope="session", autouse=True)
def embedded_corpus_cache(tmp_path_factory, worker_id):
    """Build the embedded corpus once per session in a fresh directory, for in-process and subprocess runs: one
    directory for all pytest-xdist workers (tokenizing takes seconds), built by the first under a lock."""
    session_dir = tmp_path_factory.getbasetemp()
    if worker_id != "master":  # each worker's base is a folder of the session's
        session_dir = session_dir.parent
    cache = session_dir / "data_cache"
    os.environ["MARS_DATA_CACHE"] = str(cache)
    from data.embedded import prepare_embedded

    with open(session_dir / "data_cache.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return prepare_embedded()


def pytest_collection_modifyitems(items):
    """Slow tests first (in their order): the long runs start early and short tests are left to even out when the
    pytest-xdist workers finish."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_finish(session):
    """What collection imported and built (torch, the test modules, the items) lives as long as the worker: frozen,
    it is no longer walked by each full collection of the tests' garbage (6 of a fast-tier worker's 7 s in the
    collector, measured)."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config):
    """Unfrozen for the worker's exit, so that its shutdown frees them: nanobind (Triton's bindings) reports on
    stderr, as leaked, every object of its types still alive at exit."""
    gc.unfreeze()

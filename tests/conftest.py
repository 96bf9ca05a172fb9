"""Run Triton kernels under the interpreter on machines without a CUDA device.

Triton reads TRITON_INTERPRET when a kernel is defined, i.e. when the module defining it is imported, so it is
set here, before any test module imports one. With a CUDA device the kernels compile and run on the GPU.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest


@pytest.fixture(scope="session", autouse=True)
def embedded_corpus_cache(tmp_path_factory):
    """Build the embedded corpus once per session in a fresh directory, for in-process and subprocess runs."""
    os.environ["MARS_DATA_CACHE"] = str(tmp_path_factory.mktemp("data_cache"))
    from data.embedded import prepare_embedded

    return prepare_embedded()

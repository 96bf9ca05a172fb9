"""Every fast path steps without reading a tensor's value on the host: on a GPU each such read (a Python branch on
a norm, ``.item()``) makes the step wait for the device, once per read."""
import inspect

import pytest
import torch

from mars import MARS, available_backends, reference
from mars.optimizer import LookaheadGradient, as_float
from tests.mars.test_torch_conventions import optimizers_of_mars

HOST_READS = ("__bool__", "item", "tolist", "__float__", "__int__")
SHAPES = [(12, 4), (4, 12), (8, 8), (6,)]


def fast_paths(cls) -> list[dict]:
    """The default path of ``cls`` with float32 Newton-Schulz (bfloat16 products are slow on CPUs), each of its
    variants (MARS's ``mars_type``) and its exact scheme (``is_approx=False``) where it has them."""
    default = dict(ns_dtype=torch.float32) if "ns_dtype" in inspect.signature(cls).parameters else {}
    paths = [default]
    if "mars_type" in inspect.signature(cls).parameters:
        paths = [dict(default, mars_type=mars_type) for mars_type in reference.MARS_TYPES]
    if issubclass(cls, LookaheadGradient):
        paths.append(dict(default, is_approx=False))
    return paths


OPTIMIZERS = {"-".join([cls.__name__, *map(str, options.values())]): (cls, options)
              for cls in optimizers_of_mars() for options in fast_paths(cls)}


def refuse_host_reads(monkeypatch):
    def host_read(*args, **kwargs):
        raise AssertionError("a tensor was read on the host")
    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, host_read)


@pytest.mark.triton_interpreter
@pytest.mark.skipif("triton" not in available_backends("cpu"), reason="needs triton and TRITON_INTERPRET=1")
@pytest.mark.parametrize("mars_type", ["mars-adamw", "mars-lion"])
def test_a_triton_step_reads_no_tensor_on_the_host(monkeypatch, mars_type):
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in SHAPES]
    optimizer = MARS(params, backend="triton", mars_type=mars_type, optimize_1d=True)
    grads = [[torch.randn(param.shape) * 10 for param in params] for _ in range(2)]
    refuse_host_reads(monkeypatch)
    for step_grads in grads:  # the first step also checks its inputs; the second runs on the checked state
        for param, grad in zip(params, step_grads):
            param.grad = grad
        optimizer.step()


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_step_reads_no_tensor_on_the_host(monkeypatch, name):
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in SHAPES]
    cls, options = OPTIMIZERS[name]
    optimizer = cls(params, **options)
    grads = [[torch.randn(param.shape) * 10 for param in params] for _ in range(2)]  # c_t clipped: where a
    refuse_host_reads(monkeypatch)  # reference branches on its norm
    for step_grads in grads:  # the first step creates the state; the second runs on it
        for param, grad in zip(params, step_grads):
            param.grad = grad
        if getattr(optimizer, "needs_lookahead_grad", False):
            optimizer.stash_lookahead_grad()
        optimizer.step()


def test_the_check_catches_a_read():
    # An eager step reads a tensor lr on the host once (mars.optimizer.as_float): under the check, it fails.
    with pytest.MonkeyPatch.context() as monkeypatch:
        refuse_host_reads(monkeypatch)
        with pytest.raises(AssertionError, match="read on the host"):
            as_float(torch.tensor(1e-3))

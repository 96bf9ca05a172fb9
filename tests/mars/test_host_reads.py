"""Every fast path steps without reading a tensor's value on the host: on a GPU each such read (a Python branch on
a norm, ``.item()``) makes the step wait for the device, once per read."""
import pytest
import torch

from mars import MARS, MarsM, MarsMEfficient, Moonlight, Muon, available_backends, reference

HOST_READS = ("__bool__", "item", "tolist", "__float__", "__int__")
SHAPES = [(12, 4), (4, 12), (8, 8), (6,)]

OPTIMIZERS = {
    "mars-adamw": lambda params: MARS(params, backend="torch"),
    "mars-adamw exact": lambda params: MARS(params, backend="torch", is_approx=False),
    "mars-lion": lambda params: MARS(params, backend="torch", mars_type="mars-lion"),
    "mars-shampoo": lambda params: MARS(params, backend="torch", mars_type="mars-shampoo", ns_dtype=torch.float32),
    "muon": lambda params: Muon(params, ns_dtype=torch.float32),
    "mars-m": lambda params: MarsM(params, ns_dtype=torch.float32),
    "mars-m exact": lambda params: MarsM(params, ns_dtype=torch.float32, is_approx=False),
    "mars-m efficient": lambda params: MarsMEfficient(params, ns_dtype=torch.float32),
    "moonlight": lambda params: Moonlight(params, ns_dtype=torch.float32),
}


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
    optimizer = OPTIMIZERS[name](params)
    grads = [[torch.randn(param.shape) * 10 for param in params] for _ in range(2)]  # c_t clipped: where a
    refuse_host_reads(monkeypatch)  # reference branches on its norm
    for step_grads in grads:  # the first step creates the state; the second runs on it
        for param, grad in zip(params, step_grads):
            param.grad = grad
        if getattr(optimizer, "needs_lookahead_grad", False):
            optimizer.stash_lookahead_grad()
        optimizer.step()


def test_the_check_catches_a_read():
    # The reference's clip branches on the norm: under the check, it fails.
    with pytest.MonkeyPatch.context() as monkeypatch:
        refuse_host_reads(monkeypatch)
        with pytest.raises(AssertionError, match="read on the host"):
            reference.corrected_gradient(torch.randn(12, 4) * 10, torch.zeros(12, 4), 0.025, 0.95)

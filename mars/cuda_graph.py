"""A function of a list of tensors run as one CUDA graph: launched once per call instead of kernel by kernel.

Newton-Schulz on GPT-2's 50 matrices is some 2,000 small kernels per step (about 45 per matrix). Launched one by
one from Python, their launches cost more than their work; replayed as one graph, they are one launch. On an H200
(2026-11-27, results/gpu_h200_2026-11-27/bench_newton_schulz_cuda.md) the graph took the authors' order one matrix
at a time from 38.2 to 17.9 ms a step, against a 3.9 ms compute floor.
"""
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import Tensor

WARMUP_CALLS = 2  # before a capture, on a side stream, as torch.cuda.graphs asks (lazy cuBLAS set-up and the like)


class CapturedLists:
    """``fn(inputs) -> outputs`` (lists of tensors) captured into a CUDA graph on the first call and replayed on
    later ones; captured afresh when the inputs' shapes, strides, dtypes or device, or ``key`` (whatever else ``fn``
    depends on) change (strides: a matrix product of a transposed layout may round differently).

    The graph reads copies of the inputs (its static inputs, refreshed on every call) and writes the same output
    tensors on every replay: a call's outputs are valid until the next call, which overwrites them. The kernels
    are those ``fn`` launches eagerly, in the same order, so the results are the same. ``fn`` must not synchronise
    with the host (no ``.item()``, no data-dependent shapes), as any captured function.
    """

    def __init__(self) -> None:
        self.signature: Hashable | None = None
        self.captures = 0
        self._fn: Callable[[list[Tensor]], list[Tensor]] | None = None
        self._graph: torch.cuda.CUDAGraph | None = None
        self._static_inputs: list[Tensor] = []
        self._outputs: list[Tensor] = []

    def __call__(self, fn: Callable[[list[Tensor]], list[Tensor]], inputs: list[Tensor],
                 key: Hashable = (), input_dtype: torch.dtype | None = None) -> list[Tensor]:
        """``fn(inputs)``; with ``input_dtype`` the graph's copies of the inputs are held in that dtype (rounded
        as ``.to(input_dtype)`` rounds), for an ``fn`` whose first step is that cast: half the memory and traffic
        of float32 copies for bfloat16 work."""
        signature = (key, input_dtype, tuple((t.shape, t.stride(), t.dtype, t.device) for t in inputs))
        if signature != self.signature:
            self.release()  # the old graph's memory pool goes before the new one is taken
            self._static_inputs = [t.to(input_dtype or t.dtype, copy=True, memory_format=torch.preserve_format)
                                   for t in inputs]
            self._fn = fn
            try:
                self._outputs = self._capture(fn, self._static_inputs)
            except RuntimeError as error:
                self.release()
                raise RuntimeError(f"capturing Newton-Schulz into a CUDA graph failed: {error}; set "
                                   "optimizer.ns_cuda_graph=false to run it kernel by kernel") from error
            self.signature = signature
            self.captures += 1
        torch._foreach_copy_(self._static_inputs, inputs)  # casts to input_dtype on the way
        self._replay()
        return list(self._outputs)

    def release(self) -> None:
        """Drop the graph and its buffers (the next call captures again)."""
        self.signature, self._fn, self._graph = None, None, None
        self._static_inputs, self._outputs = [], []

    @staticmethod
    def check_devices(tensors: list[Tensor]) -> None:
        """Raise a ValueError unless ``tensors`` are on one CUDA device, as one graph needs."""
        devices = {t.device for t in tensors}
        if any(device.type != "cuda" for device in devices) or len(devices) > 1:
            raise ValueError(f"a CUDA graph needs tensors on one CUDA device, got {sorted(map(str, devices))}: "
                             "set optimizer.ns_cuda_graph=false to run Newton-Schulz kernel by kernel")

    def _capture(self, fn: Callable[[list[Tensor]], list[Tensor]], static_inputs: list[Tensor]) -> list[Tensor]:
        self.check_devices(static_inputs)
        with torch.cuda.device(static_inputs[0].device):  # the tensors' device, whichever is current
            side_stream = torch.cuda.Stream()
            side_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side_stream):
                for _ in range(WARMUP_CALLS):
                    fn(static_inputs)
            torch.cuda.current_stream().wait_stream(side_stream)
            self._graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA work (a data loader's copies) does not invalidate the capture.
            with torch.cuda.graph(self._graph, capture_error_mode="thread_local"):
                return fn(static_inputs)

    def _replay(self) -> None:
        self._graph.replay()


class CudaGraphedNewtonSchulz:
    """The options of how the optimizers that run Newton-Schulz run it, mixed into a
    :class:`mars.optimizer.DispatchingOptimizer`: ``ns_cuda_graph``, one :class:`CapturedLists` per param group for
    Newton-Schulz, and ``ns_batch``, the matrices of one shape stacked into one batch
    (:func:`mars.newton_schulz.orthogonalise`'s ``batch``). Neither changes what is saved.

    The graphs are never saved, copied or pickled (``torch.optim.Optimizer.__getstate__`` leaves them out).
    """

    def __init__(self, params, defaults: dict[str, Any], *, ns_cuda_graph: bool, ns_batch: bool, **options: Any):
        for name, value in (("ns_cuda_graph", ns_cuda_graph), ("ns_batch", ns_batch)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r}")
        super().__init__(params, defaults, ns_cuda_graph=ns_cuda_graph, ns_batch=ns_batch, **options)
        if ns_cuda_graph:
            for group in self.param_groups:
                CapturedLists.check_devices(group["params"])

    def _newton_schulz_graph(self, group: dict[str, Any]) -> CapturedLists | None:
        """The captured Newton-Schulz of ``group`` (by its place in ``param_groups``), or None without
        ``ns_cuda_graph``."""
        if not self.ns_cuda_graph:
            return None
        group_index = next(index for index, each in enumerate(self.param_groups) if each is group)
        graphs = self.__dict__.setdefault("_newton_schulz_graphs", {})
        return graphs.setdefault(group_index, CapturedLists())

"""The optimizers hold their process group weakly: torch.distributed, not the optimizer, decides its lifetime."""
import copy
import gc
import weakref

import pytest
import torch
import torch.distributed as dist
# Imported before any group exists, as training.distributed does: torch.distributed.nn binds the group alive at
# its import as a default argument, and the first optimizer construction imports it (through torch._dynamo).
import torch.distributed.nn  # noqa: F401

from mars import MARS
from mars.muon import Muon


def new_optimizer(kind, group):
    params = [torch.nn.Parameter(torch.randn(4, 3))]
    if kind == "mars-shampoo":
        return MARS(params, mars_type="mars-shampoo", backend="torch", process_group=group)
    return Muon(params, process_group=group)


@pytest.fixture
def start_group(tmp_path):
    """Starts a real one-process Gloo group (pytest's fixture cache would keep a yielded group alive), torn
    down after the test if it is still up."""

    def start():
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        return dist.group.WORLD

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["mars-shampoo", "muon"])
def test_optimizer_gives_back_the_group_and_says_so_when_it_is_read_after_destruction(kind, start_group):
    group = start_group()
    optimizer = new_optimizer(kind, group)
    assert optimizer.process_group is group
    watcher = weakref.ref(group)
    del group
    dist.destroy_process_group()
    gc.collect()
    assert watcher() is None, "the optimizer kept the destroyed group alive"
    with pytest.raises(RuntimeError, match="process group of this .* was destroyed"):
        optimizer.process_group


@pytest.mark.parametrize("kind", ["mars-shampoo", "muon"])
def test_optimizer_steps_alone_when_its_group_is_set_to_none(kind, start_group):
    optimizer = new_optimizer(kind, start_group())
    optimizer.process_group = None
    assert optimizer.process_group is None
    optimizer.param_groups[0]["params"][0].grad = torch.ones(4, 3)
    optimizer.step()


@pytest.mark.parametrize("kind", ["mars-shampoo", "muon"])
def test_process_group_that_is_not_a_group_is_refused(kind):
    with pytest.raises(TypeError, match="process_group must be a torch.distributed.ProcessGroup"):
        new_optimizer(kind, "gloo")


@pytest.mark.parametrize("kind", ["mars-shampoo", "muon"])
def test_a_copy_of_the_optimizer_steps_alone(kind, start_group):
    """Optimizer.__getstate__ leaves instance attributes out: a copy must not hold a reference to the group."""
    copied = copy.deepcopy(new_optimizer(kind, start_group()))
    assert copied.process_group is None

"""mars.newton_schulz.orthogonalise with its work shared out across DDP ranks, the ranks simulated in one process."""
import pytest
import torch
import torch.distributed as dist

from mars.newton_schulz import orthogonalise

SHAPES = [(12, 4), (12, 4), (4, 12), (8, 8), (16, 8), (3, 5)]


def orthogonalise_on_ranks(monkeypatch, matrices, world_size, **kwargs):
    """What each of ``world_size`` simulated ranks returns, and the buffer each of them all-reduces.

    Every rank runs once with an all-reduce that only records its buffer (its own results, zeros elsewhere),
    then again with one that hands it the sum of all the recorded buffers, as Gloo's or NCCL's would.
    """
    current = {"rank": 0, "sum": None}
    buffers = []

    def all_reduce(flat, group=None):
        if current["sum"] is None:
            buffers.append(flat.clone())
        else:
            flat.copy_(current["sum"])

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: world_size)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: current["rank"])
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    group = object()  # stands for a process group: only handed to the patched calls above

    def run_every_rank():
        results = []
        for rank in range(world_size):
            current["rank"] = rank
            results.append(orthogonalise(matrices, process_group=group, **kwargs))
        return results

    run_every_rank()
    current["sum"] = torch.stack(buffers).sum(0)
    return run_every_rank(), buffers


@pytest.mark.parametrize("out_dtype, norm_in_dtype", [(torch.bfloat16, True), (torch.float32, False)])
def test_two_ranks_sharing_the_work_return_bit_for_bit_what_one_process_does(monkeypatch, out_dtype,
                                                                             norm_in_dtype):
    # bfloat16 with its own norm: the MARS authors' Muon; float32: MARS-Shampoo, and Muon's float32 option.
    torch.manual_seed(0)
    matrices = [torch.randn(shape) for shape in SHAPES]
    options = dict(dtype=torch.bfloat16, norm_in_dtype=norm_in_dtype, out_dtype=out_dtype)
    alone = orthogonalise(matrices, **options)
    ranks, buffers = orthogonalise_on_ranks(monkeypatch, matrices, 2, **options)
    assert [buffer.dtype for buffer in buffers] == [out_dtype, out_dtype]  # bfloat16: half the bytes sent
    assert all(buffer.count_nonzero() > 0 for buffer in buffers)  # both ranks did a share
    assert not ((buffers[0] != 0) & (buffers[1] != 0)).any()
    for results in ranks:
        assert [result.dtype for result in results] == [out_dtype] * len(SHAPES)
        for result, expected in zip(results, alone):
            torch.testing.assert_close(result, expected, rtol=0, atol=0)


def test_out_dtype_bfloat16_rounds_the_results_of_float32_newton_schulz():
    torch.manual_seed(1)
    matrices = [torch.randn(shape) for shape in SHAPES]
    float32 = orthogonalise(matrices, dtype=torch.float32)
    rounded = orthogonalise(matrices, dtype=torch.float32, out_dtype=torch.bfloat16)
    for exact, result in zip(float32, rounded):
        assert result.dtype == torch.bfloat16
        torch.testing.assert_close(result, exact.bfloat16(), rtol=0, atol=0)


def test_norm_in_dtype_changes_bfloat16_newton_schulz_and_not_float32():
    # The authors' Muon normalises the bfloat16 copy by its own bfloat16 norm, their MARS-Shampoo by the float32
    # norm: one rounding of the norm, which the bfloat16 iteration amplifies until most elements differ.
    torch.manual_seed(2)
    matrix = torch.randn(12, 4)
    own_norm, float32_norm = (orthogonalise([matrix], norm_in_dtype=flag)[0] for flag in (True, False))
    assert (own_norm != float32_norm).float().mean() > 0.5
    own_norm, float32_norm = (orthogonalise([matrix], dtype=torch.float32, norm_in_dtype=flag)[0]
                              for flag in (True, False))
    torch.testing.assert_close(own_norm, float32_norm, rtol=0, atol=0)


def test_gram_first_is_the_mars_m_authors_form_matrix_by_matrix_and_needs_the_norm_in_dtype():
    from mars import reference

    torch.manual_seed(5)
    matrices = [torch.randn(shape) for shape in SHAPES]
    results = orthogonalise(matrices, dtype=torch.bfloat16, norm_in_dtype=True, gram_first=True)
    for matrix, result in zip(matrices, results):
        expected = reference.newton_schulz5_gram_polynomial(matrix, dtype=torch.bfloat16, eps=1e-7).float()
        torch.testing.assert_close(result, expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="gram_first=True normalises in dtype"):
        orthogonalise(matrices, gram_first=True)

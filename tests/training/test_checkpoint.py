import logging

import pytest
import torch

from training.checkpoint import (CheckpointReadError, CorruptCheckpoint, checkpoint_dir, checkpoint_files,
                                 latest_checkpoint, load_checkpoint, save_checkpoint, set_aside_checkpoints_after)

CPU = torch.device("cpu")


def test_latest_checkpoint_round_trips_and_old_ones_are_pruned(tmp_path):
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, {"step": step, "w": torch.full((3,), float(step))}, keep=2)
    assert sorted(p.name for p in checkpoint_dir(tmp_path).iterdir()) == ["ckpt_00000020.pt", "ckpt_00000030.pt"]
    path, state = latest_checkpoint(tmp_path, CPU)
    assert path.name == "ckpt_00000030.pt" and state["step"] == 30
    assert torch.equal(state["w"], torch.full((3,), 30.0))


def test_crash_during_save_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 10, {"step": 10}, keep=2)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(torch, "save", crash)
    try:
        save_checkpoint(tmp_path, 20, {"step": 20}, keep=2)
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    path, state = latest_checkpoint(tmp_path, CPU)
    assert state["step"] == 10 and path.name == "ckpt_00000010.pt"


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    save_checkpoint(tmp_path, 10, {"step": 10}, keep=3)
    (checkpoint_dir(tmp_path) / "ckpt_00000020.pt").write_bytes(b"torn write")
    _, state = latest_checkpoint(tmp_path, CPU)
    assert state["step"] == 10


def test_no_checkpoint_gives_none(tmp_path):
    assert latest_checkpoint(tmp_path, CPU) is None


def test_a_users_copy_named_like_a_checkpoint_is_neither_pruned_nor_resumed_and_prunes_nothing_new(tmp_path):
    save_checkpoint(tmp_path, 10, {"step": 10}, keep=1)
    best = checkpoint_dir(tmp_path) / "ckpt_best.pt"
    best.write_bytes((checkpoint_dir(tmp_path) / "ckpt_00000010.pt").read_bytes())
    save_checkpoint(tmp_path, 20, {"step": 20}, keep=1)
    assert sorted(p.name for p in checkpoint_dir(tmp_path).iterdir()) == ["ckpt_00000020.pt", "ckpt_best.pt"]
    path, state = latest_checkpoint(tmp_path, CPU)
    assert path.name == "ckpt_00000020.pt" and state["step"] == 20
    assert set_aside_checkpoints_after(tmp_path, 20) == [] and best.is_file()


def test_checkpoints_are_ordered_by_step_past_eight_digits(tmp_path):
    for step in (99_999_999, 100_000_000):
        save_checkpoint(tmp_path, step, {"step": step}, keep=1)
    assert [p.name for p in checkpoint_files(tmp_path)] == ["ckpt_100000000.pt"]
    assert latest_checkpoint(tmp_path, CPU)[1]["step"] == 100_000_000


def flip_a_bit_of(path, tensor: torch.Tensor) -> None:
    """Flip one bit inside ``tensor``'s bytes in the checkpoint file, as a disk or a copy might."""
    data = bytearray(path.read_bytes())
    at = data.find(tensor.numpy().tobytes())
    assert at >= 0
    data[at + 101] ^= 0x04
    path.write_bytes(bytes(data))


def test_a_bit_flipped_in_a_tensor_is_caught_and_the_previous_checkpoint_resumed(tmp_path, caplog):
    weights = torch.arange(1000, dtype=torch.float32)
    for step in (10, 20):
        save_checkpoint(tmp_path, step, {"step": step, "w": weights + step}, keep=2)
    newest = checkpoint_dir(tmp_path) / "ckpt_00000020.pt"
    flip_a_bit_of(newest, weights + 20)
    with pytest.raises(CorruptCheckpoint, match=r"ckpt_00000020\.pt: its record .*/data/0 does not match the checksum"):
        load_checkpoint(newest, CPU)
    with caplog.at_level(logging.WARNING):
        path, state = latest_checkpoint(tmp_path, CPU)
    assert path.name == "ckpt_00000010.pt" and torch.equal(state["w"], weights + 10)
    assert "ckpt_00000020.pt" in caplog.text and "checksum" in caplog.text


def test_a_file_that_is_no_checkpoint_is_corrupt_and_names_itself(tmp_path):
    foreign = tmp_path / "notes.pt"
    foreign.write_text("not a checkpoint\n")
    with pytest.raises(CorruptCheckpoint, match=r"notes\.pt is not a checkpoint written by train\.py"):
        load_checkpoint(foreign, CPU)


def test_a_read_error_stops_the_resume_instead_of_skipping_a_checkpoint_that_may_be_fine(tmp_path, monkeypatch):
    for step in (10, 20):
        save_checkpoint(tmp_path, step, {"step": step}, keep=2)

    def input_output_error(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(torch, "load", input_output_error)
    with pytest.raises(CheckpointReadError, match=r"could not read .*ckpt_00000020\.pt .*Input/output error.*nothing "
                                                  r"was resumed or set aside"):
        latest_checkpoint(tmp_path, CPU)
    assert [p.name for p in checkpoint_files(tmp_path)] == ["ckpt_00000010.pt", "ckpt_00000020.pt"]

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(torch, "load", out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):  # the file may be fine: not skipped as unreadable
        latest_checkpoint(tmp_path, CPU)

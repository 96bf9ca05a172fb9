import torch

from training.checkpoint import (checkpoint_dir, checkpoint_files, latest_checkpoint, save_checkpoint,
                                 set_aside_checkpoints_after)

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

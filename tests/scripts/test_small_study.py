"""scripts.small_study: every run it would launch is a valid train.py config with the budget it claims."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from configs.compose import register_configs, validate
from scripts import small_study

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")
register_configs()


def compose_run(args):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="config", overrides=args)


@pytest.mark.parametrize("optimizer", small_study.OPTIMIZERS, ids=lambda o: o.name)
def test_every_sweep_point_validates_and_trains_the_common_budget(optimizer):
    for lr in optimizer.lrs:
        for args in (small_study.overrides(optimizer, lr), small_study.overrides(optimizer, lr, seed=1),
                     small_study.overrides(optimizer, lr, gamma=0.01) if optimizer.name.startswith("mars") else []):
            if not args:
                continue
            cfg = compose_run(args)
            validate(cfg)
            t = cfg.train
            assert (t.max_iters, t.batch_size, t.block_size, t.grad_accum_steps) == (small_study.STEPS, 8, 128, 1)
            assert cfg.optimizer.lr == lr and t.min_lr < lr


def test_run_names_are_unique_across_phases(tmp_path):
    names = list(small_study.phase_jobs("lr", tmp_path))
    names += [small_study.run_name(o, o.lrs[0], seed) for o in small_study.OPTIMIZERS for seed in small_study.SEEDS]
    mars = small_study.OPTIMIZERS[1]
    names += [small_study.run_name(mars, mars.lrs[0], gamma=g) for g in small_study.GAMMAS]
    names += [small_study.run_name(mars, mars.lrs[0], seed, g) for g in small_study.GAMMAS for seed in small_study.SEEDS]
    assert len(names) == len(set(names))


def test_a_later_phase_before_the_lr_sweep_says_to_run_it_first(tmp_path):
    with pytest.raises(RuntimeError, match="run it first"):
        small_study.phase_jobs("seeds", tmp_path)


def finished_run(make_run, out, optimizer, lr, best_val_loss):
    """A finished lr-sweep run in train.py's format: evaluated at step 0 and at the study's last step."""
    make_run(out / small_study.run_name(optimizer, lr), small_study.overrides(optimizer, lr),
              [10.8, best_val_loss], tokens_per_step=8 * 128)


@pytest.mark.slow
def test_the_sweep_extends_past_the_edge_that_holds_the_best_lr(tmp_path, make_run):
    adamw = small_study.OPTIMIZERS[0]
    for o in small_study.OPTIMIZERS:
        for lr, loss in zip(o.lrs, (6.0, 6.5, 7.0) if o is adamw else (6.5, 6.0, 6.5)):
            finished_run(make_run, tmp_path, o, lr, loss)
    assert list(small_study.extension_jobs(tmp_path)) == ["adamw_lr0.0003"]
    finished_run(make_run, tmp_path, adamw, 3e-4, 5.9)  # better still, but the limit of one extension is reached
    assert small_study.MAX_EXTENSIONS == 1 and small_study.extension_jobs(tmp_path) == {}
    assert small_study.best_lr(adamw, tmp_path) == 3e-4


@pytest.mark.slow
def test_every_run_has_the_presets_treatment_and_its_second_lr_follows_the_swept_one():
    by_name = {o.name: o for o in small_study.OPTIMIZERS}
    for name, key, ratio in (("mars-approx", "lr_1d", 0.5), ("mars-exact", "lr_1d", 0.5), ("muon", "adamw_lr", 0.15)):
        for lr in by_name[name].lrs:
            cfg = compose_run(small_study.overrides(by_name[name], lr))
            assert cfg.optimizer[key] == pytest.approx(ratio * lr)
    for o in small_study.OPTIMIZERS:
        cfg = compose_run(small_study.overrides(o, o.lrs[0]))
        assert (cfg.model.activation, cfg.model.scale_attn_by_inverse_layer_idx) == ("gelu_tanh", True)
        assert (cfg.train.min_lr, cfg.train.grad_multiplier) == (3e-5, 4)
        assert o.name == "muon" or cfg.optimizer.decay_embeddings is False


@pytest.mark.slow
def test_the_gamma_phase_runs_every_gamma_with_every_seed_at_the_best_lr(tmp_path, make_run):
    for o in small_study.OPTIMIZERS:
        for lr, loss in zip(o.lrs, (6.5, 6.0, 6.5)):
            finished_run(make_run, tmp_path, o, lr, loss)
    mars = small_study.OPTIMIZERS[1]
    best = mars.lrs[1]
    jobs = small_study.phase_jobs("gamma", tmp_path)
    expected = {(g, seed) for g in small_study.GAMMAS for seed in (1337, *small_study.SEEDS)}
    ran = set()
    for args in jobs.values():
        cfg = compose_run(args)
        assert cfg.optimizer.mars_type == "mars-adamw" and cfg.optimizer.is_approx and cfg.optimizer.lr == best
        ran.add((cfg.optimizer.gamma, cfg.train.seed))
    assert ran == expected and len(jobs) == len(expected)


@pytest.mark.slow
def test_contenders_are_the_lrs_within_the_margin_of_the_best_each_with_the_extra_seeds(tmp_path, make_run):
    adamw = small_study.OPTIMIZERS[0]
    for o in small_study.OPTIMIZERS:
        for lr, loss in zip(o.lrs, (6.0, 6.05, 6.5) if o is adamw else (6.5, 6.0, 6.5)):
            finished_run(make_run, tmp_path, o, lr, loss)
    jobs = small_study.phase_jobs("contenders", tmp_path)
    assert sorted(jobs) == sorted(small_study.run_name(adamw, adamw.lrs[1], seed) for seed in small_study.SEEDS)
    assert small_study.CONTENDER_MARGIN == 0.1
    for args in jobs.values():
        assert compose_run(args).optimizer.lr == adamw.lrs[1]


def test_only_restricts_the_runs_to_the_named_optimizers_in_their_order(tmp_path, capsys):
    small_study.main(["--out", str(tmp_path), "--phases", "lr", "gamma", "--only", "muon", "adamw", "--dry-run"])
    names = [line.split(":")[0].rsplit("/", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert names == ([small_study.run_name(small_study.OPTIMIZERS[-1], lr) for lr in (1e-2, 2e-2, 4e-2)]
                     + [small_study.run_name(small_study.OPTIMIZERS[0], lr) for lr in (1e-3, 3e-3, 1e-2)])

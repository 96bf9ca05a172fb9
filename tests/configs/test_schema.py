import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from configs.compose import register_configs, validate
from configs.schema import ConfigError, lr_decay_end
from tests import warm_python

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = str(REPO / "configs")
register_configs()


def load(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def test_default_config_is_the_tiny_cpu_run_and_validates():
    cfg = load()
    assert (cfg.model.n_layer, cfg.model.n_embd) == (4, 128)
    assert cfg.optimizer.name == "mars" and cfg.optimizer.mars_type == "mars-adamw" and cfg.data.name == "embedded"
    validate(cfg)


@pytest.mark.parametrize("size, layers, width", [("gpt2-small", 12, 768), ("gpt2-medium", 24, 1024),
                                                 ("gpt2-large", 36, 1280), ("gpt2-xl", 48, 1600)])
def test_model_sizes_compose(size, layers, width):
    cfg = load(f"model={size}")
    assert (cfg.model.n_layer, cfg.model.n_embd) == (layers, width)


def test_issue_override_paths_compose():
    cfg = load("model=tiny", "optimizer=adamw", "data=embedded", "train.max_iters=60", "train.eval_interval=30",
               "wandb.mode=disabled")
    assert cfg.train.max_iters == 60 and cfg.train.eval_interval == 30
    validate(cfg)


def test_unknown_key_fails_naming_it():
    with pytest.raises(ConfigCompositionException) as err:
        load("train.max_itres=5")
    assert "max_itres" in str(err.value) + str(err.value.__cause__)


def test_unknown_key_inside_an_optimizer_fails():
    with pytest.raises(ConfigCompositionException):
        load("optimizer.gama=0.1")


def test_wrong_type_fails_naming_the_key():
    with pytest.raises(ConfigCompositionException) as err:
        load("train.batch_size=eight")
    assert "batch_size" in str(err.value) + str(err.value.__cause__)


def test_unknown_group_option_lists_the_available_ones():
    with pytest.raises(Exception) as err:
        load("model=gpt5")
    assert "gpt2-small" in str(err.value)


def test_the_optimizer_schemas_are_no_choice_in_help_nor_on_the_command_line(tmp_path):
    def train(*args):
        return warm_python.run([sys.executable, "train.py", *args], cwd=REPO, timeout=300)

    help_text = train("--help").stdout
    [optimizers] = [line for line in help_text.splitlines() if line.startswith("optimizer: ")]
    files = sorted(path.stem for path in Path(CONFIG_DIR, "optimizer").glob("*.yaml"))
    assert optimizers == f"optimizer: {', '.join(files)}" and "_schema" not in help_text, optimizers
    refused = train("optimizer=adamw_schema", f"hydra.run.dir={tmp_path}")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last == f"error: unknown option optimizer=adamw_schema: the options of optimizer are {', '.join(files)}", last
    assert not any(tmp_path.iterdir())


def test_enum_values_are_checked():
    with pytest.raises(ConfigCompositionException):
        load("wandb.mode=sometimes")


@pytest.mark.parametrize("override, key", [
    ("train.batch_size=0", "train.batch_size"),
    ("train.max_iters=-1", "train.max_iters"),
    ("train.block_size=512", "model.block_size"),
    ("optimizer.lr=0", "optimizer.lr"),
    ("train.min_lr=1.0", "train.min_lr"),
    ("train.grad_clip=-1", "train.grad_clip"),
    ("train.max_skipped_steps=-1", "train.max_skipped_steps"),
    ("train.diverged_val_loss_ratio=0.5", "train.diverged_val_loss_ratio"),
    ("train.loss_chunk_size=-1", "train.loss_chunk_size"),
    ("wandb.init_timeout_s=0", "wandb.init_timeout_s"),
    ("model.n_head=3", "model.n_head"),
])
def test_out_of_range_values_are_rejected_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(load(override))


def test_compile_mode_is_one_of_torch_compiles_and_needs_compile():
    with pytest.raises(ConfigError, match="train.compile_mode must be one of default, reduce-overhead, max-autotune, "
                                          "max-autotune-no-cudagraphs, got 'fast'"):
        validate(load("train.compile=true", "train.compile_mode=fast"))
    with pytest.raises(ConfigError, match="set train.compile=true with it"):
        validate(load("train.compile_mode=max-autotune"))
    validate(load("train.compile=true", "train.compile_mode=max-autotune-no-cudagraphs"))


def test_muon_refuses_a_min_lr_above_its_adamw_part_lr():
    with pytest.raises(ConfigError, match=r"train\.min_lr \(0\.005\) must not exceed optimizer\.adamw_lr"):
        validate(load("optimizer=muon", "train.min_lr=5e-3"))
    validate(load("optimizer=muon", "train.min_lr=3e-3"))


@pytest.mark.parametrize("override, message", [
    ("+optimizer.gama=0.1", r"unknown config key optimizer\.gama: did you mean optimizer\.gamma\?"),
    ("+train.max_iter=5", r"unknown config key train\.max_iter: did you mean train\.max_iters\?"),
    ("+model.n_layers=2", r"unknown config key model\.n_layers: did you mean model\.n_layer\?"),
    ("+wandb.nonsense=1", r"unknown config key wandb\.nonsense: the keys of wandb are mode, project"),
    ("+foo=1", r"unknown config key 'foo': the top-level keys are model, train, data, wandb, optimizer"),
])
def test_added_keys_that_no_schema_knows_are_refused_with_a_suggestion(override, message):
    cfg = load(override)
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_a_muon_key_is_unknown_to_mars():
    with pytest.raises(ConfigError, match=r"unknown config key optimizer\.adamw_lr"):
        validate(load("optimizer=mars-adamw", "+optimizer.adamw_lr=1e-3"))
    validate(load("optimizer=muon", "optimizer.adamw_lr=1e-3"))


def test_the_lr_decay_ends_at_decay_iters_or_else_max_iters_in_a_config_and_in_a_saved_one():
    assert lr_decay_end(load("train.max_iters=100").train) == 100
    assert lr_decay_end(load("train.max_iters=100", "train.decay_iters=80").train) == 80
    assert lr_decay_end({"max_iters": 100, "decay_iters": None}) == 100  # as a checkpoint saves the config
    with pytest.raises(ConfigError, match=r"train\.decay_iters \(100\) <= train\.warmup_iters \(100\)"):
        validate(load("train.max_iters=200", "train.warmup_iters=100", "train.decay_iters=100"))


@pytest.mark.parametrize("override, message", [
    ("model.n_layer=0", r"model\.n_layer must be positive, got 0"),
    ("model.n_head=3", r"model\.n_head \(3\) must divide n_embd \(128\)"),
    ("model.dropout=1.0", r"model\.dropout must be in \[0, 1\), got 1\.0"),
    ("model.activation=relu", r"model\.activation must be one of gelu, gelu_tanh, got 'relu'"),
])
def test_the_schema_refuses_a_model_with_the_models_own_checks(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(load(override))

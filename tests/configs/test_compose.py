"""An unknown key, set on train.py's command line or in a config file of the user's own directory, is one line
naming it (and the file), with the nearest key: before Hydra's advice to append it."""
import pytest

import configs.compose
from configs.compose import UnknownConfigKey, refuse_unknown_config_keys


@pytest.mark.parametrize("override, nearest", [
    ("optimizer.gammma=0.1", "optimizer.gamma"),
    ("model.n_layers=2", "model.n_layer"),
    ("train.max_iter=5", "train.max_iters"),
    ("data.dirr=/tmp", "data.dir"),
    ("wandb.mod=online", "wandb.mode"),
])
def test_a_misspelled_key_of_every_config_group_gets_the_nearest_key_not_hydras_advice_to_append_it(override,
                                                                                                      nearest):
    key = override.split("=")[0]
    with pytest.raises(UnknownConfigKey) as refused:
        refuse_unknown_config_keys([override])
    assert str(refused.value).startswith(f"unknown config key {key}: did you mean {nearest}? ")
    assert "\n" not in str(refused.value)


def test_a_key_unknown_to_one_optimizer_of_a_sweep_is_refused_for_it():
    with pytest.raises(UnknownConfigKey, match=r"^unknown config key optimizer\.gamma: the keys of optimizer are "
                                               r"name, lr, weight_decay"):
        refuse_unknown_config_keys(["-m", "optimizer=mars-adamw,adamw", "optimizer.gamma=0.01,0.05"])


@pytest.mark.parametrize("arguments", [
    [], ["optimizer.gamma=0.1", "train.max_iters=5"], ["-m", "optimizer.lr=1e-3,3e-3", "optimizer=mars-adamw,muon"],
    ["+optimizer.gama=0.1"],  # added on purpose: the schema check refuses it by name (tests/configs/test_schema.py)
    ["optimizer.lr=[1e-3"],  # malformed: Hydra names it
])
def test_known_keys_and_what_hydra_tells_best_pass(arguments):
    refuse_unknown_config_keys(arguments)


@pytest.mark.parametrize("arguments, composes", [
    (["train.max_iters=5", "model.n_layer=2", "data.dir=/tmp", "wandb.mode=disabled", "hydra.run.dir=/tmp/run",
      "optimizer=muon", "+experiment=owt-gpt2-large-20b-adamw"], False),  # known whatever the groups choose
    (["-m", "train.max_iters=5,10"], False),
    (["optimizer.lr=1e-3"], True),  # the optimizer chosen decides
    (["train.max_iter=5"], True),
    (["train.max_iters.deeper=5"], True),
])
def test_the_config_is_composed_only_where_a_key_set_can_be_unknown(monkeypatch, arguments, composes):
    composed = []
    real_compose = configs.compose.compose_config
    monkeypatch.setattr(configs.compose, "compose_config", lambda overrides: composed.append(overrides) or
                        real_compose(overrides))
    try:
        refuse_unknown_config_keys(arguments)
    except UnknownConfigKey:
        assert composes
    assert bool(composed) == composes, composed


@pytest.mark.parametrize("group, content, key, nearest", [
    ("optimizer", "defaults:\n  - adamw\n  - _self_\nlr: 1e-3\nweight_decai: 0.1\n", "optimizer.weight_decai",
     "optimizer.weight_decay"),
    ("optimizer", "defaults:\n  - mars-adamw\n  - _self_\ngama: 0.05\n", "optimizer.gama", "optimizer.gamma"),
    ("model", "defaults:\n  - tiny\n  - _self_\nn_layers: 2\n", "model.n_layers", "model.n_layer"),
    ("data", "defaults:\n  - embedded\n  - _self_\nsampling_: random\n", "data.sampling_", "data.sampling"),
])
@pytest.mark.parametrize("where", ["--config-dir", "hydra.searchpath"])
def test_an_unknown_key_in_the_users_own_config_file_names_the_file_the_key_and_the_nearest_key(
        tmp_path, group, content, key, nearest, where):
    (tmp_path / group).mkdir()
    mine = tmp_path / group / "mine.yaml"
    mine.write_text(content)
    added = [f"hydra.searchpath=[file://{tmp_path}]"] if where == "hydra.searchpath" else [where, str(tmp_path)]
    with pytest.raises(UnknownConfigKey) as refused:
        refuse_unknown_config_keys([*added, f"{group}=mine"])
    assert str(refused.value).startswith(f"unknown config key {key} in {mine}: did you mean {nearest}? ")


def test_an_unknown_train_key_in_the_users_experiment_names_the_file(tmp_path):
    (tmp_path / "experiment").mkdir()
    mine = tmp_path / "experiment" / "mine.yaml"
    mine.write_text("# @package _global_\ndefaults:\n  - override /optimizer: adamw\ntrain:\n  max_iter: 10\n")
    with pytest.raises(UnknownConfigKey) as refused:
        refuse_unknown_config_keys(["--config-dir", str(tmp_path), "experiment=mine"])
    assert str(refused.value).startswith(f"unknown config key train.max_iter in {mine}: did you mean train.max_iters? ")

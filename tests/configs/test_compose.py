"""What Hydra refuses, set on train.py's command line or in a config file of the user's own directory, is one line
naming it (and the file) with the fix: an unknown key with the nearest key, before Hydra's advice to append it; an
unknown option of a group with the nearest option; a value of the wrong type; an unquoted ~; several values
without -m."""
import pytest

import configs.compose
from configs.compose import ConfigRefused, refuse_config_errors
from tests.configs.hydra_refusals import HYDRA_CASES, users_config


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
    with pytest.raises(ConfigRefused) as refused:
        refuse_config_errors([override])
    assert str(refused.value).startswith(f"unknown config key {key}: did you mean {nearest}? ")
    assert "\n" not in str(refused.value)


def test_a_key_unknown_to_one_optimizer_of_a_sweep_is_refused_for_it():
    with pytest.raises(ConfigRefused, match=r"^unknown config key optimizer\.gamma: the keys of optimizer are "
                                               r"name, lr, weight_decay"):
        refuse_config_errors(["-m", "optimizer=mars-adamw,adamw", "optimizer.gamma=0.01,0.05"])


@pytest.mark.parametrize("arguments", [
    [], ["optimizer.gamma=0.1", "train.max_iters=5"], ["-m", "optimizer.lr=1e-3,3e-3", "optimizer=mars-adamw,muon"],
    ["+optimizer.gama=0.1"],  # added on purpose: the schema check refuses it by name (tests/configs/test_schema.py)
    ["optimizer.lr=[1e-3"],  # malformed: Hydra names it
    ["-m", "optimizer=glob(mars*)", "optimizer.lr=1e-3,3e-3"], ["-m", "optimizer.lr=interval(1e-3,1e-2)"],  # Hydra's
])
def test_known_keys_and_what_hydra_tells_best_pass(arguments):
    refuse_config_errors(arguments)


@pytest.mark.parametrize("arguments, composes", [
    (["train.max_iters=5", "model.n_layer=2", "data.dir=/tmp", "wandb.mode=disabled", "hydra.run.dir=/tmp/run",
      "optimizer=muon", "+experiment=owt-gpt2-large-20b-adamw"], False),  # known whatever the groups choose
    (["-m", "train.max_iters=5,10"], False),
    (["train.grad_clip=1", "train.decay_iters=null", "train.lr_schedule=wsd"], False),  # convert to their types
    (["optimizer.lr=1e-3"], True),  # the optimizer chosen decides
    (["train.max_iter=5"], True),
    (["train.max_iters.deeper=5"], True),
    (["train.max_iters=1e3"], True),  # of the wrong type
    (["-m", "train.max_iters=5,1e3"], True),
    (["optimizer=mars-adam"], True),  # no file of configs/optimizer/
    (["hydra/job_logging=disabled"], True),  # Hydra's own option: composes
])
def test_the_config_is_composed_only_where_a_key_or_value_set_can_be_refused(monkeypatch, arguments, composes):
    composed = []
    real_compose = configs.compose.compose_config
    monkeypatch.setattr(configs.compose, "compose_config", lambda overrides: composed.append(overrides) or
                        real_compose(overrides))
    try:
        refuse_config_errors(arguments)
    except ConfigRefused:
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
    with pytest.raises(ConfigRefused) as refused:
        refuse_config_errors([*added, f"{group}=mine"])
    assert str(refused.value).startswith(f"unknown config key {key} in {mine}: did you mean {nearest}? ")


def test_an_unknown_train_key_in_the_users_experiment_names_the_file(tmp_path):
    (tmp_path / "experiment").mkdir()
    mine = tmp_path / "experiment" / "mine.yaml"
    mine.write_text("# @package _global_\ndefaults:\n  - override /optimizer: adamw\ntrain:\n  max_iter: 10\n")
    with pytest.raises(ConfigRefused) as refused:
        refuse_config_errors(["--config-dir", str(tmp_path), "experiment=mine"])
    assert str(refused.value).startswith(f"unknown config key train.max_iter in {mine}: did you mean train.max_iters? ")


@pytest.mark.parametrize("where", ["command line", "own config file"])
@pytest.mark.parametrize("case", HYDRA_CASES.values(), ids=HYDRA_CASES.keys())
def test_what_hydra_refuses_is_one_line_with_the_fix_on_the_command_line_and_in_the_users_own_file(
        tmp_path, case, where):
    if where == "command line":
        arguments, expected = [case.override], case.on_command_line
    else:
        mine, arguments = users_config(tmp_path, case)
        expected = case.in_file and case.in_file.format(file=mine)
    if expected is None:
        refuse_config_errors(arguments)
        return
    with pytest.raises(ConfigRefused) as refused:
        refuse_config_errors(arguments)
    assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)


@pytest.mark.parametrize("arguments, expected", [
    (["-m", "optimizer.lr=1e-3,fast"], "optimizer.lr must be a number, not 'fast'"),  # the sweep's second point
    (["-m", "optimizer=mars-adamw,mars-adam"], "unknown option optimizer=mars-adam: did you mean "),
    (["-m", "train.max_iters=5,1e3"], "train.max_iters must be a whole number, not 1000.0: write 1000"),
])
def test_a_value_or_option_hydra_refuses_at_any_point_of_a_sweep_is_one_line(arguments, expected):
    with pytest.raises(ConfigRefused) as refused:
        refuse_config_errors(arguments)
    assert str(refused.value).startswith(expected)


@pytest.mark.parametrize("override, expected", [
    ("train.lr_schedule=cos", "train.lr_schedule must be one of cosine, linear, constant, wsd, not 'cos': did you "
                              "mean cosine?"),
    ("train.compile=maybe", "train.compile must be true or false, not 'maybe'"),
    ("train.max_iters=null", "train.max_iters must be a whole number, not null"),
    ("train.decay_iters=1.5", "train.decay_iters must be a whole number, not 1.5"),
    ("optimizer.betas=[0.9,fast]", "optimizer.betas[1] must be a number, not 'fast'"),
    ("optimizer.betas=0.9", "optimizer.betas must be a list in brackets ([a, b]), not 0.9"),
    ("hydra/launcher=slrum", "unknown option hydra/launcher=slrum: did you mean hydra/launcher=slurm? "),
    ("experiment=owt-gpt2-smal-5b-adamw", "unknown option experiment=owt-gpt2-smal-5b-adamw: did you mean "
                                          "experiment=owt-gpt2-small-5b-adamw? python train.py --help lists the "),
    ("hydra.run.dir=/runs/~mine", "hydra.run.dir=/runs/~mine: Hydra's override grammar takes no unquoted ~, and the "
                                  "shell expands none after '=': quote it: 'hydra.run.dir=\"/runs/~mine\"'"),
])
def test_each_kind_of_value_hydra_cannot_convert_names_what_the_key_takes(override, expected):
    with pytest.raises(ConfigRefused) as refused:
        refuse_config_errors([override])
    assert str(refused.value).startswith(expected)

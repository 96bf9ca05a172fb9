"""The run config (configs/config.yaml plus overrides) composed outside train.py's Hydra app: for scripts, and for
train.py to tell an unknown key in one line before Hydra does in several."""
import dataclasses
import itertools
import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from configs.schema import Config, register_configs, unknown_key_message
from configs.user_dirs import user_config_dirs

CONFIG_DIR = Path(__file__).resolve().parent
# Hydra's words for a config file whose merge failed: "In 'optimizer/mine': ConfigKeyError raised while ...".
_FAILED_FILE = re.compile(r"^In '([^']+)': ")


class UnknownConfigKey(ValueError):
    """A key that no schema knows, on the command line or in a config file; the message names it, where it is,
    and the nearest known key."""


def compose_config(overrides: list[str]):
    """The config train.py would run with these command-line overrides (not yet validated)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def refuse_unknown_config_keys(argv: list[str]) -> None:
    """Raise :class:`UnknownConfigKey` for a key that train.py's arguments ``argv`` set (``optimizer.gammma=0.1``)
    or that a config file of the user's own directories sets, and no schema knows.

    Hydra would stop on it with several lines, for an override with the advice to append it (``+optimizer.gammma``,
    which the schema check then refuses). The config is composed as Hydra will compose it, once per option of a
    config group that a sweep runs through (a key may be unknown to one optimizer only); any other failure is left
    to Hydra to tell. Nothing is composed where nothing can be unknown: no dotted key set, no directory of the user's.
    """
    arguments = get_args_parser().parse_args(argv)
    if arguments.config_name not in (None, "config") or arguments.config_path:  # another primary config
        return
    try:
        overrides = OverridesParser.create().parse_overrides(arguments.overrides)
    except OverrideParseException:  # a malformed override: Hydra names it
        return
    user_dirs = user_config_dirs(argv)
    if not user_dirs and not any("." in o.key_or_group and not (o.is_add() or o.is_delete() or o.is_force_add())
                                 and not o.key_or_group.startswith("hydra") for o in overrides):
        return
    if arguments.config_dir:  # as Hydra adds it: on the search path
        overrides = [o for o in overrides if o.key_or_group != "hydra.searchpath"]
        searchpath = ",".join(f"file://{Path(directory).resolve()}" for directory in user_dirs)
        fixed = [f"hydra.searchpath=[{searchpath}]"]
    else:
        fixed = []
    for choices in _launches(overrides):
        try:
            compose_config([*fixed, *choices])
        except Exception as err:  # whatever Hydra stops on; only an unknown key is told here, the rest by Hydra
            message = _unknown_key_message(err, user_dirs)
            if message:
                raise UnknownConfigKey(message) from None


def _launches(overrides) -> list[list[str]]:
    """The overrides of one launch per option of each config group a sweep runs through (``optimizer=adamw,muon``),
    every other swept value at its first: what an unknown key depends on."""
    alternatives = []
    for override in overrides:
        if not override.is_sweep_override():
            alternatives.append([override.input_line])
            continue
        values = [f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()]
        alternatives.append(values if "." not in override.key_or_group else values[:1])
    if not alternatives:
        return [[]]
    return [list(launch) for launch in itertools.product(*alternatives)]


def _unknown_key_message(err: Exception, user_dirs: list[Path]) -> str | None:
    """Our line for Hydra's failure ``err`` if an unknown key caused it (None otherwise): with the file that sets the
    key where a file does, or as set on the command line."""
    cause = err.__cause__ or err.__context__
    if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)) or not cause.full_key:
        return None
    schema = cause.object_type
    if not dataclasses.is_dataclass(schema):
        return None
    known = [f.name for f in dataclasses.fields(schema)]
    section, _, key = cause.full_key.rpartition(".")
    failed_file = _FAILED_FILE.match(str(err))
    where = f" in {_config_file(failed_file.group(1), user_dirs)}" if failed_file else ""
    if schema is Config:
        return f"unknown config key {cause.full_key!r}{where}: the top-level keys are {', '.join(known)}"
    if not section or "." in section:
        return None
    return unknown_key_message(section, key, known, where)


def _config_file(config_path: str, user_dirs: list[Path]) -> Path | str:
    """The file of Hydra's ``config_path`` (``optimizer/mine``): in the user's directories, else this one's."""
    for directory in [*user_dirs, CONFIG_DIR]:
        candidate = directory / f"{config_path}.yaml"
        if candidate.is_file():
            return candidate
    return f"{config_path}.yaml"

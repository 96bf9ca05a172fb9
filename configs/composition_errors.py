"""What Hydra refuses in a launch's overrides or config files, told in one line naming the key, where it is set (the
command line or the file) and the fix. Hydra's own words run to several lines ending on "Set the environment
variable HYDRA_FULL_ERROR=1 ...", and some advise what does not help here (``+key=value`` for a misspelt key,
``key=\\'value1,value2\\'`` for a sweep without ``-m``). Each function returns the line, or None for a failure it
does not know, which Hydra then tells."""
import dataclasses
import difflib
import enum
import re
import typing
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from configs.schema import Config, unknown_key_message

# Hydra's words for a config file whose merge failed: "In 'optimizer/mine': ConfigKeyError raised while ...".
_FAILED_FILE = re.compile(r"^In '([^']+)': ")
# Hydra's words for an override of the command line whose merge failed: "Error merging override train.max_iters=1e3".
_FAILED_OVERRIDE = re.compile(r"^Error merging override (.+)$")
MAX_LISTED_OPTIONS = 12  # a group of more (experiment: one preset per run of the paper's) is left to --help


def unquoted_tilde_message(lines: list[str]) -> str | None:
    """The line for an override that Hydra's grammar refuses for its unquoted ``~`` (``data.dir=~/data/mine``),
    which the shell does not expand after ``=`` either."""
    parser = OverridesParser.create()
    for line in lines:
        key, equals, value = line.partition("=")
        if not equals or "~" not in value:
            continue
        try:
            parser.parse_overrides([line])
        except OverrideParseException:
            quoted = f"'{key}=\"{value}\"'"
            fix = (f"write {key}=$HOME{value[1:]} or {quoted}" if value == "~" or value.startswith("~/")
                   else f"quote it: {quoted}")
            return f"{line}: Hydra's override grammar takes no unquoted ~, and the shell expands none after '=': {fix}"
    return None


def several_values_message(override: Override) -> str:
    """The line for a sweep's values given to a launch without ``-m`` (``optimizer.lr=1e-3,3e-3``)."""
    return (f"{override.input_line} gives several values, which only a sweep runs: add -m to sweep over them "
            f"(python train.py -m ... {override.input_line}), or give one value ([...] for a list)")


def composition_failure_message(err: Exception, launch: list[str], search_dirs: list[Path],
                                user_dirs: list[Path]) -> str | None:
    """Our line for Hydra's failure ``err`` to compose the config of ``launch`` (its overrides): an unknown key, an
    unknown option of a config group, or a value of the wrong type, with the file that sets it where a file does
    (looked for in ``search_dirs``, the user's ``user_dirs`` first, then ours)."""
    if isinstance(err, MissingConfigException):
        return _unknown_option_message(err, launch, user_dirs)
    cause = err.__cause__ or err.__context__
    failed_file = _FAILED_FILE.match(str(err))
    where = f" in {_config_file(failed_file.group(1), search_dirs)}" if failed_file else ""
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:
        return _unknown_key_message(cause, where)
    if isinstance(cause, ValidationError) and cause.full_key:
        failed_override = _FAILED_OVERRIDE.match(str(err))
        return _wrong_type_message(cause, where, failed_override.group(1) if failed_override else "")
    return None


def _unknown_key_message(cause: ConfigAttributeError | ConfigKeyError, where: str) -> str | None:
    schema = cause.object_type
    if not dataclasses.is_dataclass(schema):
        return None
    known = [f.name for f in dataclasses.fields(schema)]
    section, _, key = cause.full_key.rpartition(".")
    if schema is Config:
        return f"unknown config key {cause.full_key!r}{where}: the top-level keys are {', '.join(known)}"
    if not section or "." in section:
        return None
    return unknown_key_message(section, key, known, where)


def _unknown_option_message(err: MissingConfigException, launch: list[str], user_dirs: list[Path]) -> str | None:
    """``unknown option optimizer=mars-adam: did you mean optimizer=mars-adamw? the options of optimizer are ...``,
    naming the user's file that chooses it where the command line does not."""
    group, _, option = (err.missing_cfg_file or "").rpartition("/")
    if not group or not err.options:
        return None
    chosen_here = any(_choice(line) == (group, option) for line in launch)
    file = None if chosen_here else _file_choosing(err.missing_cfg_file, user_dirs)
    where = f" in {file}" if file else ""
    close = difflib.get_close_matches(option, err.options, n=1)
    hint = f"did you mean {group}={close[0]}? " if close else ""
    if len(err.options) > MAX_LISTED_OPTIONS:
        return (f"unknown option {group}={option}{where}: {hint}python train.py --help lists the {len(err.options)} "
                f"options of {group}")
    return f"unknown option {group}={option}{where}: {hint}the options of {group} are {', '.join(err.options)}"


def _choice(line: str) -> tuple[str, str]:
    """(group, option) of an override line (``+experiment=mine``: ``("experiment", "mine")``)."""
    key, _, value = line.lstrip("+").partition("=")
    return key, value


def _file_choosing(config_path: str, user_dirs: list[Path]) -> Path | None:
    """The user's config file whose defaults list chooses ``config_path`` (``optimizer/mars-adam``), if one does:
    Hydra names the primary config, not the file, for an option it cannot find."""
    for directory in user_dirs:
        for path in sorted(directory.rglob("*.yaml")) if directory.is_dir() else []:
            if config_path in _defaults_chosen(path, path.parent.relative_to(directory).as_posix()):
                return path
    return None


def _defaults_chosen(path: Path, group: str) -> set[str]:
    """The configs (``optimizer/adamw``) that the defaults list of ``path``, a file of config group ``group`` (``.``
    for none), chooses: ``- adamw`` chooses from its own group, ``- override /optimizer: adamw`` from another."""
    try:
        defaults = yaml.safe_load(path.read_text(encoding="utf-8"))["defaults"]
    except (OSError, UnicodeDecodeError, yaml.YAMLError, TypeError, KeyError):
        return set()
    chosen = set()
    for entry in defaults if isinstance(defaults, list) else []:
        for key, option in entry.items() if isinstance(entry, dict) else [(None, entry)]:
            if not isinstance(option, str):
                continue
            key = (key or "").removeprefix("override ").removeprefix("optional ").split("@")[0].strip()
            parent = key.lstrip("/") if key.startswith("/") or group == "." else f"{group}/{key}".rstrip("/")
            chosen.add(f"{parent}/{option}" if parent else option)
    return chosen


def _wrong_type_message(cause: ValidationError, where: str, failed_override: str) -> str | None:
    """``train.max_iters must be a whole number, not 1e3: write 1000``, by the type that the schema gives the key; a
    number as typed in the override that failed (``failed_override``, empty for a file's value)."""
    value, key = cause.value, f"{cause.full_key}{where}"
    overridden, _, typed = failed_override.lstrip("+").partition("=")
    shown = (repr(value) if isinstance(value, str) else "null" if value is None
             else typed if overridden == cause.full_key else str(value))
    wanted = _without_none(_annotation(cause))
    if wanted is bool:
        return f"{key} must be true or false, not {shown}"
    if wanted is int:
        whole = f": write {int(value)}" if isinstance(value, float) and value.is_integer() else ""
        return f"{key} must be a whole number, not {shown}{whole or _sweep_hint(cause.full_key, value)}"
    if wanted is float:
        return f"{key} must be a number, not {shown}{_sweep_hint(cause.full_key, value)}"
    if isinstance(wanted, type) and issubclass(wanted, enum.Enum):
        names = [member.name for member in wanted]
        close = difflib.get_close_matches(str(value), names, n=1)
        return f"{key} must be one of {', '.join(names)}, not {shown}{f': did you mean {close[0]}?' if close else ''}"
    if typing.get_origin(wanted) in (list, tuple):
        return f"{key} must be a list in brackets ([a, b]), not {shown}"
    return None


def _sweep_hint(key: str, value) -> str:
    """For several values in a config file (``lr: 1e-3,3e-3``, a string): that a sweep over them is run with -m."""
    if not (isinstance(value, str) and "," in value):
        return ""
    return (f": give one value; several are a sweep, run with -m from the command line "
            f"(python train.py -m ... {key}={value})")


def _annotation(cause: ValidationError) -> typing.Any:
    """The type the schema gives the value Hydra could not convert: its field's, or for an item of a list field
    (``optimizer.betas[1]``), the list's items'."""
    if dataclasses.is_dataclass(cause.object_type):
        return typing.get_type_hints(cause.object_type).get(str(cause.key))
    items = typing.get_args(cause.ref_type)
    return items[0] if items else None


def _without_none(annotation: typing.Any) -> typing.Any:
    """``int`` for ``Optional[int]``; any other annotation as it is."""
    others = [a for a in typing.get_args(annotation) if a is not type(None)]
    return others[0] if len(others) == 1 and type(None) in typing.get_args(annotation) else annotation


def _config_file(config_path: str, search_dirs: list[Path]) -> Path | str:
    """The file of Hydra's ``config_path`` (``optimizer/mine``): the first of ``search_dirs`` that has it."""
    for directory in search_dirs:
        candidate = directory / f"{config_path}.yaml"
        if candidate.is_file():
            return candidate
    return f"{config_path}.yaml"

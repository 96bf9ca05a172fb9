"""Config directories a user adds to Hydra's search path (``--config-dir``, ``hydra.searchpath``): a YAML syntax
error in one of their files is told in one line naming the file, line and column, before Hydra composes the config
(Hydra itself stops with the parser's traceback)."""
import argparse
import re
from pathlib import Path

import yaml

_SEARCHPATH_DIRECTORY = re.compile(r"file://([^,\]\s'\"]+)")


class ConfigSyntaxError(ValueError):
    """A config file that is not valid YAML; the message names the file, the line and the column."""


def user_config_dirs(argv: list[str]) -> list[Path]:
    """The directories that ``argv`` (train.py's arguments) adds to the config search path."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--config-dir", "-cd")
    known, rest = parser.parse_known_args(argv)
    directories = [known.config_dir] if known.config_dir else []
    for argument in rest:
        if argument.lstrip("+~").startswith("hydra.searchpath="):
            directories += _SEARCHPATH_DIRECTORY.findall(argument)
    return [Path(directory).expanduser() for directory in directories]


def refuse_config_syntax_errors(argv: list[str]) -> None:
    """Raise :class:`ConfigSyntaxError` for the first YAML file of the user's config directories that does not
    parse. Only the syntax is checked (the files are parsed, not built): what the values mean is the schema's."""
    for directory in user_config_dirs(argv):
        for path in sorted(directory.rglob("*.yaml")) if directory.is_dir() else []:
            try:
                for _ in yaml.compose_all(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader):
                    pass
            except yaml.MarkedYAMLError as err:
                raise ConfigSyntaxError(f"{path} is not valid YAML: {syntax_error_in_words(err)}: fix the syntax "
                                        "there") from None
            except (OSError, UnicodeDecodeError):  # not a syntax error: Hydra tells it if it reads the file
                continue


def syntax_error_in_words(err: yaml.MarkedYAMLError) -> str:
    """``line 5, column 5: expected ',' or ']', but got ':' (while parsing a flow sequence from line 4, column 5)``."""
    mark = err.problem_mark or err.context_mark
    words = f"line {mark.line + 1}, column {mark.column + 1}: {err.problem or err.context}"
    if err.context and err.problem and err.context_mark is not None:
        words += f" ({err.context} from line {err.context_mark.line + 1}, column {err.context_mark.column + 1})"
    return words

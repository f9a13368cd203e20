"""Reading the project's YAML files (platform configs, profiles, experiments) with
errors that name the file, the line and the problem."""

from __future__ import annotations

from pathlib import Path

import yaml

from cxlssd.errors import ConfigError


def read_yaml(path: Path, what: str) -> object:
    """The parsed document of ``path``; ``what`` names it in errors ("platform config")."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: malformed YAML{where}: {getattr(error, 'problem', error)}") from None

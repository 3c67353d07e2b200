"""User themes: $XDG_CONFIG_HOME/gpuwatch/themes/*.toml, one theme per file.

A file that does not load is a warning for the person (the app shows it with notify), never a
crash (posting does the same). A theme file holds Textual's Theme fields at the top level and
the series colours in a [variables] table:

    name = "solarized"
    primary = "#268bd2"
    background = "#002b36"
    dark = true
    [variables]
    util = "#859900"
    sm-clock = "#268bd2"
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from textual.color import Color, ColorParseError
from textual.theme import Theme

_COLOUR_FIELDS = ("primary", "secondary", "warning", "error", "success", "accent",
                  "foreground", "background", "surface", "panel", "boost")
_FIELDS = {f.name for f in fields(Theme)}


@dataclass
class UserThemes:
    themes: list[Theme] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def themes_dir(env: Mapping[str, str] | None = None) -> Path:
    from gpuwatch.remote.paths import config_dir

    return config_dir(env) / "themes"


def load_user_themes(folder: Path | None = None) -> UserThemes:
    """Every *.toml theme in the folder (default: the XDG one), with a warning per broken file."""
    folder = themes_dir() if folder is None else folder
    out = UserThemes()
    try:
        paths = sorted(folder.glob("*.toml"))
    except OSError as exc:
        out.warnings.append(f"theme folder {folder}: {exc}")
        return out
    for path in paths:
        try:
            out.themes.append(load_theme_file(path))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError,
                TypeError) as exc:
            out.warnings.append(f"theme {path.name} not loaded: {exc}")
    return out


def load_theme_file(path: Path) -> Theme:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    unknown = set(data) - _FIELDS
    if unknown:
        raise ValueError(f"unknown keys {', '.join(sorted(unknown))}")
    data.setdefault("name", path.stem)
    if not isinstance(data["name"], str) or not data["name"].strip():
        raise ValueError("name must be a non-empty string")
    if "primary" not in data:
        raise ValueError("primary (a colour) is required")
    for key in _COLOUR_FIELDS:
        if key in data:
            _colour(key, data[key])
    variables = data.get("variables", {})
    if not isinstance(variables, dict):
        raise ValueError("[variables] must be a table")
    for key, value in variables.items():
        _colour(f"variables.{key}", value)
    if "dark" in data and not isinstance(data["dark"], bool):
        raise ValueError("dark must be true or false")
    return Theme(**data)


def _colour(key: str, value: object) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a colour string, got {type(value).__name__}")
    try:
        Color.parse(value)
    except ColorParseError:
        raise ValueError(f"{key}: {value!r} is not a colour") from None

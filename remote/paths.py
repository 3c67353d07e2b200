"""Where gpuwatch keeps its files on this machine: the XDG base directories, one lookup.

config (`$XDG_CONFIG_HOME`, default ~/.config): the config, user themes, the systemd unit;
state (`$XDG_STATE_HOME`, default ~/.local/state): the store, the error log, the watcher's log;
cache (`$XDG_CACHE_HOME`, default ~/.cache): the probe's built payloads. An empty variable
counts as unset, as the XDG spec says. Imports nothing of gpuwatch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

_DEFAULTS = {"XDG_CONFIG_HOME": (".config",), "XDG_STATE_HOME": (".local", "state"),
             "XDG_CACHE_HOME": (".cache",)}


def _base(variable: str, env: Mapping[str, str] | None) -> Path:
    env = os.environ if env is None else env
    value = env.get(variable)
    return Path(value) if value else Path.home().joinpath(*_DEFAULTS[variable])


def config_home(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME, else ~/.config."""
    return _base("XDG_CONFIG_HOME", env)


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_STATE_HOME/gpuwatch (XDG's default ~/.local/state when unset)."""
    return _base("XDG_STATE_HOME", env) / "gpuwatch"


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME/gpuwatch (XDG's default ~/.config when unset)."""
    return config_home(env) / "gpuwatch"


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """$XDG_CACHE_HOME/gpuwatch (XDG's default ~/.cache when unset)."""
    return _base("XDG_CACHE_HOME", env) / "gpuwatch"

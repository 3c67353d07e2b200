"""The probe's names in one namespace, as when the probe was one file: names.X is X of
whichever file of the probe defines it, and setting one sets it there (a test's monkeypatch
reaches the code that uses it). For the client's tests and benchmarks: never sent to a box.
"""

import sys
import types
from typing import Any

from . import base

FILES = ("base", "host", "gpus/section", "gpus/nvidia_smi", "processes", "disks", "known_runs",
         "runs", "checkpoints", "events", "metrics", "globs", "gpus/nvml", "gpus/mig", "popen",
         "cgroup_v1", "kernel_log", "probe")


def owner(name: str) -> types.ModuleType:
    """The file of the probe that defines `name`."""
    for part in FILES:
        module: types.ModuleType = base.load_module(part)
        if name in vars(module):
            return module
    raise AttributeError(f"no file of the probe defines {name!r}")


class _Names(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(owner(name), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(owner(name), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(owner(name), name)


sys.modules[__name__].__class__ = _Names

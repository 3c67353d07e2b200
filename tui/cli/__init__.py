"""The `gpuwatch` command line: one module per verb, and all of gpuwatch's printing and prompting.

`main` (in command.py) parses the command line and hands over to the verb's module: init.py,
check.py, once.py (`--once`), actions.py (kill, reap, relaunch), scalars.py, watch.py (watch,
notify), launch.py (the TUI and `--demo`); common.py holds what they share. Textual is imported
only in launch.py, when the TUI is about to run, so `--once`, `check` and the action verbs stay
light.
"""

from .command import main

__all__ = ["main"]

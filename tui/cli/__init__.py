"""The `gpuwatch` command line: one module per verb, all printing and prompting, no Textual.

`main` (in main.py) parses the command line and hands over to the verb's module; the TUI is
imported only when it is about to run, so `--once`, `check` and the action verbs stay light.
"""

from .command import main

__all__ = ["main"]

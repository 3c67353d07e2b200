"""`python -m gpuwatch.tui.cli`: the same as the `gpuwatch` console script."""

from .command import main

main()

"""gpuwatch.tui: everything that faces a person."""

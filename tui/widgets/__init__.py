"""gpuwatch.tui.widgets: one widget per file; each renders the data it is given."""

"""gpuwatch.themes: Textual themes registered at start."""

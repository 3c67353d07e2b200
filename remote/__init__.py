"""gpuwatch.remote: everything that knows about boxes. No Textual here."""

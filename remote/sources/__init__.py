"""Fleet-level sources that are not one host's probe: the Slurm scheduler (slurm.py)."""

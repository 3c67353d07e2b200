"""Fleet-level sources that are not one host's probe (DESIGN §1): the Slurm scheduler
(slurm.py) and a Prometheus-compatible server's HTTP API (prometheus.py). Each is bounded as a
poll is; Prometheus gives the pipeline a HostSnapshot per host, as a poll would."""

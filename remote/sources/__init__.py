"""Fleet-level sources that are not one host's probe (DESIGN §1): a Prometheus-compatible
server's HTTP API (prometheus.py). Each gives the pipeline a HostSnapshot per host, as a poll
would, bounded as a poll is."""

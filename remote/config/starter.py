"""`gpuwatch init`: a commented starter config, written with tomli-w.

tomli-w writes data, not comments, so the comments are laid over its output line by line: what is
written loads back exactly as the data it was made from.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import tomli_w

from .schema import LOCAL, SshSettings, host_name_for

_HEADER = """\
# gpuwatch config. Every key is optional; these are the defaults.
# Docs: README.md, section "Config". Check it with `gpuwatch check`.
"""

# (table, key) -> comment written above that key
_COMMENTS: dict[tuple[str, str], str] = {
    ("", "interval"): "seconds between two polls of one host",
    ("ssh", "connect_timeout"): "the bounds of every poll; each key can also be set per host\n"
                                "seconds for TCP connect + SSH handshake (ConnectTimeout)",
    ("ssh", "server_alive_interval"): "keepalive every N quiet seconds (ServerAliveInterval)",
    ("ssh", "server_alive_count_max"): "missed keepalives before giving up (ServerAliveCountMax)",
    ("ssh", "command_timeout"): "deadline of one poll's command on the box, in seconds",
    ("ssh", "config_file"): "read like OpenSSH: Host aliases, User, Port, IdentityFile,\n"
                            "ProxyJump; ssh-agent is used when running.\n"
                            "Known host keys: the ssh config's UserKnownHostsFile, else\n"
                            "~/.ssh/known_hosts; unknown or changed keys are refused\n"
                            "(see --accept-new-host-keys). To use another file:\n"
                            'known_hosts = "~/.ssh/known_hosts"\n'
                            "A key used instead of the ssh config's IdentityFile:\n"
                            'identity_file = "~/.ssh/id_ed25519"',
    ("host", "ssh"): 'what you would type after `ssh`; "local" = this machine, no SSH',
    ("host", "python"): "interpreter on the box that runs the probe (stdlib only, 3.6+)",
    ("host", "disks"): "filesystems that get byte and inode gauges",
}

_RUN_EXAMPLE = """\
# A training run on {host} (uncomment and edit):
# [hosts.{host}.runs.llama]
# process = "train.py"                       # an argument of its command line (or /train.py)
# workdir = "/data/llama"                    # its processes work here (and their children)
# log = "train.log"                          # relative paths are relative to workdir
# events = "runs"                            # TensorBoard event files, searched recursively
# metrics = ["outputs/trainer_state.json"]   # trainer_state.json, metrics.csv, *.jsonl
# checkpoints = "outputs/checkpoint-*"
# done = "outputs/DONE"                      # exists = finished, not dead
# relaunch = "python train.py --resume {{latest_checkpoint}}"
# detach = "tmux"                            # tmux | setsid
# env = {{ CUDA_VISIBLE_DEVICES = "0,1" }}
"""


def starter_data(targets: list[str]) -> dict[str, Any]:
    """The starter config as data: defaults plus one [hosts.X] table per target."""
    ssh = SshSettings()
    hosts: dict[str, Any] = {}
    for target in targets or [LOCAL]:
        name = host_name_for(target) if target != LOCAL else LOCAL
        hosts[name] = {"ssh": target, "python": "python3", "disks": ["/"]}
    return {
        "interval": 10,
        "ssh": {
            "connect_timeout": int(ssh.connect_timeout),
            "server_alive_interval": int(ssh.server_alive_interval),
            "server_alive_count_max": ssh.server_alive_count_max,
            "command_timeout": int(ssh.command_timeout),
            "config_file": ssh.config_file,
        },
        "hosts": hosts,
    }


def starter_text(targets: list[str]) -> str:
    """The starter config as commented TOML."""
    data = starter_data(targets)
    out = [_HEADER]
    table = ""
    for line in tomli_w.dumps(data).splitlines():
        if line.startswith("["):
            table = "host" if line.startswith("[hosts.") else line.strip("[]")
        key = line.split("=", 1)[0].strip() if "=" in line and not line.startswith("[") else None
        comment = _COMMENTS.get((table, key)) if key else None
        if comment:
            out.extend(f"# {c}" for c in comment.splitlines())
        out.append(line)
    first_host = next(iter(data["hosts"]))
    out.append("")
    out.append(_RUN_EXAMPLE.format(host=first_host).rstrip())
    return "\n".join(out) + "\n"


def write_starter(path: Path, targets: list[str], *, force: bool = False) -> None:
    """Write the starter config atomically; refuse to overwrite unless forced."""
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".config-", suffix=".toml", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(starter_text(targets))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

"""Pin a discovered run into the config: one `[hosts.H.runs.R]` table, so the run
gpuwatch found by itself becomes a configured one (its own name, paths, relaunch command).

tomli-w cannot keep comments, so the new table is APPENDED as text to the file, which is left
byte for byte as it was above it. Only when appending cannot give valid TOML (the host or its
`runs` written as an inline table, `hosts = { gpu1 = { ... } }`) is the whole file rewritten
with tomli-w, and then its comments and formatting are lost; the message says so.
"""

from __future__ import annotations

import os
import shlex
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from ..config.load import parse_config
from ..config.schema import ConfigError
from ..model.discovered import Discovery
from ..model.resume import resume_argv

ENV_PREFIXES = ("CUDA_", "NCCL_", "TORCH", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "WANDB_",
                "OMP_", "MKL_", "PYTHONPATH", "ACCELERATE_", "DS_", "TOKENIZERS_", "XLA_")
"""Launch variables worth pinning as the run's `env` (the rest of the recorded environment,
PATH and HOME among them, is the login's and stays with the relaunch of a discovered run)."""
PLACEHOLDER = "{latest_checkpoint}"


def _relative(path: str | None, workdir: str | None) -> str | None:
    if path is None or not workdir:
        return path
    prefix = workdir.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path


def relaunch_template(d: Discovery) -> str | None:
    """The launch argv as a config `relaunch` template, resuming from {latest_checkpoint}
    where the framework's convention is known."""
    if not d.argv:
        return None
    resumed, _ = resume_argv(d.argv, d.framework, PLACEHOLDER)
    words = resumed if resumed is not None else list(d.argv)
    return " ".join(w if w in (PLACEHOLDER, f"--resume_from_checkpoint={PLACEHOLDER}",
                               f"--ckpt_path={PLACEHOLDER}") else shlex.quote(w) for w in words)


def run_table(d: Discovery) -> dict[str, Any]:
    """The `[hosts.H.runs.R]` table of a discovered run (paths relative to its workdir)."""
    table: dict[str, Any] = {}
    if d.process:
        table["process"] = d.process
    if d.cwd:
        table["workdir"] = d.cwd
    for key, value in (("log", d.log or d.stdout), ("events", d.events),
                       ("checkpoints", d.checkpoints)):
        rel = _relative(value, d.cwd)
        if rel:
            table[key] = rel
    if d.metrics:
        table["metrics"] = [_relative(m, d.cwd) for m in d.metrics]
    relaunch = relaunch_template(d)
    if relaunch:
        table["relaunch"] = relaunch
    table["detach"] = "tmux" if d.detach in ("tmux", "screen") else "setsid"
    env = {k: v for k, v in d.env or () if k.startswith(ENV_PREFIXES)}
    if env:
        table["env"] = env
    return table


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _valid(text: str, path: Path) -> str | None:
    """None when text is a config gpuwatch reads, else why not."""
    try:
        parse_config(text, path)
    except ConfigError as exc:
        return str(exc)
    return None


def pin_run(config_path: str | os.PathLike[str], host_name: str, discovered: Discovery,
            ssh: str | None = None) -> str:
    """Add `[hosts.<host_name>.runs.<discovered.name>]` to the config at config_path (created
    if missing; the host too, with `ssh = ssh or host_name`). Returns the sentence that says
    what was done. ValueError when the run is already configured or the file is not valid
    TOML."""
    path = Path(config_path).expanduser()
    name = discovered.name
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    try:
        data = tomllib.loads(old)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML ({exc}); fix it, then pin again") from None
    hosts: dict[str, Any] = data["hosts"] if isinstance(data.get("hosts"), dict) else {}
    host: dict[str, Any] | None = hosts[host_name] if isinstance(hosts.get(host_name),
                                                                  dict) else None
    runs: dict[str, Any] = (host["runs"] if host is not None
                            and isinstance(host.get("runs"), dict) else {})
    if name in runs:
        raise ValueError(f"run {name} is already configured for host {host_name} in {path}")
    table = run_table(discovered)
    addition = ({"hosts": {host_name: {"runs": {name: table}}}} if host is not None else
                {"hosts": {host_name: {"ssh": ssh or host_name, "runs": {name: table}}}})
    header = f"# pinned by gpuwatch: run {name}, found running in {discovered.cwd}\n"
    sep = "" if not old or old.endswith("\n\n") else ("\n" if old.endswith("\n") else "\n\n")
    appended = old + sep + header + tomli_w.dumps(addition)
    where = f"[hosts.{host_name}.runs.{name}]"
    try:
        tomllib.loads(appended)
        problem = _valid(appended, path)
    except tomllib.TOMLDecodeError as exc:
        problem = f"appending is not valid TOML here ({exc})"
    if problem is None:
        _write(path, appended)
        return (f"pinned run {name} of {host_name}: appended {where} to {path} (the rest of "
                "the file is unchanged)")
    merged = dict(data)
    merged_hosts = dict(hosts)
    merged_host: dict[str, Any] = dict(host) if host is not None else {
        "ssh": ssh or host_name}
    merged_host["runs"] = {**runs, name: table}
    merged_hosts[host_name] = merged_host
    merged["hosts"] = merged_hosts
    rewritten = tomli_w.dumps(merged)
    still = _valid(rewritten, path)
    if still is not None:
        raise ValueError(f"cannot pin run {name} into {path}: {still}")
    _write(path, rewritten)
    return (f"pinned run {name} of {host_name}: rewrote {path} with {where} added; the table "
            f"could not be appended ({problem}), so its comments and formatting are lost")

"""Pin a discovered run into the config: one `[hosts.H.runs.R]` table, so the run
gpuwatch found by itself becomes a configured one (its own name, paths, relaunch command).

tomli-w cannot keep comments, so the new table is APPENDED as text to the file, which is left
byte for byte as it was above it. Only when appending cannot give valid TOML (the host or its
`runs` written as an inline table, `hosts = { gpu1 = { ... } }`) is the whole file rewritten
with tomli-w, and then its comments and formatting are lost; the message says so.

The config is written where it really is: a symlinked config (dotfiles) is written through the
link, to the file it names, by the same atomic replace (a new file beside it, renamed over it),
and the link stays. A file without write permission for its owner is never rewritten (someone
made it read-only on purpose); a config gpuwatch cannot write is refused with the reason. The
file is read as `--config` reads it (a regular file, at most 1 MiB): pin_run blocks on files,
so the TUI calls pin_run_async, which runs it in a thread.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import stat
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from ..config.load import parse_config, read_config_text
from ..config.schema import ConfigError
from ..model.discovery import Discovery
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


def _target(path: Path) -> Path:
    """The file a config path names: through every symlink (a dangling one names the file it
    would create)."""
    return Path(os.path.realpath(path))


def _writable(shown: Path, target: Path) -> None:
    """ValueError, saying why, when the config at target must not or cannot be replaced."""
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{shown} is not a regular file; nothing was pinned")
        if not st.st_mode & stat.S_IWUSR:
            raise ValueError(f"{shown} is read-only (mode {st.st_mode & 0o7777:04o}): gpuwatch "
                             "does not rewrite a file made read-only; make it writable "
                             f"(chmod u+w {shlex.quote(str(target))}) to pin into it")
        if not os.access(target, os.W_OK):
            raise ValueError(f"{shown} cannot be written by you; nothing was pinned")
    folder = target.parent
    if folder.exists() and not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{shown} cannot be replaced: its folder {folder} is not writable by "
                         "you (the new config is written beside it, then renamed over it)")


def _write(path: Path, text: str) -> None:
    """Replace the file path names (through links) with text, atomically, keeping its mode
    (and its owner, where this process may set it)."""
    target = _target(path)
    _writable(path, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    old = target.stat() if target.exists() else None
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, old.st_mode & 0o777 if old is not None else 0o600)
        if old is not None and os.geteuid() == 0:
            os.chown(tmp, old.st_uid, old.st_gid)  # root pinning into a user's config
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read(path: Path) -> str:
    """The config's text ('' when there is none yet); ValueError when it cannot be used."""
    if not path.exists():
        return ""  # none yet (or a dangling link: the file it names is created)
    try:
        return read_config_text(path)
    except ConfigError as exc:
        raise ValueError(f"{exc}; nothing was pinned") from None


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
    old = _read(path)
    _writable(path, _target(path))  # before any work: a config that cannot be written
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
    shown = f"{path} (a link to {_target(path)})" if path.is_symlink() else str(path)
    if problem is None:
        _write(path, appended)
        return (f"pinned run {name} of {host_name}: appended {where} to {shown} (the rest of "
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
    return (f"pinned run {name} of {host_name}: rewrote {shown} with {where} added; the table "
            f"could not be appended ({problem}), so its comments and formatting are lost")


async def pin_run_async(config_path: str | os.PathLike[str], host_name: str,
                        discovered: Discovery, ssh: str | None = None) -> str:
    """pin_run in a worker thread, for an event loop (the TUI): it reads and writes files."""
    return await asyncio.to_thread(pin_run, config_path, host_name, discovered, ssh)

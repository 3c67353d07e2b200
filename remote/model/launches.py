"""How a discovered run was started, kept in the store while it is alive, and read back to
relaunch it after a death: `record_launches(store, host, snapshot, at)` writes it (cwd, argv,
environment minus login and secret variables, which the probe never sent), `recorded_launch`
reads it as a LaunchRecord; resume.py turns that into the command a relaunch runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..store import Store
from .coerce import integer, mapping, strs, text
from .discovery import Discovery

if TYPE_CHECKING:
    from .snapshot import HostSnapshot

HF_RESUME = "--resume_from_checkpoint"
LIGHTNING_RESUME = "--ckpt_path"
PLACEHOLDERS = ("command", "latest_checkpoint", "workdir", "run")


class RelaunchError(ValueError):
    """A relaunch command cannot be made (e.g. the template needs a checkpoint and there is
    none); str() is the sentence a person reads."""


@dataclass(frozen=True, slots=True)
class LaunchRecord:
    """How a discovered run was started, as the store recorded it while it was alive."""

    host: str
    run: str
    recorded_at: float
    """This machine's clock when it was recorded."""
    boot_id: str | None
    pid: int | None
    start_ticks: int | None
    cwd: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    """Sorted (name, value): the launcher's environment minus the old login's variables and
    minus every secret-named one (never stored, U34). Empty when it was unreadable."""
    dropped_secret: tuple[str, ...]
    """Names of secret-looking variables that were set at launch: neither stored nor passed."""
    dropped_session: tuple[str, ...]
    env_error: str | None
    process: str | None
    """Whole-word command-line pattern of the run (its script as in argv), for the alive check."""
    script: str | None
    kind: str | None
    framework: str | None
    log: str | None
    """Where the launcher's stdout went (a regular file), else None."""
    detach: str
    """tmux | setsid: how a relaunch starts it (as the original outlived its login)."""
    argv0_path: str | None = None
    checkpoints: str | None = None

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def scripts(self) -> tuple[str, ...]:
        """Words of the command that may be a launch script (U2: checked on the box)."""
        return (self.script,) if self.script else ()

    def to_json(self) -> dict[str, Any]:
        return {"cwd": self.cwd, "argv": list(self.argv), "env": dict(self.env),
                "dropped_secret": list(self.dropped_secret),
                "dropped_session": list(self.dropped_session), "env_error": self.env_error,
                "process": self.process, "script": self.script, "kind": self.kind,
                "framework": self.framework, "log": self.log, "detach": self.detach,
                "argv0_path": self.argv0_path, "checkpoints": self.checkpoints,
                "boot_id": self.boot_id, "pid": self.pid, "start_ticks": self.start_ticks}

    @classmethod
    def from_json(cls, host: str, run: str, recorded_at: float,
                  data: Mapping[str, Any]) -> LaunchRecord | None:
        cwd, argv = data.get("cwd"), data.get("argv")
        if not isinstance(cwd, str) or not isinstance(argv, list) or not argv:
            return None
        env = mapping(data.get("env"))
        detach = text(data.get("detach"))
        return cls(
            host=host, run=run, recorded_at=recorded_at, boot_id=text(data.get("boot_id")),
            pid=integer(data.get("pid")), start_ticks=integer(data.get("start_ticks")), cwd=cwd,
            argv=strs(argv), env=tuple(sorted((str(k), v) for k, v in env.items()
                                               if isinstance(v, str))),
            dropped_secret=strs(data.get("dropped_secret")),
            dropped_session=strs(data.get("dropped_session")),
            env_error=text(data.get("env_error")), process=text(data.get("process")),
            script=text(data.get("script")), kind=text(data.get("kind")),
            framework=text(data.get("framework")), log=text(data.get("log")),
            detach=detach if detach in ("tmux", "setsid") else "setsid",
            argv0_path=text(data.get("argv0_path")), checkpoints=text(data.get("checkpoints")))


def launch_record(host: str, d: Discovery, at: float,
                  boot_id: str | None = None) -> LaunchRecord | None:
    """A live discovery's launch as a record; None when this poll did not carry it."""
    if not d.alive or d.same or not d.argv or d.cwd is None:
        return None
    return LaunchRecord(
        host=host, run=d.name, recorded_at=at, boot_id=boot_id, pid=d.launcher_pid,
        start_ticks=d.launcher_start_ticks, cwd=d.cwd, argv=d.argv, env=d.env or (),
        dropped_secret=d.env_secret, dropped_session=d.env_session, env_error=d.env_error,
        process=d.process, script=d.script, kind=d.kind, framework=d.framework,
        log=d.stdout, detach="tmux" if d.detach in ("tmux", "screen") else "setsid",
        argv0_path=d.argv0_path, checkpoints=d.checkpoints)


def record_launches(store: Store, host: str, snapshot: HostSnapshot, at: float) -> int:
    """Record every live discovered run's launch that this poll carried (a new launcher, or
    one the client had not seen); returns how many were recorded."""
    n = 0
    for sample in snapshot.runs:
        d = sample.discovered
        record = launch_record(host, d, at, snapshot.boot_id) if d is not None else None
        if record is not None:
            store.save_launch(host, record.run, record.to_json(), at)
            n += 1
    return n


def recorded_launch(store: Store, host: str, run: str) -> LaunchRecord | None:
    """How a discovered run of `host` was started, as last recorded; None if never."""
    found = store.launch(host, run)
    if found is None:
        return None
    at, data = found
    return LaunchRecord.from_json(host, run, at, data)



"""Zero-config runs on the client: what the box's discovery found, remembered across
polls, recorded in the store while alive, and turned back into a relaunch after a death.

The box side is discover.py (in the probe). Here:

- `Discovery`: one poll's look at how a discovered run was found (frozen; in
  `RunSample.discovered`), merged over polls into `RunSeries.discovery` (which the store keeps
  in the run's state, without the environment).
- `discovered_requests(host, runs)`: the remembered discovered runs for the next request, so a
  run keeps its name, its incremental offsets, and is still read (as dead) after it dies.
- `record_launches(store, host, snapshot, at)`: while a discovered run is alive, how it was
  started (cwd, argv, environment minus login and secret variables, which the probe never sent)
  goes to the store's `launches` table.
- `recorded_launch(store, host, run)` → `LaunchRecord`, and resume.py's `relaunch_command(record,
  latest_checkpoint, template=None)` → (command, dropped secret names, notes): the exact command
  a relaunch runs, resuming from the latest checkpoint where the framework's convention is
  known (HF Trainer `--resume_from_checkpoint`, LightningCLI `--ckpt_path`) or a template says.

No Textual, no SSH, no clock of this machine in the rules: box times come from the box.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from ..config.schema import HostConfig
from ..store import Store

if TYPE_CHECKING:  # both import this module (a run's Discovery): no cycle at run time
    from .series import RunSeries
    from .snapshot import HostSnapshot

MAX_REMEMBERED = 8
"""Discovered runs a request carries back (the most recently alive first)."""
FORGET_AFTER_S = 7 * 86400.0
"""A discovered run dead for this long (box clock) is no longer asked for (the store keeps its
launch record)."""
HF_RESUME = "--resume_from_checkpoint"
LIGHTNING_RESUME = "--ckpt_path"
PLACEHOLDERS = ("command", "latest_checkpoint", "workdir", "run")


def exit_record_path(workdir: str, run: str) -> str:
    """Where gpuwatch's launch wrapper records how a run it relaunched ended (seed 004): the
    client's copy of actions_box.exit_record_path (that file goes to the box alone; a test holds
    the two equal)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run)[:80] or "run"
    return f"{workdir.rstrip('/')}/.gpuwatch/exit-{safe}.json"


class RelaunchError(ValueError):
    """A relaunch command cannot be made (e.g. the template needs a checkpoint and there is
    none); str() is the sentence a person reads."""


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


_INT_MAX = 2**63 - 1
"""model.INT_MAX (model imports this module): an int field beyond int64 reads as absent (the
launch record's pid and start ticks go to SQLite)."""
_FLOAT_MAX = 2.0**53
"""model.FLOAT_MAX: a float field that is not finite, or beyond it, reads as absent."""


def _int(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and \
        -_INT_MAX - 1 <= value <= _INT_MAX
    return value if ok else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _float(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
        -_FLOAT_MAX <= value <= _FLOAT_MAX  # nan compares false: absent too
    return float(value) if ok else None


@dataclass(frozen=True, slots=True)
class Discovery:
    """How a run nobody configured was found on the box, and how it was started."""

    name: str
    key: tuple[str | None, str]
    """(launcher's cwd, its script made absolute, or "-m module"): what names it across polls."""
    alive: bool
    kind: str | None = None
    """The launcher: torchrun, accelerate, deepspeed, mpirun, ..., python, or program."""
    script: str | None = None
    """The training script as written in the launcher's argv (the run is named after it)."""
    module: str | None = None
    """Or the module it runs (`python -m pkg.train`)."""
    process: str | None = None
    """A whole-word pattern (as a run's `process`) that matches the run's command lines."""
    cwd: str | None = None
    launcher_pid: int | None = None
    launcher_start_ticks: int | None = None
    argv: tuple[str, ...] | None = None
    argv0_path: str | None = None
    """argv[0] as found on the launch's PATH (a venv's bin/python, not the binary it links)."""
    stdout: str | None = None
    detach: str | None = None
    """tmux | screen | setsid | terminal | None (seed 000)."""
    same: bool = False
    """The launch the client already saw: argv and env were not sent again."""
    env: tuple[tuple[str, str], ...] | None = None
    """Sorted; without the login's variables and without any secret-named one (U34)."""
    env_secret: tuple[str, ...] = ()
    """Names (only) of secret-looking variables the probe dropped on the box (U34, U35)."""
    env_session: tuple[str, ...] = ()
    env_error: str | None = None
    log: str | None = None
    log_from: str | None = None
    """stdout | stderr | nohup.out: where the log path came from."""
    events: str | None = None
    checkpoints: str | None = None
    metrics: tuple[str, ...] = ()
    framework: str | None = None
    """hf | lightning | deepspeed | None: whose checkpoint convention the artifacts follow."""
    searched_at: float | None = None
    """The box's clock at the search whose results these paths are."""
    search_entries: int | None = None
    search_s: float | None = None
    search_capped: str | None = None
    """None, or what cut this poll's search short: entries | depth | time."""
    search_error: str | None = None
    events_deferred: bool = False

    @property
    def found(self) -> dict[str, Any]:
        """What was found and where (for a person, and for `pin_run`)."""
        return {"log": self.log, "events": self.events, "checkpoints": self.checkpoints,
                "metrics": list(self.metrics), "framework": self.framework}

    def merged(self, previous: Discovery | None) -> Discovery:
        """This poll's look over what earlier polls said: the box sends only what changed (a
        launch the client already saw, `same`, or a dead run, keeps its launch details; paths
        not searched again this poll are the ones it had)."""
        if previous is None or previous.key != self.key:
            return self
        launch = {"argv", "argv0_path", "stdout", "detach", "env", "env_secret", "env_session",
                  "env_error", "launcher_pid", "launcher_start_ticks", "kind", "script",
                  "module", "process", "cwd"}
        searched = {"log", "log_from", "events", "checkpoints", "metrics", "framework",
                    "searched_at", "search_entries", "search_s", "search_capped",
                    "search_error"}
        keep = set() if self.alive and not self.same else launch
        if self.searched_at is None or self.searched_at == previous.searched_at:
            keep = keep | searched
        changes = {name: getattr(previous, name) for name in keep
                   if getattr(self, name) in (None, ()) and getattr(previous, name)
                   not in (None, ())}
        return replace(self, **changes) if changes else self

    def to_request(self, launch_seen: bool = True) -> dict[str, Any]:
        """The remembered run in the probe's `discovered_runs` (offsets come from RunSeries)."""
        entry: dict[str, Any] = {"name": self.name, "key": list(self.key),
                                 "searched_at": self.searched_at}
        for name in ("log", "log_from", "events", "checkpoints", "framework"):
            if getattr(self, name) is not None:
                entry[name] = getattr(self, name)
        if self.metrics:
            entry["metrics"] = list(self.metrics)
        if self.cwd:  # where a relaunch by gpuwatch (in this cwd) records how it ended
            entry["exit"] = exit_record_path(self.cwd, self.name)
        if launch_seen and self.launcher_pid is not None and self.launcher_start_ticks is not None:
            entry["launch_seen"] = [self.launcher_pid, self.launcher_start_ticks]
        return entry

    def to_state(self) -> dict[str, Any]:
        """JSON for the store's run state: everything but the environment (that is in the
        `launches` table only)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "env":
                continue
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_state(cls, name: str, data: Any) -> Discovery | None:
        """Undo `to_state`; None for anything malformed (never fatal)."""
        if not isinstance(data, Mapping):
            return None
        try:
            return parse_discovery(name, {**data, "found": data, "launcher": {
                "pid": data.get("launcher_pid"), "start_ticks": data.get("launcher_start_ticks"),
                "cwd": data.get("cwd"), "argv": data.get("argv"),
                "argv0_path": data.get("argv0_path"), "stdout": data.get("stdout"),
                "detach": data.get("detach")}, "search": None})
        except ValueError:
            return None


def parse_discovery(name: str, raw: Any) -> Discovery:
    """The probe's "discovered" object of a run → Discovery; ValueError naming the problem."""
    if not isinstance(raw, Mapping):
        raise ValueError("expected an object")
    key = raw.get("key")
    if not (isinstance(key, list) and len(key) == 2 and isinstance(key[1], str)
            and (key[0] is None or isinstance(key[0], str))):
        raise ValueError("key: expected [cwd, script]")
    launcher = _mapping(raw.get("launcher"))
    found = _mapping(raw.get("found"))
    search = _mapping(raw.get("search")) if raw.get("search") is not None else None
    env_raw = raw.get("env")
    env = None
    if isinstance(env_raw, Mapping):
        env = tuple(sorted((str(k), str(v)) for k, v in env_raw.items()
                           if isinstance(v, str)))
    argv = _strs(launcher.get("argv")) if isinstance(launcher.get("argv"), list) else None
    script, module = _str(raw.get("script")), _str(raw.get("module"))
    process = _str(raw.get("process")) or script or module or (argv[0] if argv else None)
    return Discovery(
        name=name, key=(key[0], key[1]), alive=raw.get("alive") is not False,
        kind=_str(raw.get("kind")), script=script, module=module, process=process,
        cwd=_str(launcher.get("cwd")) or key[0], launcher_pid=_int(launcher.get("pid")),
        launcher_start_ticks=_int(launcher.get("start_ticks")), argv=argv,
        argv0_path=_str(launcher.get("argv0_path")), stdout=_str(launcher.get("stdout")),
        detach=_str(launcher.get("detach")), same=raw.get("same") is True, env=env,
        env_secret=_strs(raw.get("env_secret")), env_session=_strs(raw.get("env_session")),
        env_error=_str(raw.get("env_error")), log=_str(found.get("log")),
        log_from=_str(found.get("log_from")), events=_str(found.get("events")),
        checkpoints=_str(found.get("checkpoints")), metrics=_strs(found.get("metrics")),
        framework=_str(found.get("framework")), searched_at=_float(raw.get("searched_at")),
        search_entries=_int(search.get("entries")) if search else None,
        search_s=_float(search.get("s")) if search else None,
        search_capped=_str(search.get("capped")) if search else None,
        search_error=_str(search.get("error")) if search else None,
        events_deferred=raw.get("events_deferred") is True)


def describe(d: Discovery) -> list[str]:
    """What was found, and where, in plain lines (box text as data: escape before markup)."""
    lines = [f"discovered run {d.name}: {d.kind or 'process'} "
             f"{shlex.join(d.argv) if d.argv else d.script or '?'} in {d.cwd or '?'}"]
    where = [f"{k} {v}" for k, v in (("log", d.log), ("events", d.events),
                                     ("checkpoints", d.checkpoints)) if v]
    where += [f"metrics {m}" for m in d.metrics]
    lines.append("found: " + ("; ".join(where) if where else "no log, event files or "
                                                               "checkpoints"))
    if d.search_capped:
        lines.append(f"the search of {d.cwd} stopped at its {d.search_capped} bound after "
                     f"{d.search_entries} entries: something may be missing (pin the run)")
    if d.search_error:
        lines.append(f"search: {d.search_error}")
    if d.env_secret:
        lines.append("secret-named variables not recorded: " + ", ".join(d.env_secret))
    return lines


# ---------------------------------------------------------------- across polls

def is_discovered_state(state: Mapping[str, Any]) -> bool:
    """Whether a run state kept in the store belongs to a discovered run."""
    return isinstance(state.get("discovery"), Mapping)


def _forgotten(series: RunSeries) -> bool:
    """Dead for longer than FORGET_AFTER_S (box clock): no longer asked for nor listed."""
    last = series.last_seen_running_at
    return (not series.pids and last is not None and series.box_time is not None
            and series.box_time - last > FORGET_AFTER_S)


def discovered_names(runs: Mapping[str, RunSeries], host: HostConfig) -> list[str]:
    """The discovered runs of a host's history that are not configured (nor pinned) ones and
    not long dead, by name."""
    configured = {r.name for r in host.runs}
    return sorted(n for n, s in runs.items()
                  if s.discovery is not None and n not in configured
                  and not _pinned(s.discovery, host) and not _forgotten(s))


def _pinned(d: Discovery, host: HostConfig) -> bool:
    """A remembered run that the config now names (pinned): the configured one reads it."""
    return any(r.workdir and d.cwd and r.workdir.rstrip("/") == d.cwd.rstrip("/")
               and r.process and r.process == d.process for r in host.runs)


def discovered_requests(host: HostConfig,
                        runs: Mapping[str, RunSeries] | None) -> list[dict[str, Any]]:
    """`discovered_runs` of the next request: the remembered discovered runs (at most
    MAX_REMEMBERED, the most recently alive first; one dead for FORGET_AFTER_S is dropped),
    each with what the last answers said (offsets, cursors, log size), so that only what is
    new comes back and a dead one is still read."""
    configured = {r.name for r in host.runs}
    kept = []
    for name, series in (runs or {}).items():
        d = series.discovery
        if d is None or name in configured or _pinned(d, host) or _forgotten(series):
            continue
        last = series.last_seen_running_at
        kept.append((last if last is not None else float("-inf"), name, series, d))
    kept.sort(key=lambda item: (-item[0], item[1]))
    out = []
    for _, _name, series, d in kept[:MAX_REMEMBERED]:
        entry = d.to_request()
        entry.update(series.request_state())
        out.append(entry)
    return out


# ---------------------------------------------------------------- how it was started

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
        env = _mapping(data.get("env"))
        detach = _str(data.get("detach"))
        return cls(
            host=host, run=run, recorded_at=recorded_at, boot_id=_str(data.get("boot_id")),
            pid=_int(data.get("pid")), start_ticks=_int(data.get("start_ticks")), cwd=cwd,
            argv=_strs(argv), env=tuple(sorted((str(k), v) for k, v in env.items()
                                               if isinstance(v, str))),
            dropped_secret=_strs(data.get("dropped_secret")),
            dropped_session=_strs(data.get("dropped_session")),
            env_error=_str(data.get("env_error")), process=_str(data.get("process")),
            script=_str(data.get("script")), kind=_str(data.get("kind")),
            framework=_str(data.get("framework")), log=_str(data.get("log")),
            detach=detach if detach in ("tmux", "setsid") else "setsid",
            argv0_path=_str(data.get("argv0_path")), checkpoints=_str(data.get("checkpoints")))


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


__all__ = [
    "Discovery",
    "LaunchRecord",
    "RelaunchError",
    "describe",
    "discovered_names",
    "discovered_requests",
    "is_discovered_state",
    "launch_record",
    "parse_discovery",
    "record_launches",
    "recorded_launch",
]

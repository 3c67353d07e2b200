"""A discovered run's Discovery: one poll's look at how a run nobody configured was found on
the box and how it was started (frozen; in `RunSample.discovered`), merged over polls into
`RunSeries.discovery`. A value type: it imports nothing of the model, so the snapshot, the run
state and the series can all hold one. Also where gpuwatch's launch wrapper records how a run
ended (exit_record_path)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from .coerce import integer, mapping, number, strs, text


def exit_record_path(workdir: str, run: str) -> str:
    """Where gpuwatch's launch wrapper records how a run it relaunched ended (seed 004): the
    client's copy of actions_box.exit_record_path (that file goes to the box alone; a test holds
    the two equal)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run)[:80] or "run"
    return f"{workdir.rstrip('/')}/.gpuwatch/exit-{safe}.json"


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
    launcher = mapping(raw.get("launcher"))
    found = mapping(raw.get("found"))
    search = mapping(raw.get("search")) if raw.get("search") is not None else None
    env_raw = raw.get("env")
    env = None
    if isinstance(env_raw, Mapping):
        env = tuple(sorted((str(k), str(v)) for k, v in env_raw.items()
                           if isinstance(v, str)))
    argv = strs(launcher.get("argv")) if isinstance(launcher.get("argv"), list) else None
    script, module = text(raw.get("script")), text(raw.get("module"))
    process = text(raw.get("process")) or script or module or (argv[0] if argv else None)
    return Discovery(
        name=name, key=(key[0], key[1]), alive=raw.get("alive") is not False,
        kind=text(raw.get("kind")), script=script, module=module, process=process,
        cwd=text(launcher.get("cwd")) or key[0], launcher_pid=integer(launcher.get("pid")),
        launcher_start_ticks=integer(launcher.get("start_ticks")), argv=argv,
        argv0_path=text(launcher.get("argv0_path")), stdout=text(launcher.get("stdout")),
        detach=text(launcher.get("detach")), same=raw.get("same") is True, env=env,
        env_secret=strs(raw.get("env_secret")), env_session=strs(raw.get("env_session")),
        env_error=text(raw.get("env_error")), log=text(found.get("log")),
        log_from=text(found.get("log_from")), events=text(found.get("events")),
        checkpoints=text(found.get("checkpoints")), metrics=strs(found.get("metrics")),
        framework=text(found.get("framework")), searched_at=number(raw.get("searched_at")),
        search_entries=integer(search.get("entries")) if search else None,
        search_s=number(search.get("s")) if search else None,
        search_capped=text(search.get("capped")) if search else None,
        search_error=text(search.get("error")) if search else None,
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

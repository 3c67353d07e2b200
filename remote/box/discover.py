"""Zero-config runs: find the training runs on a box that nobody configured.

Runs ON the box inside the probe (shipped by the bundle like the event decoder): stdlib only,
Python 3.6+, no ``from __future__``; how a run was started and its artifacts are found by
discover_found.py, which the bundle's loader installs just before it. Nothing read from the
box is executed; /proc and the run's folder are only read, under bounds.

Two steps, called by the probe:

``group(procs, holders, matched, request)`` (in the processes section): every process that
holds a GPU is climbed up its process tree to its launcher (a ``torchrun``, ``accelerate``,
``deepspeed``, ``mpirun`` or ``python -m torch.distributed.run`` and any plain python parent,
never a shell, tmux, sshd or init) and the launcher with all its descendants (ranks,
dataloader workers) is one run, named after the launcher's script (``train`` for ``torchrun ...
train.py``). A group holding a process of a configured run IS that run (no duplicate). A group
whose launcher has the same cwd and script as a run the client remembers gets that run's name
again (a relaunched run stays itself); new names are made unique deterministically. The pids
of each group are written into ``matched`` so the process table names their run.

``collect(state, request, limits, budget, collect_run)`` (the "discovered" section): for each
group, where its artifacts are (searched under the launcher's cwd by convention, bounded in
depth, entries and time, and only every ``discover_every_s`` for a run the client already
knows), how it was started (cwd, argv, where stdout goes, and its environment minus the login's
variables and minus every secret-looking one, whose NAMES only are sent, U34/U35), and then the
run read exactly like a configured one by the probe's own ``collect_run``. Remembered runs that
are not alive any more are read from their remembered paths, with no pids (dead).

Request additions (see probe.py): ``want.discover`` (default true); ``discovered_runs``: [{"name",
"key": [cwd, script], "log", "events", "checkpoints", "metrics", "searched_at",
"launch_seen": [pid, start_ticks], "offsets", "cursors", "log_seen", "exit"}]; limits
``discover_runs``, ``discover_depth``, ``discover_entries``, ``discover_time_s``,
``discover_every_s``, ``environ_bytes``.

Each answer is a run object (as in "runs") plus "discovered" (nulls and empty values left out,
so a steady poll adds little): {"key", "alive" (only when false: a remembered run not running),
"kind", "script" | "module", "launcher": {"pid", "start_ticks", "argv", "argv0_path",
"stdout", "detach"}, "same" (the launch the client saw: argv and env not sent again),
"env": {name: value}, "env_secret": [names], "env_session": [names], "env_error",
"searched_at", "search": {"entries", "s", "capped" ("entries" | "depth" | "time"), "error"},
"found": {"log", "log_from", "events", "checkpoints", "metrics", "framework"} (only from a
search of this poll), "events_deferred"}.
"""

import os
import re
import sys
import time

MYPY = False
if MYPY:  # pragma: no cover - typing names for the type comments; not imported on the box
    from collections.abc import Callable  # noqa: F401 (used in type comments)
    from typing import Any

    Obj = dict[str, Any]
    Procs = dict[int, dict[str, Any]]

_found = sys.modules.get("gpuwatch_discover_found") or __import__(
    __package__ + ".discover_found", fromlist=["_"])  # the box: installed just before this one
DEFAULTS, SESSION_NAMES, SESSION_PREFIXES = (_found.DEFAULTS, _found.SESSION_NAMES,
                                             _found.SESSION_PREFIXES)
artifacts, launch_of, split_environ = _found.artifacts, _found.launch_of, _found.split_environ
proc_path, read_link, setting = _found.proc_path, _found.read_link, _found.setting
_processes = sys.modules.get("gpuwatch_processes") or __import__(
    __package__ + ".processes", fromlist=["_"])  # the box: a core file, always sent before
children_of, subtree = _processes.children_of, _processes.subtree


PYTHON = re.compile(r"^(?:python|pypy)[0-9.]*[dmu]?$")
LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "mpirun", "mpiexec", "orterun",
             "prterun", "horovodrun", "composer")
LAUNCHER_MODULES = {
    "torch.distributed.run": "torchrun", "torch.distributed.launch": "torchrun",
    "accelerate.commands.launch": "accelerate", "accelerate.commands.accelerate_cli":
    "accelerate", "deepspeed.launcher.runner": "deepspeed",
    "deepspeed.launcher.launch": "deepspeed",
}
# What sits between a launcher and its ranks (MPI's per-node daemons, hydra's proxy).
INTERMEDIATES = ("orted", "prted", "hydra_pmi_proxy", "pmi_proxy")
# Python programs that are never part of a run: a run below one of them stops there.
NOT_RUNS = ("pytest", "py.test", "jupyter", "jupyter-lab", "jupyter-notebook", "ipython",
            "ipykernel_launcher", "supervisord", "gunicorn", "celery", "airflow", "ray",
            "dask-worker", "gpuwatch")
DETACH_SERVERS = ("tmux", "screen", "SCREEN")
SCRIPT_SUFFIXES = (".py", ".sh", ".bash")



def read_argv(pid):
    # type: (int) -> list[str]
    try:
        with open(proc_path(str(pid), "cmdline"), "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")] if raw else []



# ---------------------------------------------------------------- what a command line runs

def is_python(word):
    # type: (str) -> bool
    return bool(PYTHON.match(os.path.basename(word)))


def stem(path):
    # type: (str) -> str
    name = os.path.basename(path.rstrip("/"))
    for suffix in SCRIPT_SUFFIXES:
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def launcher_target(kind, args):
    # type: (str, list[str]) -> tuple[str | None, str | None]
    """The script (or -m module) a launcher starts: the first .py/.sh argument, else the first
    dotted name after a module flag → (script, module)."""
    if kind == "accelerate" and args and args[0] == "launch":
        args = args[1:]
    for arg in args:
        if not arg.startswith("-") and arg.endswith(SCRIPT_SUFFIXES):
            return arg, None
    if "-m" in args or "--module" in args:
        for arg in args[args.index("-m" if "-m" in args else "--module") + 1:]:
            if re.match(r"^[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*$", arg):
                return None, arg
    return None, None


def parse_command(argv):
    # type: (list[str]) -> tuple[str, str | None, str | None]
    """A launcher's argv → (kind, script, module): kind is the launcher ("torchrun", ...),
    "python", or "program" (anything else); script as written in argv, or the -m module."""
    if not argv:
        return "program", None, None
    if is_python(argv[0]):
        i = 1
        while i < len(argv):
            arg = argv[i]
            if arg == "-m" or (arg.startswith("-m") and not arg.startswith("--")):
                module = argv[i + 1] if arg == "-m" and i + 1 < len(argv) else arg[2:]
                rest = argv[i + 2:] if arg == "-m" else argv[i + 1:]
                kind = LAUNCHER_MODULES.get(module)
                if kind is not None:
                    script, target = launcher_target(kind, rest)
                    return kind, script, target
                return "python", None, module or None
            if arg == "-c":
                return "python", None, None
            if arg in ("-W", "-X", "-Q"):
                i += 2
                continue
            if arg.startswith("-"):
                i += 1
                continue
            if stem(arg) in LAUNCHERS:
                script, target = launcher_target(stem(arg), argv[i + 1:])
                return stem(arg), script, target
            return "python", arg, None
        return "python", None, None
    name = os.path.basename(argv[0])
    if name in LAUNCHERS:
        script, target = launcher_target(name, argv[1:])
        return name, script, target
    return "program", argv[0], None


def run_name(kind, script, module):
    # type: (str, str | None, str | None) -> str
    if script:
        base = stem(script)
    elif module:
        parts = [p for p in module.split(".") if p not in ("__main__", "main", "cli")]
        base = parts[-1] if parts else module
    else:
        base = kind if kind not in ("python", "program") else "python"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.") or "run"


# ---------------------------------------------------------------- grouping by process tree

def program_of(stat, argv):
    # type: (Obj, list[str]) -> str
    """The name that tells what a process is: a python script's stem, else argv[0]'s or
    comm's basename."""
    if argv and is_python(argv[0]):
        kind, script, module = parse_command(argv)
        if kind != "python":
            return kind
        return stem(script) if script else (module or "python")
    return os.path.basename(argv[0]) if argv else stat["comm"]


def climbs_to(parent, procs, argv_of):
    # type: (int, Procs, Callable[[int], list[str]]) -> bool
    """Whether a run's process's parent belongs to the same run: a launcher, an MPI daemon or a
    python program; never init, a shell, a detach server, sshd or a known non-run."""
    stat = procs.get(parent)
    if stat is None or parent <= 1 or stat["ppid"] == 0 or stat["state"] in ("Z", "X"):
        return False
    argv = argv_of(parent)
    name = program_of(stat, argv)
    if name in NOT_RUNS or stat["comm"].startswith(DETACH_SERVERS):
        return False
    if name in LAUNCHERS or name in INTERMEDIATES or stat["comm"] in LAUNCHERS:
        return True
    return bool(argv) and is_python(argv[0])


def run_key(argv, cwd):
    # type: (list[str], str | None) -> tuple[str, str | None, str | None, list[Any]]
    """A launcher's argv and cwd → (kind, script, module, key): the key [cwd, script's path]
    (or [cwd, "-m module"], [cwd, argv[0]]) names a run across relaunches."""
    kind, script, module = parse_command(argv)
    if script:
        target = script if os.path.isabs(script) or not cwd else os.path.join(cwd, script)
        key = [cwd, os.path.normpath(target)]  # type: list[Any]
    else:
        key = [cwd, "-m " + module if module else " ".join(argv[:1])]
    return kind, script, module, key


def group(procs, holders, matched, request):
    # type: (Procs, list[int], dict[int, str], Obj) -> Obj
    """GPU holders → runs by process tree (see the module's docstring). A remembered run that
    no GPU holder belongs to is also looked for by its key among all processes, so that a run
    counts as running before its ranks have opened a GPU (a relaunch starting up: CUDA init
    takes seconds to minutes). Writes each group's pids into `matched`; returns the state
    `collect` reads."""
    argvs = {}  # type: dict[int, list[str]]

    def argv_of(pid):
        # type: (int) -> list[str]
        if pid not in argvs:
            argvs[pid] = read_argv(pid)
        return argvs[pid]

    children = children_of(procs)
    groups = groups_of(procs, holders, matched, children, argv_of)
    alive = set(tuple(g["key"]) for g in groups)
    wanted = set(tuple(r["key"]) for r in remembered_runs(request)
                 if all(k is None or isinstance(k, str) for k in r["key"])) - alive
    if wanted:
        seeds = [pid for pid in procs if pid not in matched and procs[pid]["state"] not in (
            "Z", "X") and argv_of(pid) and tuple(run_key(argv_of(pid), read_link(
                proc_path(str(pid), "cwd")))[3]) in wanted]
        if seeds:
            groups = groups_of(procs, list(holders) + seeds, matched, children, argv_of)
    groups.sort(key=lambda g: (g["start_ticks"], g["root"]))
    name_groups(groups, request)
    for g in groups:
        for pid in g["pids"]:
            matched[pid] = g["name"]
    return {"groups": groups, "procs": procs}


def groups_of(procs, seeds, matched, children, argv_of):
    # type: (Procs, list[int], dict[int, str], dict[int, list[int]], Callable[[int], list[str]]) -> list[Obj]
    """Each seed climbed to its launcher; each launcher with all its descendants one group."""
    roots = {}  # type: dict[int, None]
    for pid in seeds:
        if pid not in procs:
            continue
        root, seen = pid, {pid}
        while procs[root]["ppid"] not in seen and climbs_to(procs[root]["ppid"], procs, argv_of):
            root = procs[root]["ppid"]
            seen.add(root)
        roots.setdefault(root, None)
    trees = {}  # type: dict[int, set[int]]
    for root in roots:
        trees[root] = subtree(root, children)
    groups = []
    for root, members in trees.items():
        if any(root in other for top, other in trees.items() if top != root):
            continue  # below another run's launcher (a shell between them stopped the climb)
        if any(p in matched for p in members):
            continue  # it IS the configured run
        pids = sorted(p for p in members if procs[p]["state"] not in ("Z", "X"))
        if not pids:
            continue  # a defunct holder: the zombie rules' business, not a run
        argv = argv_of(root)
        cwd = read_link(proc_path(str(root), "cwd"))
        kind, script, module, key = run_key(argv, cwd)
        groups.append({"root": root, "pids": pids, "argv": argv, "kind": kind,
                       "script": script, "module": module, "cwd": cwd, "key": key,
                       "start_ticks": procs[root]["start_ticks"],
                       "base": run_name(kind, script, module)})
    return groups


def remembered_runs(request):
    # type: (Obj) -> list[Obj]
    runs = request.get("discovered_runs")
    return [r for r in runs if isinstance(r, dict) and isinstance(r.get("name"), str)
            and isinstance(r.get("key"), list)] if isinstance(runs, list) else []


def name_groups(groups, request):
    # type: (list[Obj], Obj) -> None
    """Deterministic names: a group whose (cwd, script) is a remembered run's gets its name
    back; a new one gets its script's stem, or stem-<cwd folder>, or stem-2, -3, ..."""
    configured = {r.get("name") for r in request.get("runs") or () if isinstance(r, dict)}
    remembered = remembered_runs(request)
    taken = configured | {r["name"] for r in remembered}
    used = set()  # type: set[int]
    for g in groups:
        g["name"], g["remembered"] = None, None
        for i, r in enumerate(remembered):
            if r["key"] == g["key"] and r["name"] not in configured and i not in used:
                used.add(i)
                g["name"], g["remembered"] = r["name"], r
                break
    for g in groups:
        if g["name"] is not None:
            continue
        base = g["base"]
        folder = re.sub(r"[^A-Za-z0-9_.-]+", "-", os.path.basename(g["cwd"] or "")).strip("-.")
        candidates = [base] + ([f"{base}-{folder}"] if folder else [])
        name = next((c for c in candidates if c not in taken), None)
        n = 2
        while name is None:
            candidate = f"{base}-{n}"
            name = candidate if candidate not in taken else None
            n += 1
        taken.add(name)
        g["name"] = name


# ---------------------------------------------------------------- the section

def collect(state, request, limits, budget, collect_run, has_decoder=True):
    # type: (Obj, Obj, Obj, Obj, Callable[..., Obj], bool) -> list[Obj]
    """Each discovered run read like a configured one (by the probe's `collect_run`), with
    what discovery found. has_decoder: whether this poll's probe carries the event decoder
    (the client leaves it out when no run reads event files); without it a new run's event
    files are read from the next poll on."""
    now, out = time.time(), []
    search_deadline = time.monotonic() + setting(request, "discover_time_s")
    every_s = setting(request, "discover_every_s")
    groups = state["groups"]
    cap = int(setting(request, "discover_runs"))
    if len(groups) > cap:  # the newest launches: an old one is likelier a leftover
        groups = sorted(groups, key=lambda g: (g["start_ticks"], g["root"]))[-cap:]
    procs = state["procs"]
    for g in groups:
        known = g["remembered"] or {}
        seen = known.get("launch_seen")
        same = seen == [g["root"], g["start_ticks"]]
        details = {"key": g["key"], "kind": g["kind"], "script": g["script"],
                   "module": g["module"]}
        details.update(launch_of(g, procs, request, same))
        searched_at = known.get("searched_at")
        due = not isinstance(searched_at, (int, float)) or now - searched_at >= every_s
        if due or not g["remembered"]:
            found, stats = artifacts(g, request, search_deadline)
            details["search"], details["searched_at"] = stats, round(now, 3)
            details["found"] = found  # else the client has them: they are what it sent
        else:
            found = {k: known.get(k) for k in ("log", "events", "checkpoints")}
            found["metrics"] = known.get("metrics") if isinstance(known.get("metrics"),
                                                                  list) else []
            found["log_from"], found["framework"] = known.get("log_from"), \
                known.get("framework")
        out.append(read_run(g["name"], g["pids"], found, known, details, budget, limits,
                            collect_run, has_decoder))
    alive = {g["name"] for g in state["groups"]}
    configured = {r.get("name") for r in request.get("runs") or () if isinstance(r, dict)}
    for known in remembered_runs(request):
        if known["name"] in alive or known["name"] in configured:
            continue
        found = {k: known.get(k) for k in ("log", "events", "checkpoints", "log_from",
                                           "framework")}
        found["metrics"] = known.get("metrics") if isinstance(known.get("metrics"), list) else []
        details = {"key": known["key"], "alive": False}
        out.append(read_run(known["name"], [], found, known, details, budget, limits,
                            collect_run, has_decoder))
    return out


def read_run(name, pids, found, known, details, budget, limits, collect_run, has_decoder):
    # type: (str, list[int], Obj, Obj, Obj, Obj, Obj, Callable[..., Obj], bool) -> Obj
    run = {"name": name}  # type: Obj
    for key in ("log", "events", "checkpoints"):
        if isinstance(found.get(key), str):
            run[key] = found[key]
    metrics = [m for m in found.get("metrics") or () if isinstance(m, str)]
    if metrics:
        run["metrics"] = metrics
    for key in ("offsets", "cursors", "log_seen"):
        if key in known:
            run[key] = known[key]
    if isinstance(known.get("exit"), str):  # the client's: a relaunch by gpuwatch records there
        run["exit"] = known["exit"]
    if run.get("events") and not has_decoder:
        del run["events"]  # read from the next poll on, which ships the decoder
        details["events_deferred"] = True
    result = collect_run(run, pids, budget, limits)
    result["discovered"] = compact(details)
    return result


def compact(value):
    # type: (Any) -> Any
    """Without nulls and empty lists or objects (every poll's document stays small)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            item = compact(item)
            if item is not None and item != [] and item != {}:
                out[key] = item
        return out
    return value

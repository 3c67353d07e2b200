"""Zero-config runs (issue 8): find the training runs on a box that nobody configured.

Runs ON the box inside the probe (shipped by probe_bundle like the event decoder): stdlib only,
Python 3.6+, self-contained (no relative imports, no ``from __future__``). Nothing read from
the box is executed; /proc and the run's folder are only read, under bounds.

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

import heapq
import os
import re
import time

MYPY = False
if MYPY:  # pragma: no cover - typing names for the type comments; not imported on the box
    from collections.abc import Callable  # noqa: F401 (used in type comments)
    from typing import Any

    Obj = dict[str, Any]
    Procs = dict[int, dict[str, Any]]

PROCFS = os.environ.get("GPUWATCH_PROCFS", "/proc")

DEFAULTS = {
    "discover_runs": 8,  # groups looked at per poll (the most recently started are kept)
    "discover_depth": 5,  # folders below the cwd searched for artifacts
    "discover_entries": 5000,  # directory entries looked at per run's search
    "discover_time_s": 0.5,  # all searches of one poll together
    "discover_every_s": 30.0,  # a known live run's folder is searched again this often
    "environ_bytes": 65536,  # a larger environment is not recorded
}

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

# U34, U35: what belonged to the old login, and what must never leave the box.
SESSION_NAMES = ("TERM", "STY", "DISPLAY", "SHLVL", "PWD", "OLDPWD", "_", "WINDOW",
                 "TERMCAP", "COLUMNS", "LINES", "MAIL")
SESSION_PREFIXES = ("SSH_", "TMUX", "XDG_SESSION_")
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH",
                "PASSPHRASE", "PRIVATE", "COOKIE")
URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s:]*:[^/@\s]+@")

# Artifacts by convention.
SEARCH_FIRST = ("runs", "lightning_logs", "logs", "outputs", "output", "tb", "tensorboard",
                "tb_logs", "checkpoints", "checkpoint", "ckpt", "ckpts", "results", "saved",
                "save", "experiments", "exp")
EVENT_DIRS = ("runs", "lightning_logs", "logs", "tb", "tensorboard", "tb_logs", "events",
              "summaries")
SKIP_DIRS = ("__pycache__", "node_modules", "site-packages", "venv", "env", "wandb", "mlruns")
CKPT_DIR = re.compile(r"^(?:checkpoint-\d+|global_step\d+)$")
CKPT_SUFFIXES = (".ckpt", ".safetensors", ".pt", ".pth")
CKPTISH = re.compile(r"ckpt|checkpoint|save|output|model|weight", re.I)
VERSION_DIR = re.compile(r"^version_\d+$")


def proc_path(*parts):
    # type: (*str) -> str
    return os.path.join(PROCFS, *parts)


def setting(request, key):
    # type: (Obj, str) -> Any
    given = request.get("limits")
    value = given.get(key) if isinstance(given, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return value
    return DEFAULTS[key]


def read_argv(pid):
    # type: (int) -> list[str]
    try:
        with open(proc_path(str(pid), "cmdline"), "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0")] if raw else []


def read_link(path):
    # type: (str) -> str | None
    try:
        return os.readlink(path)
    except OSError:
        return None


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

    children = {}  # type: dict[int, list[int]]
    for pid, stat in procs.items():
        children.setdefault(stat["ppid"], []).append(pid)
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
        members, stack = {root}, [root]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in members:
                    members.add(child)
                    stack.append(child)
        trees[root] = members
    groups = []
    for root, members in trees.items():
        if any(root in other for top, other in trees.items() if top != root):
            continue  # below another run's launcher (a shell between them stopped the climb)
        if any(p in matched for p in members):
            continue  # issue 8 (4): it IS the configured run
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


# ---------------------------------------------------------------- how it was started

def split_environ(raw):
    # type: (bytes) -> tuple[dict[str, str], list[str], list[str]]
    """/proc/PID/environ bytes → (env kept, secret names, login names). A secret's value is
    dropped here, on the box: it is never sent, stored or passed on (U34, U35)."""
    env, secret, session = {}, [], []
    for item in raw.split(b"\0"):
        if not item or b"=" not in item:
            continue
        name, _, value = item.decode("utf-8", "replace").partition("=")
        upper = name.upper()
        if upper in SESSION_NAMES or upper.startswith(SESSION_PREFIXES):
            session.append(name)
        elif any(word in upper for word in SECRET_WORDS) or URL_WITH_PASSWORD.search(value):
            secret.append(name)
        else:
            env[name] = value
    return env, sorted(set(secret)), sorted(set(session))


def read_environ(pid, cap):
    # type: (int, int) -> tuple[dict[str, str] | None, list[str], list[str], str | None]
    """(env, secret names, login names, error): readable for one's own processes or root."""
    try:
        with open(proc_path(str(pid), "environ"), "rb") as f:
            raw = f.read(cap + 1)
    except OSError as exc:
        why = "permission denied (another user's process)" if getattr(exc, "errno", 0) == 13 \
            else (exc.strerror or str(exc))
        return None, [], [], f"not readable: {why}"
    if len(raw) > cap:
        return None, [], [], f"environment larger than {cap} bytes: not recorded"
    env, secret, session = split_environ(raw)
    return env, secret, session, None


def which(word, env, cwd):
    # type: (str, dict[str, str] | None, str | None) -> str | None
    """argv[0] as the launch found it on PATH (symlinks kept: a venv's python is its bin/python,
    not the system binary it links to); None when not found."""
    if "/" in word:
        path = word if os.path.isabs(word) or not cwd else os.path.join(cwd, word)
        return os.path.normpath(path) if os.path.exists(path) else None
    for folder in (env or {}).get("PATH", "").split(os.pathsep):
        path = os.path.join(folder, word)
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def output_file(pid, fd):
    # type: (int, int) -> str | None
    """Where fd 1 (or 2) goes when it is a regular file that still exists; else None."""
    target = read_link(proc_path(str(pid), "fd", str(fd)))
    if not target or not target.startswith("/") or target.endswith(" (deleted)"):
        return None
    try:
        return target if os.path.isfile(target) else None
    except OSError:
        return None


def detach_of(root, procs):
    # type: (int, Procs) -> str | None
    """How the launch outlives its login (seed 000): "tmux"/"screen" above it, "setsid" (its own
    session), "terminal" (tied to a tty), else None."""
    parent, seen = procs[root]["ppid"], {root}
    while parent in procs and parent not in seen:
        comm = procs[parent]["comm"]
        if comm.startswith("tmux"):
            return "tmux"
        if comm.startswith(("screen", "SCREEN")):
            return "screen"
        seen.add(parent)
        parent = procs[parent]["ppid"]
    stat = procs[root]
    if stat["tty_nr"]:
        return "terminal"
    return "setsid" if stat["session"] == root else None


def launch_of(g, procs, request, same):
    # type: (Obj, Procs, Obj, bool) -> Obj
    root = g["root"]
    launcher = {"pid": root, "start_ticks": g["start_ticks"],
                "stdout": output_file(root, 1), "detach": detach_of(root, procs)}
    out = {"launcher": launcher}  # type: Obj
    if same:
        out["same"] = True
        return out
    launcher["argv"] = g["argv"]
    env, secret, session, error = read_environ(root, int(setting(request, "environ_bytes")))
    if env is not None:
        out["env"] = env
        if g["argv"]:
            launcher["argv0_path"] = which(g["argv"][0], env, g["cwd"])
    out["env_secret"], out["env_session"] = secret, session
    if error:
        out["env_error"] = error
    return out


# ---------------------------------------------------------------- artifacts by convention

def search(cwd, max_depth, max_entries, deadline):
    # type: (str, int, int, float) -> tuple[dict[str, list[tuple[str, float]]], int, str | None]
    """Walk cwd for artifacts, the conventional folders first (a big data/ folder must not eat
    the budget before runs/ is seen), never following symlinks nor entering checkpoint
    folders. → (found lists, entries looked at, what cut the search or None)."""
    found = {"events": [], "ckpt_dirs": [], "ckpt_files": [], "trainer_state": [],
             "metrics_csv": []}  # type: dict[str, list[tuple[str, float]]]
    heap, seq, entries, capped = [(0, 0, 0, cwd)], 0, 0, None
    while heap:
        if time.monotonic() > deadline:
            return found, entries, "time"
        _, depth, _, folder = heapq.heappop(heap)
        has_config = None
        try:
            it = os.scandir(folder)
        except OSError:
            if folder == cwd:
                raise
            continue
        with it:
            for entry in it:
                entries += 1
                if entries > max_entries:
                    return found, entries - 1, "entries"
                if entries % 512 == 0 and time.monotonic() > deadline:
                    return found, entries, "time"
                name = entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if CKPT_DIR.match(name):
                            found["ckpt_dirs"].append((entry.path, entry.stat().st_mtime))
                            state = os.path.join(entry.path, "trainer_state.json")
                            if os.path.isfile(state):
                                found["trainer_state"].append((state, os.stat(state).st_mtime))
                        elif name.startswith(".") or name in SKIP_DIRS:
                            continue
                        elif depth >= max_depth:
                            capped = capped or "depth"
                        else:
                            seq += 1
                            first = depth == 0 and name in SEARCH_FIRST
                            prio = 0 if first or heap_prio(folder, cwd) == 0 else 1
                            heapq.heappush(heap, (prio, depth + 1, seq, entry.path))
                        continue
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    if "tfevents" in name:
                        kind = "events"
                    elif name == "trainer_state.json":
                        kind = "trainer_state"
                    elif name == "metrics.csv":
                        kind = "metrics_csv"
                    elif name.endswith(CKPT_SUFFIXES):
                        kind = "ckpt_files"
                    elif name.endswith(".bin"):
                        if has_config is None:
                            has_config = os.path.isfile(os.path.join(folder, "config.json"))
                        kind = "ckpt_files" if has_config else ""
                    else:
                        kind = ""
                    if kind:
                        found[kind].append((entry.path, entry.stat().st_mtime))
                except OSError:
                    continue
    return found, entries, capped


def heap_prio(folder, cwd):
    # type: (str, str) -> int
    """0 when folder lies in one of cwd's conventional folders (searched first)."""
    rel = os.path.relpath(folder, cwd)
    return 0 if rel.split(os.sep, 1)[0] in SEARCH_FIRST else 1


def version_glob(path):
    # type: (str) -> str
    """Lightning's per-run version_N folders become version_* (a resumed run starts the next)."""
    return os.sep.join("version_*" if VERSION_DIR.match(p) else p for p in path.split(os.sep))


def events_root(files, cwd):
    # type: (list[tuple[str, float]], str) -> str
    """The folder to read event files from: the nearest conventional events folder above the
    newest file (runs/, lightning_logs/, ...), else the files' common folder."""
    newest = max(files, key=lambda item: item[1])[0]
    folder = os.path.dirname(newest)
    if folder == cwd:
        return os.path.join(cwd, "*tfevents*")
    probe = folder
    while probe.startswith(cwd + os.sep):
        if os.path.basename(probe) in EVENT_DIRS:
            return probe
        probe = os.path.dirname(probe)
    top = os.path.join(cwd, os.path.relpath(folder, cwd).split(os.sep, 1)[0])
    same = [os.path.dirname(p) for p, _ in files if p.startswith(top + os.sep)]
    return os.path.commonpath(same) if same else folder


def checkpoint_glob(found):
    # type: (dict[str, list[tuple[str, float]]]) -> tuple[str | None, str | None]
    """One glob for the run's checkpoints: HF's checkpoint-N or DeepSpeed's global_stepN
    folders, else Lightning's *.ckpt, else *.safetensors/*.pt/*.pth/*.bin files in a
    checkpoint-looking folder, else anywhere; ties go to the newest. → (glob, framework)."""
    options = []  # type: list[tuple[int, float, str, str | None]]
    for path, mtime in found["ckpt_dirs"]:
        name = os.path.basename(path)
        prefix = "checkpoint-" if name.startswith("checkpoint-") else "global_step"
        options.append((0, mtime, os.path.join(os.path.dirname(path), prefix + "*"),
                        "hf" if prefix == "checkpoint-" else "deepspeed"))
    for path, mtime in found["ckpt_files"]:
        folder, ext = os.path.dirname(path), os.path.splitext(path)[1]
        prio = 1 if ext == ".ckpt" else (2 if CKPTISH.search(os.path.basename(folder)) else 3)
        options.append((prio, mtime, version_glob(os.path.join(folder, "*" + ext)),
                        "lightning" if ext == ".ckpt" else None))
    if not options:
        return None, None
    best = min(options, key=lambda o: (o[0], -o[1]))
    return best[2], best[3]


def artifacts(g, request, deadline):
    # type: (Obj, Obj, float) -> tuple[Obj, Obj]
    """Search the launcher's cwd → ({"log", "log_from", "events", "checkpoints", "metrics",
    "framework"}, {"entries", "s", "capped", "error"?})."""
    cwd, started = g["cwd"], time.monotonic()
    out = {"log": None, "log_from": None, "events": None, "checkpoints": None, "metrics": [],
           "framework": None}  # type: Obj
    for fd, origin in ((1, "stdout"), (2, "stderr")):
        log = output_file(g["root"], fd)
        if log:
            out["log"], out["log_from"] = log, origin
            break
    stats = {"entries": 0, "s": 0.0, "capped": None}  # type: Obj
    if not cwd or cwd == "/":
        stats["error"] = "no working folder to search" if not cwd else "cwd is / (not searched)"
        return out, stats
    if out["log"] is None and os.path.isfile(os.path.join(cwd, "nohup.out")):
        out["log"], out["log_from"] = os.path.join(cwd, "nohup.out"), "nohup.out"
    try:
        found, stats["entries"], stats["capped"] = search(
            cwd, int(setting(request, "discover_depth")),
            int(setting(request, "discover_entries")), deadline)
    except OSError as exc:
        stats["error"] = str(exc.strerror or exc)
        found = None
    stats["s"] = round(time.monotonic() - started, 4)
    if not found:
        return out, stats
    if found["events"]:
        out["events"] = events_root(found["events"], cwd)
    out["checkpoints"], framework = checkpoint_glob(found)
    states = found["trainer_state"]
    if states:
        in_ckpt = [p for p, _ in states if CKPT_DIR.match(os.path.basename(os.path.dirname(p)))]
        if in_ckpt:
            parent = os.path.dirname(os.path.dirname(in_ckpt[0]))
            prefix = os.path.basename(os.path.dirname(in_ckpt[0])).split("-")[0]
            out["metrics"].append(os.path.join(parent, prefix + "-*", "trainer_state.json"))
        else:
            out["metrics"].append(max(states, key=lambda s: s[1])[0])
        framework = "hf"
    if found["metrics_csv"]:
        out["metrics"].append(version_glob(max(found["metrics_csv"], key=lambda s: s[1])[0]))
        framework = framework or "lightning"
    if framework is None and out["events"] and "lightning_logs" in out["events"].split(os.sep):
        framework = "lightning"
    out["framework"] = framework
    return out, stats


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

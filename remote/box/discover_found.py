"""What discovery (discover.py) finds of a run besides its processes: how it was
started (its environment, minus the login's variables and every secret-looking one, U34, U35;
where its stdout goes; what detaches it) and its artifacts, searched by convention under the
launcher's cwd within bounds; with discovery's limits and the helpers both use.

Stdlib only, Python 3.6+: it goes to the box with discover.py (bundle: the gpuwatch_discover
part), installed just before it.
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



def read_link(path):
    # type: (str) -> str | None
    try:
        return os.readlink(path)
    except OSError:
        return None



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

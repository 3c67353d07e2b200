"""The runs and discovered sections: configured runs, and discovery between searches
(the last discovery reused while the box's runs did not change).

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys
import time
import zlib

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])
processes = base.load_module("processes")


# ---------------------------------------------------------------- runs, configured and discovered

def collect_runs(request, limits, found):
    runs = [r for r in request.get("runs") or () if isinstance(r, dict)]
    if "matched" not in found:  # the processes section was not asked for, or failed
        procs, _ = processes.scan_table()
        found["matched"] = processes.match_runs(procs, runs)
    pids = {}
    for pid, name in found["matched"].items():
        pids.setdefault(name, []).append(pid)
    budget = found["budget"] = {"bytes": limits["events_bytes"],  # discovered runs share it
                                "deadline": time.monotonic() + limits["events_time_s"]}
    out = []
    for run in runs:
        if not isinstance(run.get("name"), str):
            continue
        try:
            out.append(base.load_module("runs").collect_run(run, sorted(pids.get(run["name"], [])),
                                                       budget, limits))
        except Exception as exc:  # never happens by design; if it does, the run says so
            out.append({"name": run["name"], "pids": [], "errors": {"run": base.describe(exc)}})
    return out


def collect_discovered(request, limits, found):
    """The runs nobody configured, found by discover.py and read like configured ones
    (after them: they share the event budget)."""
    if "discovery" not in found:
        raise base.ProbeFailure("discovery needs the processes section")
    state = found["discovery"]
    if "need" in state:
        raise base.ProbeFailure("no discover module sent, no discovery to reuse: %s"
                                % state["need"])
    budget = found.get("budget") or {"bytes": limits["events_bytes"],
                                     "deadline": time.monotonic() + limits["events_time_s"]}
    try:
        base.load_module("tfevents")
        has_decoder = True
    except ImportError:  # left out of this poll's bundle: no run asked for event files
        has_decoder = False
    if "reused" in state:
        return collect_reused(state, request, limits, budget, has_decoder)
    return base.load_module("discover").collect(state, request, limits, budget,
                                           base.load_module("runs").collect_run,
                                           has_decoder)


# -------------------------------- discovery between searches
# The discover module was a quarter of what every poll sent up, half with the event decoder that
# came with it (U15: each byte goes up every few seconds). The client sends it on a host's first
# poll and when the probe asks for it; on the polls between, it sends back what the last
# discovery found (the request's "discovery_reuse", made by discovery_cache) and the probe
# checks here that discover.group would find just that again: the same launchers, a GPU holder
# of each still in its tree (new holders only inside them: dataloader workers), every other
# holder accounted for, the same remembered runs, and no new process that could be one of them.
# Then each run is read from the paths the client remembers, as discover.collect reads a run
# whose launch the client has seen and whose folder is not due for a search. When the probe
# cannot tell, its document says {"discovery": {"need": "now"}} and the client polls again at
# once with the module; a folder due for a search says "next" (the next poll searches it).
# Processes are known by pid and start time: one that exec()s another program in place is seen
# as such by the next poll that sends the module (every discover_every_s at the latest).

def discovery_state(procs, holders, matched, request):
    """found["discovery"]: discover.group's state with the cache for the next poll, the reused
    state, or {"need": why} when neither can be had without the module."""
    reuse, why = request.get("discovery_reuse"), "none sent"
    if isinstance(reuse, dict):
        try:
            state, why = reuse_discovery(reuse, procs, holders, matched, request)
        except Exception as exc:  # malformed: discover afresh
            state, why = None, base.describe(exc)
        if state is not None:
            return state
    try:
        discover = base.load_module("discover")
    except ImportError:
        return {"need": why}
    configured = dict(matched)
    state = discover.group(procs, holders, matched, request)
    try:
        state["cache"] = discovery_cache(state, procs, holders, configured, request,
                                         discover.DEFAULTS)
    except Exception:  # never by design; without a cache the next poll sends the module again
        pass
    return state


def boot_id():
    try:
        return base.read_text(base.proc_path("sys", "kernel", "random", "boot_id")).strip()
    except OSError:
        return None


def remembered(request):
    """The request's remembered discovered runs (as discover.remembered_runs reads them)."""
    runs = request.get("discovered_runs")
    return [r for r in runs if isinstance(r, dict) and isinstance(r.get("name"), str)
            and isinstance(r.get("key"), list)] if isinstance(runs, list) else []


def runs_digest(runs):
    return zlib.crc32(base.json_dumps(sorted(base.json_dumps([r["name"], r["key"]], (", ", ": "))
                                        for r in runs), (", ", ": "))
                      .encode())


def lookalikes(procs, inside, configured, runs):
    """discover.group also looks among all processes for a remembered run's key [cwd, script]:
    the live processes outside every run that could have one (that cwd, and the script's name
    in the command line) → [[pid, start_ticks, crc32 of cwd and command line]]."""
    words = {}
    for r in runs:
        cwd, what = r["key"]
        words.setdefault(cwd, set()).add(os.path.basename(what.split()[-1]) if what.split()
                                         else "")
    out = []
    for pid in sorted(procs) if words else ():
        if pid in inside or pid in configured or procs[pid]["state"] in ("Z", "X"):
            continue
        cwd = processes.read_link(base.proc_path(str(pid), "cwd"))
        if cwd in words:
            cmd = " ".join(processes.read_argv(str(pid)))
            if any(word in cmd for word in words[cwd]):
                out.append([pid, procs[pid]["start_ticks"],
                            zlib.crc32(("%s\0%s" % (cwd, cmd)).encode("utf-8", "replace"))])
    return out


def owner_of(pid, procs, children, configured):
    """The nearest ancestor (or itself) whose tree holds a configured run's process: why
    discover.group put a GPU holder in no run (the configured run is that run)."""
    while pid in procs:
        if any(p in configured for p in processes.subtree(pid, children)):
            return pid
        pid = procs[pid]["ppid"]
    return None


def discovery_cache(state, procs, holders, configured, request, defaults):
    """What the next poll sends back as "discovery_reuse": per run [name, launcher pid, its
    start ticks, its ppid, a GPU holder in its tree (the launcher when found by its key) and
    that one's start ticks]; the other holders in no run (not a configured run's) [pid, start
    ticks, ppid, defunct, owner (owner_of), owner's start ticks]; the processes that could be
    a remembered run (lookalikes); a digest of the runs the next request will remember (their
    names and keys)."""
    children = processes.children_of(procs)
    groups, inside = [], set()
    for g in state["groups"]:
        tree = processes.subtree(g["root"], children)
        inside |= tree
        anchor = next((pid for pid in holders if pid in tree), g["root"])
        groups.append([g["name"], g["root"], g["start_ticks"], procs[g["root"]]["ppid"], anchor,
                       procs[anchor]["start_ticks"]])
    outside = []
    for pid in holders:
        if pid not in inside and pid not in configured:  # a configured run's: its run
            owner = owner_of(pid, procs, children, configured)
            outside.append([pid, procs[pid]["start_ticks"], procs[pid]["ppid"],
                            procs[pid]["state"] in ("Z", "X"), owner,
                            procs[owner]["start_ticks"] if owner is not None else None])
    runs = remembered(request) + [{"name": g["name"], "key": g["key"]} for g in state["groups"]
                                  if not g["remembered"]]
    return {"boot": boot_id(), "groups": groups, "outside": outside,
            "seen": lookalikes(procs, inside, configured, runs), "remembered": runs_digest(runs),
            "every_s": defaults["discover_every_s"], "cap": defaults["discover_runs"]}


def reuse_discovery(reuse, procs, holders, matched, request):
    """→ (state, None) when discover.group would find what the poll that made `reuse` found
    (discovery_cache), with each run's pids written into `matched`; else (None, why)."""
    if reuse["boot"] != boot_id():
        return None, "rebooted"
    runs = remembered(request)
    if runs_digest(runs) != reuse["remembered"]:
        return None, "remembered runs changed"
    known = dict((r["name"], r) for r in runs)
    configured = set(r.get("name") for r in request.get("runs") or () if isinstance(r, dict))
    children = processes.children_of(procs)
    groups, inside, keys = [], set(), []
    for name, root, start, ppid, anchor, anchor_start in reuse["groups"]:
        tree = processes.subtree(root, children) if root in procs else ()
        pids = sorted(p for p in tree if procs[p]["state"] not in ("Z", "X"))
        run = known.get(name) or {}
        if (root not in pids or [procs[root]["start_ticks"], procs[root]["ppid"]] != [start, ppid]
                or anchor not in tree or procs[anchor]["start_ticks"] != anchor_start
                or (anchor != root and anchor not in holders) or run.get("key") in keys
                or name in configured or run.get("launch_seen") != [root, start]):
            return None, "run %s changed" % name
        if any(p in matched for p in tree):
            return None, "configured run's process in run %s" % name
        inside |= tree
        keys.append(run["key"])
        groups.append({"name": name, "root": root, "start_ticks": start, "pids": pids})
    outside = dict((rec[0], rec[1:]) for rec in reuse["outside"])
    for pid in holders:
        if pid in inside or pid in matched:  # a configured run's process: that run's
            continue
        stat, rec = procs[pid], outside.get(pid)
        dead = stat["state"] in ("Z", "X")
        if rec is None or rec[:3] != [stat["start_ticks"], stat["ppid"], dead] or not (
                dead if rec[3] is None else rec[3] in procs and procs[rec[3]]["start_ticks"]
                == rec[4] and owner_of(pid, procs, children, matched) == rec[3]):
            return None, "GPU holder %d in no run" % pid
    seen = [tuple(s) for s in reuse["seen"]]
    for found in lookalikes(procs, inside, matched, runs):
        if tuple(found) not in seen:
            return None, "%d may be a remembered run" % found[0]
    for g in groups:
        for pid in g["pids"]:
            matched[pid] = g["name"]
    return {"reused": groups, "every_s": reuse["every_s"], "cap": reuse["cap"]}, None


def collect_reused(state, request, limits, budget, has_decoder):
    """The discovered section from a reused discovery: each live run as discover.collect reads
    one whose launch the client has seen, less what the client keeps from the last answer
    (Discovery.merged: how it was launched, its paths), then the remembered runs that are
    not running."""
    now, out = time.time(), []
    given = request.get("limits")
    every_s = base.number_setting(given, "discover_every_s", state["every_s"])
    cap = int(base.number_setting(given, "discover_runs", state["cap"]))
    runs = remembered(request)
    known = dict((r["name"], r) for r in runs)
    groups = state["reused"]
    if len(groups) > cap:  # the newest launches, as discover.collect keeps them
        groups = sorted(groups, key=lambda g: (g["start_ticks"], g["root"]))[-cap:]
    for g in groups:
        run = known[g["name"]]
        searched_at = run.get("searched_at")
        if not isinstance(searched_at, (int, float)) or now - searched_at >= every_s:
            state["due"] = True  # the next poll sends the module, which searches
        details = {"key": run["key"], "same": True,
                   "launcher": {"pid": g["root"], "start_ticks": g["start_ticks"]}}
        out.append(base.load_module("runs").read_known_run(run, g["pids"], details, budget, limits,
                                                      has_decoder))
    alive = set(g["name"] for g in state["reused"])
    configured = set(r.get("name") for r in request.get("runs") or () if isinstance(r, dict))
    for run in runs:
        if run["name"] not in alive and run["name"] not in configured:
            out.append(base.load_module("runs").read_known_run(
                run, [], {"key": run["key"], "alive": False}, budget, limits, has_decoder))
    return out



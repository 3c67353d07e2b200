"""A run's checkpoints, leftovers, done marker and exit record (seed 001, 004, U6): part of
the run files (bundle.RUN_FILES), sent with runs.py.

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import stat
import sys

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])
runs = base.load_module("runs")


# -------------------------------- checkpoints, leftovers, done marker (seed 001, 004, U6)


def tree_size(path, st, budget):
    """(bytes, newest mtime, capped) of a file or a folder, walking at most budget["files"]
    files in all (a checkpoint folder of shards is summed; a huge one says it was capped).
    Leftover-named files (*.tmp, ...) inside it count for neither."""
    if not os.path.isdir(path):
        return st.st_size, st.st_mtime, False
    total, newest, stack = 0, None, [path]  # files' mtimes, not the folder's: a stray
    while stack:  # file dropped into it later (a leftover, a note) renews the folder's
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            if budget["files"] <= 0:
                return total, st.st_mtime if newest is None else newest, True
            budget["files"] -= 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                    continue
                if runs.leftover(entry.name):
                    continue  # a partial write is not the checkpoint (listed as a leftover)
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            total += info.st_size
            newest = info.st_mtime if newest is None else max(newest, info.st_mtime)
    return total, st.st_mtime if newest is None else newest, False


def checkpoint_rows(paths, budget):
    """[path, mtime, bytes, capped] rows, oldest first; a folder's mtime is its newest file's
    (when the checkpoint was last written) and its size is summed. The newest are measured
    first, so a capped walk leaves the old ones, not the one that matters, unmeasured."""
    stats = []
    for path in paths:
        try:
            stats.append((path, os.stat(path)))
        except OSError:
            continue
    stats.sort(key=lambda item: item[1].st_mtime, reverse=True)
    rows = []
    for path, st in stats:
        size, newest, capped = tree_size(path, st, budget)
        rows.append([path, round(newest, 3), size, capped])
    rows.sort(key=lambda row: row[1])
    return rows


def collect_checkpoints(pattern, limits):
    """The checkpoints a glob matches (files or folders), and `*.tmp`, `*.partial`, `tmp*`
    leftovers among them, beside them (in their folders) or inside checkpoint folders (U6)."""
    matches, capped = runs.expand_glob(pattern, limits["walk_entries"])
    if matches == [pattern] and not os.path.exists(pattern):
        matches = []
    checkpoints, leftovers = [], set()
    for path in matches:
        if runs.leftover(os.path.basename(path.rstrip("/"))):
            leftovers.add(path)
        else:
            checkpoints.append(path)
    folders = {os.path.dirname(path) for path in matches}
    if not matches and not runs.has_glob(os.path.dirname(pattern)):
        folders.add(os.path.dirname(pattern))  # none yet: a leftover may sit where they go
    folders.update(path for path in checkpoints if os.path.isdir(path))
    folders.discard("")
    seen = 0
    for folder in sorted(folders):
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for name in entries:
            seen += 1
            if seen > limits["walk_entries"]:
                capped = True
                break
            if runs.leftover(name):
                leftovers.add(os.path.join(folder, name))
    total = len(checkpoints)
    budget = {"files": limits["ckpt_files"]}
    rows = checkpoint_rows(checkpoints, budget)[-limits["checkpoints"]:]
    out = {"pattern": pattern, "total": total, "items": base.table(runs.CKPT_FIELDS, rows),
           "leftovers": base.table(runs.CKPT_FIELDS,
                              checkpoint_rows(sorted(leftovers), budget)[-limits["leftovers"]:])}
    if capped:
        out["capped"] = True
    return out


def collect_done(path):
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return {"path": path, "exists": False}
    return {"path": path, "exists": True, "mtime": round(st.st_mtime, 3)}


EXIT_RECORD_BYTES = 512


def collect_exit(path):
    """The exit record gpuwatch's launch wrapper writes when a run it relaunched ends
    (act_launch.launch_script): {"v", "run", "code"} with the command's exit status (128+N:
    killed by signal N). Read bounded, as data; "code" only when it is a status (0-255).

    Believed only as the wrapper leaves it: a regular file owned by this login with one link,
    opened without following a link (O_NOFOLLOW) and checked on what was opened (fstat), in a
    real folder of this login's that no other user may write. The workdir may be shared: a
    record another user forged or linked would turn a death into a finish. One that fails is
    this source's error (ignored, and said with the run's death), never read as a status."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return {"path": path, "exists": False}
    except OSError:
        if os.path.islink(path):
            raise base.ProbeFailure("%s is ignored: it is a symbolic link" % path)
        raise
    try:  # the file's checks are on what was opened; its folder's, a second line of defence
        st, up = os.fstat(fd), os.lstat(os.path.dirname(path))
        data = os.read(fd, EXIT_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    me = os.geteuid()
    if (st.st_uid, up.st_uid, st.st_nlink, up.st_mode & 0o170022) != (me, me, 1, 0o40000):
        raise base.ProbeFailure("%s is ignored: not as gpuwatch (uid %d) leaves it: it is uid "
                                "%d's with %d links, its folder uid %d's with mode %o"
                                % (path, me, st.st_uid, st.st_nlink, up.st_uid, up.st_mode))
    if not stat.S_ISREG(st.st_mode) or len(data) > EXIT_RECORD_BYTES:
        raise base.ProbeFailure("%s is not an exit record" % path)
    out = {"path": path, "exists": True, "mtime": round(st.st_mtime, 3)}
    record = base.json_loads(data.decode("utf-8", "replace"))
    code = record.get("code") if isinstance(record, dict) else None
    if isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255:
        out["code"] = code
    return out

"""The probe's own glob (`import glob` pulls in re, 3.7 ms of a poll): sent only to a poll
where a run's path has glob characters (bundle.GLOB).

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])
runs = base.load_module("runs")


def glob_paths(path, cap):
    """glob.iglob(path), sorted (at most cap) → (paths, capped). Written out here: `import
    glob` pulls in re, enum and contextlib, 3.7 ms of every poll of a box whose run names its
    checkpoints by a glob, as discovery names every HuggingFace run's (checkpoint-*): a sixth
    of the probe's CPU there. Sent only to such polls (bundle.GLOB)."""
    absolute = path.startswith("/")
    parts = path.split("/")[1 if absolute else 0:]
    paths, listed = ["/" if absolute else ""], False
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if not part:  # a doubled or trailing slash: glob keeps it, and wants a folder there
            paths = [p + "/" for p in paths if os.path.isdir(p or ".")] if last else paths
            continue
        found = []
        for base in paths:
            if runs.has_glob(part):
                listed = True
                try:
                    entries = list(os.scandir(base or "."))
                except OSError:
                    continue
                for entry in entries:
                    if ((entry.name[0] != "." or part[0] == ".")  # glob skips hidden names
                            and glob_match(entry.name, part)):
                        try:
                            if last or entry.is_dir():
                                found.append(os.path.join(base, entry.name))
                        except OSError:
                            continue
                    if last and len(found) > cap:
                        return sorted(found[:cap]), True
            else:
                joined = os.path.join(base, part)
                if not listed or (os.path.lexists(joined) if last else os.path.isdir(joined)):
                    found.append(joined)
        paths = found
    return sorted(paths[:cap]), len(paths) > cap


def glob_match(name, pattern):
    """fnmatch.fnmatchcase(name, pattern) without re: `*`, `?`, `[seq]`, `[!seq]` (ranges
    a-z; a `[` without its `]` stands for itself)."""
    n = p = 0
    star = None  # (pattern index after the last `*`, the name index it stands at)
    while n < len(name):
        if p < len(pattern) and pattern[p] == "*":
            p += 1
            star = (p, n)
            continue
        after = glob_token(pattern, p, name[n]) if p < len(pattern) else -1
        if after >= 0:
            p, n = after, n + 1
        elif star is not None:  # let the last `*` take one more character, try again
            p, n = star[0], star[1] + 1
            star = (p, n)
        else:
            return False
    return all(c == "*" for c in pattern[p:])


def glob_token(pattern, p, ch):
    """Where the pattern goes on after its token at p if that token matches ch, else -1."""
    c = pattern[p]
    if c == "?":
        return p + 1
    if c == "[":
        j = p + 1
        if j < len(pattern) and pattern[j] == "!":
            j += 1
        if j < len(pattern) and pattern[j] == "]":
            j += 1
        j = pattern.find("]", j)
        if j >= 0:
            chars = pattern[p + 1:j]
            negate = chars[:1] == "!"
            chars = chars[1:] if negate else chars
            k, hit = 0, False
            while k < len(chars) and not hit:
                if k + 2 < len(chars) and chars[k + 1] == "-":
                    hit, k = chars[k] <= ch <= chars[k + 2], k + 3
                else:
                    hit, k = chars[k] == ch, k + 1
            return j + 1 if hit != negate else -1
    return p + 1 if c == ch else -1

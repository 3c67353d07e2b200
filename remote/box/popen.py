"""run_bounded for Pythons without os.posix_spawnp (3.6, 3.7, PyPy): sent only to them
(bundle.POPEN).

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])


def run_bounded_popen(argv, timeout_s):
    """run_bounded for Pythons without os.posix_spawnp (3.6, 3.7): sent only to them."""
    import subprocess

    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        raise base.ProbeFailure("%s not found on PATH" % argv[0], {"missing": True})
    base.CHILDREN.add(child.pid)
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, base.SIGKILL)
            child.communicate(timeout=0.5)
            base.CHILDREN.discard(child.pid)  # reaped: its pid may be another's from now on
        except (OSError, subprocess.TimeoutExpired):
            pass
        raise base.ProbeFailure("%s timed out after %.1fs and was killed" % (argv[0], timeout_s),
                           {"timeout": True})
    base.CHILDREN.discard(child.pid)
    return child.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

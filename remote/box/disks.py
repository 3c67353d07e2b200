"""The disks section (U6, U7).

Python 3.6+, stdlib only: runs on the box (see probe.py).
"""

import os
import sys

base = sys.modules.get("gpuwatch_base") or __import__(__package__ + ".base", fromlist=["_"])


# ---------------------------------------------------------------- disks (U6, U7)

def unescape_mount(field):
    """/proc/mounts escapes space, tab, newline and backslash as octal."""
    if "\\" not in field:
        return field
    return base.rx(r"\\([0-7]{3})").sub(lambda m: chr(int(m.group(1), 8)), field)


def mount_points():
    for name in (("self", "mounts"), ("mounts",)):
        try:
            text = base.read_text(base.proc_path(*name))
        except OSError:
            continue
        points = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 2 and not line.startswith("#"):
                points.append(unescape_mount(parts[1]))
        return points
    return []


def mount_of(path, points):
    """The longest mount point that is a prefix of path."""
    best = None
    for point in points:
        prefix = point.rstrip("/") + "/"
        # >=: a later mount on the same point shadows the earlier one
        if (path == point or path.startswith(prefix)) and (best is None or len(point) >= len(best)):
            best = point
    return best


SIM_DISK_KEYS = ("bytes_total", "bytes_free", "inodes_total", "inodes_free")


def simulated_disks():
    """Only for gpuwatch's simulator, never on a real box: $GPUWATCH_SIM_DIR/statvfs.json maps
    a configured disk path to {"bytes_total", "bytes_free", "inodes_total", "inodes_free"},
    which replace statvfs for that path (the demo's disk filling toward full: a simulator
    cannot shrink a real filesystem). {} when unset, missing or unreadable."""
    if not base.SIM_DIR:
        return {}
    try:
        data = base.json_loads(base.read_text(os.path.join(base.SIM_DIR, "statvfs.json")))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def collect_disks(paths):
    points = mount_points()
    simulated = simulated_disks()
    disks = []
    for path in paths:
        if not isinstance(path, str):
            continue
        real = os.path.realpath(os.path.expanduser(path))
        fake = simulated.get(path)
        if isinstance(fake, dict):  # a filesystem of its own: its mount is itself
            mount = fake.get("mount")
            disk = {"path": path, "mount": mount if isinstance(mount, str) else path}
            for key in SIM_DISK_KEYS:
                value = fake.get(key)
                disk[key] = value if isinstance(value, int) and not isinstance(value, bool) \
                    else None
            disks.append(disk)
            continue
        try:
            st = os.statvfs(real)
        except OSError as exc:
            disks.append({"path": path, "error": base.describe(exc)})
            continue
        disks.append({
            "path": path, "mount": mount_of(real, points),
            "bytes_total": st.f_blocks * st.f_frsize,
            "bytes_free": st.f_bavail * st.f_frsize,  # what a non-root writer can still use
            "inodes_total": st.f_files or None,  # 0: the filesystem does not count inodes
            "inodes_free": st.f_favail if st.f_files else None,
        })
    return disks



"""Fixture boxes for the probe: a box root (proc/, sys/, etc/, bin/) in the formats the kernel
and the tools write, with minimal stand-ins for `nvidia-smi` and `dmesg` on PATH, and the probe
run on one as the SSH path runs it: `sh -c <command>` with the bundle on stdin."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from gpuwatch.remote.wire.bundle import build_command, build_stdin

from harness.captures import capture

BTIME = 1_700_000_000
BOOT_ID = "3f1c2a9e-5b7d-4e21-9a0c-6d8e4f2b1a77"
TTY_PTS0, TTY_PTS1 = 34816, 34817  # major 136 (pts), minors 0 and 1
UUIDS = [f"GPU-{i:08x}-1111-2222-3333-{i:012x}" for i in range(8)]
# the exporter's H100 MIG capture (driver 590): GPU 2's instances on the fixture box
H100_MIG = "nvidia-smi/exporter-captures/linux-x86_64__nvidia-h100-mig__590.48.01"


class Box:
    """A box root: proc/, sys/, etc/, bin/ in the formats the kernel and tools write."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc, self.sys, self.etc, self.bin = (root / d for d in ("proc", "sys", "etc", "bin"))
        self.write("proc/stat", f"cpu  4705 356 584 3699 23 23 0 0 0 0\nbtime {BTIME}\n")
        self.write("proc/uptime", "86400.25 170000.50\n")
        self.write("proc/loadavg", "3.10 2.95 2.80 4/312 4242\n")
        self.write("proc/sys/kernel/random/boot_id", BOOT_ID + "\n")
        self.write("proc/sys/kernel/hostname", "gpu-box-7\n")

    def write(self, rel: str, text: str) -> Path:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def process(self, pid: int, comm: str, ppid: int, *, cmd: list[str] | None = None,
                state: str = "S", uid: int = 0, tty: int = 0, session: int | None = None,
                threads: int = 1, start: int = 500_000, kthread: bool = False,
                sigign: int = 0, sigcgt: int = 0, fds: tuple[str, ...] = ()) -> None:
        flags = 0x00200040 if kthread else 0x00400100
        session = pid if session is None else session
        after_start = " ".join(["0"] * 32)
        self.write(f"proc/{pid}/stat",
                   f"{pid} ({comm}) {state} {ppid} {pid} {session} {tty} -1 {flags} 0 0 0 0 "
                   f"12 3 0 0 20 0 {threads} 0 {start} {after_start}\n")
        self.write(f"proc/{pid}/status",
                   f"Name:\t{comm[:15]}\nState:\t{state} (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\n"
                   f"PPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                   f"Threads:\t{threads}\nSigQ:\t0/63382\nSigPnd:\t0000000000000000\n"
                   f"SigBlk:\t0000000000000000\nSigIgn:\t{sigign:016x}\nSigCgt:\t{sigcgt:016x}\n")
        (self.proc / str(pid) / "cmdline").write_bytes(
            b"" if cmd is None else b"\0".join(c.encode() for c in cmd) + b"\0")
        self.write(f"proc/{pid}/cgroup", "0::/user.slice/user-1000.slice/session-3.scope\n")
        fd_dir = self.proc / str(pid) / "fd"
        fd_dir.mkdir()
        if state != "Z":
            (self.proc / str(pid) / "cwd").symlink_to("/data/llama")
            (self.proc / str(pid) / "exe").symlink_to("/usr/bin/python3.10")
        for n, target in enumerate(("/dev/null", "pipe:[4242]", *fds)):
            (fd_dir / str(n)).symlink_to(target)

    def tool(self, name: str, script: str) -> None:
        path = self.bin / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)

    def env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin}:/usr/bin:/bin", "GPUWATCH_PROCFS": str(self.proc),
                "GPUWATCH_SYSFS": str(self.sys), "GPUWATCH_ETC": str(self.etc)}


# the probe's query, answered as driver 580 answers it (an H200's real answer:
# tests/captures/h200-driver580/health): the memory health and PCIe fields after
# persistence_mode, all healthy here
GPU_CSV = """\
0, {}, NVIDIA H100 80GB HBM3, 100, 70211, 81559, 1980, 1980, 652.31, 700.00, 61, 0x0000000000000000, Disabled, 00000000:1B:00.0, Enabled, 0, 0, 0, 0, [N/A], [N/A], [N/A], 0, 0, No, No, 0, 0, 0, 0, 640, None, 5, 5, 16, 16
1, {}, NVIDIA H100 80GB HBM3, 98, 70105, 81559, 1410, 1980, 699.87, 700.00, 86, 0x0000000000000044, Disabled, 00000000:43:00.0, Enabled, 0, 0, 0, 0, [N/A], [N/A], [N/A], 0, 0, No, No, 0, 0, 0, 0, 640, None, 5, 5, 16, 16
2, {}, NVIDIA H100 80GB HBM3, [N/A], 11125, 81559, 1980, 1980, 433.78, 700.00, 53, 0x0000000000000000, Enabled, 00000000:52:00.0, Enabled, 0, 0, 0, 0, [N/A], [N/A], [N/A], 0, 0, No, No, 0, 0, 0, 0, 640, None, 5, 5, 16, 16
3, {}, NVIDIA H100 80GB HBM3, 97, 69988, 81559, 1980, 1980, [Not Supported], [Not Supported], 60, 0x0000000000000000, Disabled, 00000000:61:00.0, Enabled, 0, 0, 0, 0, [N/A], [N/A], [N/A], 0, 0, No, No, 0, 0, 0, 0, 640, None, 5, 5, 16, 16
4, {}, NVIDIA H100 80GB HBM3, 0, 1, 81559, 345, 1980, 71.02, 700.00, 31, 0x0000000000000001, Disabled, 00000000:9D:00.0, Disabled, 0, 0, 0, 0, [N/A], [N/A], [N/A], 0, 0, No, No, 0, 0, 0, 0, 640, None, 5, 5, 16, 16
5, {}, NVIDIA H100 80GB HBM3, 99, 70002, 81559, 1980, 1980, 640.55, 700.00, [Unknown Error], 0x0000000000000000, Disabled, 00000000:C3:00.0, Enabled, 0, 0, 0, 0, [N/A], [N/A], [N/A], 0, 0, No, No, 0, 0, 0, 0, 640, None, 5, 5, 16, 16
6, {}, NVIDIA H100 80GB HBM3, 100, 70430, 81559, 1755, 1980, 700.12, 700.00, 79, 0x0000000000000004, Disabled, 00000000:D1:00.0, Enabled, 0, 0, 0, 0, [N/A], [N/A], [N/A], 0, 0, No, No, 0, 0, 0, 0, 640, None, 5, 5, 16, 16
7, {}, NVIDIA H100 80GB HBM3, ERR!, 70311, 81559, 1980, 1980, 645.90, 700.00, 63, [N/A], [N/A], 00000000:DF:00.0, [N/A], 0, 0, 0, 0, [N/A], [N/A], [N/A], 0, 0, No, No, 0, 0, 0, 0, 640, None, 5, 5, 16, 16
""".format(*UUIDS)  # noqa: E501

APPS_CSV = "".join(f"{UUIDS[i]}, {pid}, 70000, python3.10\n" for i, pid in
                   [(0, 830)] + [(i, 920 + i) for i in range(1, 8)]) + \
    f"{UUIDS[3]}, 1100, 1200, evil, name\n{UUIDS[5]}, 4242, 900, /usr/bin/python3\n"

DMESG = """\
[    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075)
[ 4521.118263] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
[ 4522.000101] NVRM: Xid (PCI:0000:9b:00): 13, pid=921, name=python3.10, Graphics Exception: ESR 0x50cfb0=0x12e000e
[ 5012.554310] python3.10 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0
[ 5012.554402] memory: usage 16777216kB, limit 16777216kB, failcnt 402
[ 5012.554403] swap: usage 0kB, limit 0kB, failcnt 0
[ 5012.554530] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/user.slice,task_memcg=/user.slice/session-3.scope,task=pt_data_worker,pid=930,uid=1000
[ 5012.554601] Memory cgroup out of memory: Killed process 930 (pt_data_worker) total-vm:9834216kB, anon-rss:8123400kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:16420kB oom_score_adj:0
"""  # noqa: E501


def build_box(root: Path) -> Box:
    """An 8-GPU box in steady state: a tty-bound run, a torchrun under tmux with 7 ranks and
    a dataloader worker, a zombie, a nohup'd orphan holding a GPU, and 60 idle processes."""
    box = Box(root)
    box.process(1, "systemd", 0, cmd=["/sbin/init"], start=1)
    box.process(2, "kthreadd", 0, kthread=True, start=1)
    box.process(3, "rcu_gp", 2, kthread=True, start=1)
    box.process(800, "sshd", 1, cmd=["sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups"])
    box.process(810, "sshd", 800, cmd=["sshd: alice@pts/0"], uid=1000)
    box.process(820, "bash", 810, cmd=["-bash"], uid=1000, tty=TTY_PTS0)
    box.process(830, "python3.10", 820, uid=1000, tty=TTY_PTS0, session=820, threads=42,
                cmd=["python3.10", "train.py", "--config", "cfg/llama.yaml"],
                fds=("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"), start=7_200_000)
    box.process(900, "tmux: server", 1, cmd=["tmux", "new", "-s", "train"], uid=1000)
    box.process(910, "bash", 900, cmd=["-bash"], uid=1000, tty=TTY_PTS1)
    box.process(920, "torchrun", 910, uid=1000, tty=TTY_PTS1, session=910,
                cmd=["/usr/bin/python3.10", "/usr/local/bin/torchrun", "--nproc_per_node", "7",
                     "pretrain.py", "--resume"])
    for rank in range(1, 8):
        box.process(920 + rank, "pt_main_thread", 920, uid=1000, tty=TTY_PTS1, session=910,
                    threads=64, cmd=["/usr/bin/python3.10", "-u", "pretrain.py", "--resume"],
                    fds=("/dev/nvidiactl", f"/dev/nvidia{rank}"))
    box.process(930, "pt_data_worker", 921, uid=1000, session=910, threads=4,
                cmd=["/usr/bin/python3.10", "-u", "pretrain.py", "--resume"])
    box.process(1000, "pt_data_worker", 921, state="Z", uid=1000, session=910)
    box.process(1100, "evil ) (name x", 1, uid=1000, sigign=0x1, session=1090,
                cmd=["python3", "evil ) (name x.py"], fds=("/dev/nvidia3",))
    box.process(1300, "fd-hog", 1, cmd=["fd-hog"], fds=tuple(f"/tmp/f{i}" for i in range(20)))
    for pid in range(2000, 2060):
        box.process(pid, "sleep", 1, cmd=["sleep", "infinity"])
    box.write("proc/self/cgroup", "0::/user.slice/user-1000.slice/session-3.scope\n")
    box.write("proc/mounts", f"/dev/root / ext4 rw,relatime 0 0\nproc /proc proc rw 0 0\n"
                             f"/dev/nvme1n1 {root.parent} xfs rw,noatime 0 0\n"
                             f"cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n")
    group = "sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope"
    box.write(f"{group}/memory.current", "57982439424\n")
    box.write(f"{group}/memory.max", "max\n")
    box.write(f"{group}/memory.events",
              "low 0\nhigh 0\nmax 14\noom 2\noom_kill 1\noom_group_kill 0\n")
    box.write(f"{group}/cpu.max", "400000 100000\n")
    box.write(f"{group}/cpu.stat", "usage_usec 982341\nuser_usec 900000\nsystem_usec 82341\n"
                                   "nr_periods 2914\nnr_throttled 222\nthrottled_usec 2261444\n")
    box.write("etc/systemd/logind.conf", "[Login]\n#KillUserProcesses=no\nKillUserProcesses=yes\n")
    box.write("etc/systemd/logind.conf.d/50-keep.conf", "[Login]\nKillUserProcesses=no\n")
    box.write("gpus.csv", GPU_CSV)
    box.write("apps.csv", APPS_CSV)
    box.write("dmesg.log", DMESG)
    box.tool("dmesg", f'cat "{root}/dmesg.log"\n')
    table, listed = mig_outputs()
    box.write("table.txt", table)
    box.write("list.txt", listed)
    box.tool("nvidia-smi", f'echo "$1" >> "{root}/smi.calls"\n'
                           f'case "$1" in\n'
                           f'  --query-gpu=*) cat "{root}/gpus.csv" ;;\n'
                           f'  --query-compute-apps=*) cat "{root}/apps.csv" ;;\n'
                           f'  "") cat "{root}/table.txt" ;;\n'
                           f'  -L) cat "{root}/list.txt" ;;\n'
                           f'esac\n')
    return box


def mig_outputs() -> tuple[str, str]:
    """GPU 2 (MIG on) as `nvidia-smi` and `nvidia-smi -L` print it: the exporter's H100 MIG
    capture (driver 590) with its GPU index 2, and its load's processes replaced by this box's
    pid 922 (python3.10, 70000 MiB) in GPU instance 2."""
    real = (capture() / H100_MIG / "load__table.txt").read_text()
    lines = []
    for line in real.splitlines():
        if line.startswith("|  0 "):
            line = "|  2 " + line[5:]
        if line.startswith("|    0    2    0"):
            if "21180" not in line:
                continue
            line = line.replace("    0    2    0            21180", "    2    2    0" + "922".rjust(
                17)).replace("/root/tools/memhog", "python3.10".ljust(18)).replace(
                "    2296MiB", "   70000MiB")
        lines.append(line)
    listed = (capture() / H100_MIG / "capabilities__list-L.txt").read_text()
    return "\n".join(lines) + "\n", listed.replace("GPU 0: ", "GPU 2: ", 1).replace(
        "GPU-00000000-0000-0000-0000-000000000000", UUIDS[2])


REQUEST = {"v": 1, "disks": [], "runs": [{"name": "llama", "process": "train.py"},
                                         {"name": "pretrain", "process": "pretrain.py"}],
           "limits": {"fds_per_proc": 16}, "nvidia_smi_timeout_s": 5,
           "want": {"nvml": False}}  # a box with a real driver must still read the stand-in


def run_probe(request: dict, env: dict[str, str], python: str = sys.executable,
              timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["sh", "-c", build_command(python)], input=build_stdin(request),
                          env=env, capture_output=True, timeout=timeout)


def probe_doc(request: dict, env: dict[str, str], python: str = sys.executable) -> dict:
    result = run_probe(request, env, python)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def rows(tbl: dict) -> list[dict]:
    return [dict(zip(tbl["fields"], row, strict=True)) for row in tbl["rows"]]


def box_request(box: Box, **changes) -> dict:
    return {**REQUEST, "disks": [str(box.root), "/no/such/disk"], **changes}


def python36() -> str:
    # pyenv's shim on PATH answers 127 unless 3.6 is selected: ask for the install itself
    installs = sorted(Path.home().glob(".pyenv/versions/3.6*/bin/python"))
    found = installs[0] if installs else shutil.which("python3.6")
    if found is None:
        pytest.skip("no Python 3.6 interpreter here; vermin checks the syntax instead")
    return str(found)

"""Kernel log lines in the formats real kernels print, for the simulated box's dmesg.log.

Shapes follow captured logs (NVIDIA's NVRM Xid reports, the OOM killer's summary, the memory
cgroup OOM); every number and name comes from the caller, so tests state what they mean.
"""

from __future__ import annotations

# Xid codes a reader of dmesg most needs (U22): 48 and 79 mean the GPU needs a reset or a
# replacement; 13/31/43 are usually the application's fault.
XID_MEANING = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
        "0x7f_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        "at physAddr 0x12bac1c3e0 partition 2, subpartition 1.",
    63: "Row Remapper: New row (0x00000012bac1c3e0) marked for remapping, reset gpu to activate.",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
         "(GSP_RM_CONTROL) (0x20801813 0x4c).",
}


def stamp(uptime_s: float) -> str:
    """The kernel's own prefix: seconds since boot, microseconds, right-aligned in 5+7."""
    return f"[{uptime_s:12.6f}]"


def pci_of(bus_id: str) -> str:
    """NVRM's short PCI name, "0000:3b:00", from nvidia-smi's "00000000:3B:00.0"."""
    domain, bus, rest = bus_id.split(":")
    return "{:04x}:{}:{}".format(int(domain, 16), bus.lower(), rest.split(".")[0].lower())


def xid(uptime_s: float, bus_id: str, code: int, *, pid: int | None = None,
        name: str | None = None, detail: str | None = None) -> str:
    """An NVRM Xid report; pid/name unknown print as the driver does ('<unknown>')."""
    who = "pid={}, name={}".format(pid if pid is not None else "'<unknown>'",
                                name if name is not None else "<unknown>")
    text = detail if detail is not None else XID_MEANING.get(code, "")
    return f"{stamp(uptime_s)} NVRM: Xid (PCI:{pci_of(bus_id)}): {code}, {who}, {text}"


def oom_kill(uptime_s: float, pid: int, comm: str, *, uid: int = 1000,
             total_vm_kb: int = 98765432, anon_rss_kb: int = 61234567, cgroup: bool = False,
             memcg: str = "/", limit_kb: int | None = None) -> list[str]:
    """The OOM killer's lines: the constraint, then the kill (kernel 5.x+ wording).

    cgroup=True is a memory cgroup OOM (the limit of memcg was hit, U41), else the kernel's;
    with limit_kb it starts with mm/memcontrol.c's "memory: usage %llukB, limit %llukB, failcnt
    %lu", as a real memory cgroup report does.
    """
    ts = stamp(uptime_s)
    usage = ([f"{ts} memory: usage {limit_kb}kB, limit {limit_kb}kB, failcnt 1"]
             if cgroup and limit_kb is not None else [])
    if cgroup:
        constraint = ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,"
                      f"mems_allowed=0,oom_memcg={memcg},task_memcg={memcg},task={comm},"
                      f"pid={pid},uid={uid}")
        verb = "Memory cgroup out of memory"
    else:
        constraint = ("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,"
                      f"mems_allowed=0,global_oom,task_memcg={memcg},task={comm},pid={pid},"
                      f"uid={uid}")
        verb = "Out of memory"
    kill = (f"{verb}: Killed process {pid} ({comm}) total-vm:{total_vm_kb}kB, "
            f"anon-rss:{anon_rss_kb}kB, file-rss:0kB, shmem-rss:0kB, UID:{uid} "
            "pgtables:123456kB oom_score_adj:0")
    return [*usage, f"{ts} {constraint}", f"{ts} {kill}"]


def memcg_oom_v4(uptime_s: float, pid: int, comm: str, *, memcg: str, limit_kb: int,
                 task_memcg: str | None = None, score: int = 1000,
                 total_vm_kb: int = 98765432, anon_rss_kb: int = 61234567) -> list[str]:
    """A memory cgroup OOM report as kernels before 4.19 printed it (no "oom-kill:" line):
    mm/memcontrol.c's "Task in %s killed as a result of limit of %s" and "memory: usage
    %llukB, limit %llukB, failcnt %lu" (v1: then memory+swap and kmem), then mm/oom_kill.c's
    "%s: Kill process %d (%s) score %u or sacrifice child" and "Killed process %d (%s)
    total-vm:%lukB, anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB"."""
    ts = stamp(uptime_s)
    return [
        f"{ts} Task in {task_memcg or memcg} killed as a result of limit of {memcg}",
        f"{ts} memory: usage {limit_kb}kB, limit {limit_kb}kB, failcnt 7",
        f"{ts} memory+swap: usage {limit_kb}kB, limit 9007199254740988kB, failcnt 0",
        f"{ts} kmem: usage 20480kB, limit 9007199254740988kB, failcnt 0",
        f"{ts} Memory cgroup stats for {memcg}: cache:0KB rss:{limit_kb}KB",
        f"{ts} Memory cgroup out of memory: Kill process {pid} ({comm}) score {score} or "
        "sacrifice child",
        f"{ts} Killed process {pid} ({comm}) total-vm:{total_vm_kb}kB, anon-rss:{anon_rss_kb}kB, "
        "file-rss:0kB, shmem-rss:0kB",
    ]

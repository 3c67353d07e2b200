"""Which GPUs a relaunch starts on: never one the driver or the kernel log says is broken
(findings.gpu_health.unusable_gpus, U22); the run's command offered on free healthy GPUs
instead (CUDA_VISIBLE_DEVICES), or refused with why and what to wait for."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..findings.gpu_health import unusable_gpus
from ..model.history import HostHistory
from ..model.processes import gpus_of
from ..model.snapshot import GpuSample, HostSnapshot

VISIBLE = "CUDA_VISIBLE_DEVICES"
ORDER = "CUDA_DEVICE_ORDER"
"""CUDA numbers GPUs fastest first unless told PCI_BUS_ID, nvidia-smi by PCI bus: a relaunch
moved to other GPUs sets both, so its indexes are the ones the person saw."""


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """What the run's GPUs say of a relaunch: `env` to start it with (the run's own where it
    walks into no broken GPU), notes for the plan, or why it cannot start now."""

    env: tuple[tuple[str, str], ...]
    notes: tuple[str, ...] = ()
    refusal: str | None = None
    moved: tuple[int, ...] = ()
    """The GPUs it was moved to (empty: it starts where it would have)."""


def _indexes(value: str, snap: HostSnapshot) -> list[int] | None:
    """CUDA_VISIBLE_DEVICES → nvidia-smi indexes: numbers, GPU UUIDs the snapshot lists, or a
    MIG instance's UUID (its GPU's index); None where an entry is none of these (a typo)."""
    out = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        if part.isdecimal():
            out.append(int(part))
            continue
        gpu = next((g for g in snap.gpus if (g.uuid and g.uuid.lower() == part.lower())
                    or any(m.uuid and m.uuid.lower() == part.lower()
                           for m in g.mig_instances)), None)
        if gpu is None:
            return None
        out.append(gpu.index)
    return out


def run_gpus(history: HostHistory, name: str, env: Mapping[str, str]) -> list[int] | None:
    """The GPUs the run uses, by index: what its CUDA_VISIBLE_DEVICES names, else those its
    processes held the last time a poll saw them alive; None where neither says."""
    snap = history.current
    if snap is not None and env.get(VISIBLE) is not None:
        return _indexes(env[VISIBLE], snap)
    for old in reversed(list(history.snapshots)):
        sample = next((r for r in old.runs if r.name == name and r.pids), None)
        if sample is not None:
            return sorted(gpus_of(sample.pids, old))
    return None


def _free(snap: HostSnapshot, gpu: GpuSample, unattributed_mib: int) -> bool:
    """No process on it (the driver's list, or a process with its /dev/nvidiaN open), and no
    more memory held than a process nobody lists would (U11)."""
    if any(p.gpu_index == gpu.index for p in snap.gpu_processes):
        return False
    if any(p.gpu_index == gpu.index or gpu.index in (p.nvidia_devs or ())
           for p in snap.processes):
        return False
    return gpu.mem_used_mib is None or gpu.mem_used_mib < unattributed_mib


def _flawed(gpu: GpuSample) -> str | None:
    """Why a GPU that is not broken is still no place to move a run to."""
    if gpu.mig:
        return "MIG is on (a run addresses its instances, not the GPU)"
    if gpu.ecc is not None and gpu.ecc.uncorrected_volatile:
        return "it had uncorrected memory errors"
    return None


def _gpus(indexes: Sequence[int]) -> str:
    return ("GPU " if len(indexes) == 1 else "GPUs ") + ", ".join(map(str, indexes))


def choose_gpus(history: HostHistory, name: str, env: tuple[tuple[str, str], ...],
                command: str, *, elsewhere: bool = True, how: str = "") -> GpuChoice:
    """The GPUs run `name` starts on. Where none of its GPUs is broken, its own env, as it
    is. Where one is (or the run's GPUs are not known and a GPU of the box is broken: a CUDA
    process sees every GPU), the run's command on as many free healthy GPUs as it used
    (its own healthy ones first), with CUDA_VISIBLE_DEVICES; with `elsewhere` False (the
    watchdog, which asks nobody) a refusal that says `how` a person starts it there."""
    snap = history.current
    broken = unusable_gpus(history)
    if snap is None or not broken:
        return GpuChoice(env)
    own = dict(env)
    mine = run_gpus(history, name, own)
    if mine is not None and not set(mine) & set(broken):
        return GpuChoice(env)
    hit = sorted(set(mine or broken) & set(broken))
    why = "; ".join(f"GPU {i} {broken[i]}" for i in hit)
    unattributed = history.thresholds.zombie_unattributed_mib
    healthy = [g for g in snap.gpus if g.index not in broken and _flawed(g) is None]
    free = [g.index for g in healthy if _free(snap, g, unattributed)]
    free.sort(key=lambda i: (i not in (mine or ()), i))  # its own healthy GPUs first
    need = len(mine) if mine else None
    if not free or (need is not None and len(free) < need):
        have = f"only {_gpus(free)} {'is' if len(free) == 1 else 'are'}" if free else "no GPU is"
        wanted = f" of the {need} it used" if need else ""
        return GpuChoice(env, refusal=(
            f"{why}: a new process there fails or computes with bad memory; {have} free and "
            f"healthy{wanted}: wait for one to free up (or fix the GPU: reset it, or reboot)"))
    chosen = sorted(free[:need] if need else free)
    if re.search(rf"\b{VISIBLE}\s*=", command):
        return GpuChoice(env, refusal=(
            f"{why}; its command sets {VISIBLE} itself, so gpuwatch cannot move it: edit the "
            f"relaunch command to use {_gpus(chosen)} (free and healthy)"))
    if not elsewhere:
        return GpuChoice(env, refusal=(
            f"{why}; not moved to other GPUs without a person: {how or 'a relaunch'} offers "
            f"it on {_gpus(chosen)} (free and healthy)"))
    value = ",".join(map(str, chosen))
    moved = tuple((k, v) for k, v in env if k not in (VISIBLE, ORDER))
    note = (f"{why}: not used; the run starts on {_gpus(chosen)} instead ({VISIBLE}={value}: "
            f"no process and no error on {'it' if len(chosen) == 1 else 'them'})")
    if mine is None:
        note += "; its GPUs are not known (never seen running), so it gets every free one"
    return GpuChoice(tuple(sorted((*moved, (VISIBLE, value), (ORDER, "PCI_BUS_ID")))),
                     (note,), moved=tuple(chosen))

"""Reports of one poll of every host: JSON (schema gpuwatch/1), a compact text table for cron
mail, and the Prometheus text exposition format. Pure functions of the poll's outcome.

Box text (run names, finding messages that quote command lines and paths) reaches a terminal
through the text and Prometheus reports, so it goes through textsafe.visible there; JSON needs
nothing (json.dumps writes every control character as \\u001b)."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .findings.curve_tags import LOSS_NAMES, pick
from .model.finding import Finding, Severity
from .model.slurm_job import JobsReport
from .model.snapshot import GpuSample, HostSnapshot, ProcessInfo
from .textsafe import visible
from .units import mib_pair
from .verdict import LEVELS, Verdict, verdict_of
from .wire.collect import PollOutcome

SCHEMA = "gpuwatch/1"
EXIT_OK, EXIT_FINDING, EXIT_UNPOLLED = 0, 1, 2


def load_schema() -> dict[str, Any]:
    """The JSON Schema of `--once --json`, shipped in the package."""
    from importlib import resources  # 2.5 ms (tempfile, shutil, bz2, lzma): only when asked

    text = resources.files("gpuwatch.remote").joinpath("gpuwatch-1.schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


@dataclass(frozen=True, slots=True)
class HostReport:
    """One host's part of a report: the poll's outcome and what the rules found."""

    outcome: PollOutcome
    findings: Sequence[Finding] = ()
    runs: Sequence[dict[str, Any]] = field(default_factory=tuple)
    """Run objects as the JSON schema has them (built by the runs layer)."""
    zombies: Mapping[int, str] = field(default_factory=dict)
    """pid → why it holds VRAM for nothing (zombies.REASONS), for the processes' `zombie`."""
    judged: Verdict | None = None
    """The host's one verdict, as the pipeline gave it when the poll landed."""

    @property
    def verdict(self) -> Verdict:
        """The host's one verdict (remote/verdict.py): what every output says of it."""
        if self.judged is not None:
            return self.judged
        out = self.outcome
        return verdict_of(self.findings, "ok" if out.ok else "unreachable",
                          failure=(out.error_kind, out.error_message))

    @property
    def name(self) -> str:
        return self.outcome.host.name

    @property
    def snapshot(self) -> HostSnapshot | None:
        return self.outcome.snapshot


def exit_code(reports: Iterable[HostReport], fail_on: Severity) -> int:
    """0 healthy; 1 a finding at or above fail_on; 2 a host could not be polled (wins)."""
    reports = list(reports)
    if any(not r.outcome.ok for r in reports):
        return EXIT_UNPOLLED
    if any(f.severity >= fail_on for r in reports for f in r.findings):
        return EXIT_FINDING
    return EXIT_OK


# --- JSON ----------------------------------------------------------------------------------

def host_json(report: HostReport) -> dict[str, Any]:
    outcome, snap = report.outcome, report.snapshot
    return {
        "name": report.name,
        "ssh": outcome.host.ssh,
        "group": outcome.host.group,
        "ok": outcome.ok,
        "error": outcome.error_json(),
        "poll_s": round(outcome.poll_s, 4),
        "boot_id": snap.boot_id if snap else None,
        "uptime_s": snap.uptime_s if snap else None,
        "gpus": [g.to_json() for g in snap.gpus] if snap else [],
        "gpu_query_s": snap.gpu_query_s if snap else None,
        "gpu_error": snap.gpu_error.to_json() if snap and snap.gpu_error else None,
        "processes": [_process_json(p, report.zombies) for p in snap.processes] if snap else [],
        "disks": [d.to_json() for d in snap.disks] if snap else [],
        "runs": list(report.runs),
        "findings": [f.to_json() for f in report.findings],
        "verdict": report.verdict.to_json(),
    }


def _process_json(proc: ProcessInfo, zombies: Mapping[int, str]) -> dict[str, Any]:
    """A process as the schema has it; `zombie` says why it holds VRAM for nothing where the
    rules found so (orphaned, defunct: U11; an invisible holder is in no process list), else
    "defunct" for any <defunct>; `cpu_pct` (the judged snapshot's, as the history worked it
    out) is null on the first poll that lists it."""
    doc = proc.to_json()
    reason = zombies.get(proc.pid)
    if reason is not None:
        doc["zombie"] = reason
    return doc


def document(reports: Iterable[HostReport], generated_at: float | None = None,
             jobs: JobsReport | None = None) -> dict[str, Any]:
    doc = {"schema": SCHEMA,
           "generated_at": round(time.time() if generated_at is None else generated_at, 3),
           "hosts": [host_json(r) for r in reports]}
    if jobs is not None:  # [slurm] (docs/json.md, "jobs")
        doc["jobs"] = jobs.to_json()
    return doc


def to_json_text(doc: dict[str, Any]) -> str:
    # allow_nan=False: a NaN must never leave as bare `NaN`, which is not JSON.
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


# --- text ----------------------------------------------------------------------------------

def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def _gpu_cell(snap: HostSnapshot) -> str:
    """Per GPU `util%/SM%` (SM clock as % of max: util% alone lies, U21)."""
    cells = []
    for g in snap.gpus:
        sm = (100 * g.sm_clock_mhz / g.sm_clock_max_mhz
              if g.sm_clock_mhz is not None and g.sm_clock_max_mhz else None)
        if g.mig:  # the driver reports no util under MIG: its instances are counted instead
            cells.append(f"{g.index}:MIG {len(g.mig_instances)} inst/{_num(sm)}")
            continue
        cells.append(f"{g.index}:{_num(g.util_pct)}/{_num(sm)}")
    err = snap.gpu_error
    if err is not None:  # never "no GPU" for GPUs that could not be read
        cells.append(err.summary.upper())
    return " ".join(cells) or "no GPU"


def _vram_cell(snap: HostSnapshot) -> str:
    used = [g.mem_used_mib for g in snap.gpus if g.mem_used_mib is not None]
    total = [g.mem_total_mib for g in snap.gpus if g.mem_total_mib is not None]
    if not total:
        return "-"
    return mib_pair(sum(used), sum(total))


STATE_WIDTH = 40
"""The text report's STATE column at most (the findings below say the rest)."""


def state_cell(verdict: Verdict) -> str:
    """A verdict in the text report's STATE column: "ok", else its severity and headline
    ("CRITICAL run died: OOM-killed"), cut to STATE_WIDTH."""
    if verdict.severity is None or verdict.headline == "ok":
        return verdict.headline if verdict.state == "ok" else visible(verdict.headline)
    text = f"{verdict.label.upper()} {verdict.headline}"
    text += f" +{verdict.more}" if verdict.more else ""
    return visible(text if len(text) <= STATE_WIDTH else text[:STATE_WIDTH - 1] + "…")


def text_report(reports: Sequence[HostReport], generated_at: float | None = None,
                jobs: JobsReport | None = None) -> str:
    """A compact table for a cron mail body, then every finding in one line each."""
    when = time.strftime("%Y-%m-%d %H:%M:%S",
                         time.localtime(time.time() if generated_at is None else generated_at))
    findings = [(r.name, f) for r in reports for f in r.findings]
    down = sum(not r.outcome.ok for r in reports)
    counts = {s: sum(f.severity == s for _, f in findings) for s in Severity}
    summary = (f"gpuwatch {when}: {len(reports)} host{'s' * (len(reports) != 1)}, "
               f"{down} not polled, {counts[Severity.CRITICAL]} critical, "
               f"{counts[Severity.WARNING]} warning")
    rows = [("HOST", "STATE", "POLL", "GPU util%/SM%", "VRAM", "RUNS")]
    for r in reports:
        snap = r.snapshot
        runs = visible(" ".join(f"{run['name']}:{run['status']}" for run in r.runs)) or "-"
        state = state_cell(r.verdict)
        if snap is None:
            rows.append((visible(r.name), state, f"{r.outcome.poll_s:.1f}s", "-", "-", runs))
        else:
            rows.append((visible(r.name), state, f"{r.outcome.poll_s:.1f}s", _gpu_cell(snap),
                         _vram_cell(snap), runs))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [summary, ""]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    if findings:
        lines.append("")
        for name, f in sorted(findings, key=lambda x: -x[1].severity):
            lines.append(visible(f"{f.severity.label.upper():8} {name}  {f.code}: {f.message}"))
    if jobs is not None:
        lines += _jobs_text(jobs)
    return "\n".join(lines) + "\n"


def _jobs_text(jobs: JobsReport) -> list[str]:
    """[slurm]'s jobs under the hosts: one line each, what is wrong with it after."""
    if not jobs.ok:
        error = jobs.error or {}
        return ["", visible(f"jobs on {jobs.host}: not read ({error.get('kind')}: "
                            f"{error.get('message')})")]
    rows = [("JOB", "NAME", "STATE", "NODES", "RUN", "WHY")]
    for view in jobs.jobs:
        j = view.job
        run = f"{view.run.host}:{view.run.run}" if view.run else "-"
        rows.append((j.job_id, j.name[:24], j.state, (j.node_list or "-")[:24], run,
                     view.why or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    out = ["", f"jobs on {jobs.host} (Slurm {jobs.version}, {jobs.via}): {len(jobs.jobs)}"]
    out += [visible("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)),
                               row[-1]]).rstrip()) for row in rows]
    out += [visible(f"{f.severity.label.upper():8} job {v.job.job_id}  {f.code}: {f.message}")
            for v in jobs.jobs for f in v.findings if f.severity >= Severity.WARNING]
    out += [visible(f"problem: {p}") for p in jobs.problems]
    return out


# --- Prometheus ----------------------------------------------------------------------------

def _label(value: object) -> str:
    """A label value, escaped as the format asks (backslash, quote, newline), with the box's
    other control characters made visible first (a scrape printed to a terminal stays inert)."""
    text = visible(str(value), multiline=True)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: object) -> str:
    return ",".join(f'{k}="{_label(v)}"' for k, v in labels.items() if v is not None)


def _value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class _Metrics:
    def __init__(self) -> None:
        self._families: dict[str, tuple[str, str, list[str]]] = {}

    def add(self, name: str, kind: str, help_text: str, value: float | None, /,
            **labels: object) -> None:
        if value is None:
            return
        family = self._families.setdefault(name, (kind, help_text, []))
        family[2].append(f"gpuwatch_{name}{{{_labels(**labels)}}} {_value(value)}")

    def text(self) -> str:
        out = []
        for name, (kind, help_text, samples) in self._families.items():
            out.append(f"# HELP gpuwatch_{name} {help_text}")
            out.append(f"# TYPE gpuwatch_{name} {kind}")
            out.extend(samples)
        return "\n".join(out) + "\n"


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)


def _gpu_health_metrics(m: _Metrics, g: GpuSample, gl: dict[str, object]) -> None:
    """A GPU's memory health, recovery action and PCIe link (what the driver did not say is
    left out)."""
    if g.ecc is not None:
        for fixed, span, value in (
                ("corrected", "volatile", g.ecc.corrected_volatile),
                ("uncorrected", "volatile", g.ecc.uncorrected_volatile),
                ("corrected", "aggregate", g.ecc.corrected_aggregate),
                ("uncorrected", "aggregate", g.ecc.uncorrected_aggregate)):
            m.add("gpu_ecc_errors", "gauge", "ECC errors (volatile: since the driver loaded)",
                  value, **gl, type=fixed, span=span)
    if g.remap is not None:
        m.add("gpu_remapped_rows", "gauge", "memory rows remapped to spares", g.remap.corrected,
              **gl, cause="corrected")
        m.add("gpu_remapped_rows", "gauge", "memory rows remapped to spares",
              g.remap.uncorrected, **gl, cause="uncorrected")
        m.add("gpu_remap_pending", "gauge", "1 while a row remap waits for a GPU reset",
              _flag(g.remap.pending), **gl)
        m.add("gpu_remap_failed", "gauge", "1 once a row remap found no spare row",
              _flag(g.remap.failed), **gl)
    if g.recovery_action is not None:
        m.add("gpu_recovery_action", "gauge", "the recovery the driver asks for (action)", 1.0,
              **gl, action=g.recovery_action)
    if g.pcie is not None:
        for name, value in (("gen", g.pcie.gen), ("gen_max", g.pcie.gen_max),
                            ("width", g.pcie.width), ("width_max", g.pcie.width_max)):
            m.add(f"gpu_pcie_link_{name}", "gauge", f"PCIe link {name.replace('_', ' ')}",
                  value, **gl)
        m.add("gpu_pcie_replays", "gauge", "PCIe replays since the driver loaded",
              g.pcie.replays, **gl)
    if g.mig:
        m.add("gpu_mig_instances", "gauge", "MIG instances of the GPU (MIG on)",
              float(len(g.mig_instances)), **gl)
        for inst in g.mig_instances:
            il = dict(gl, gpu_instance=inst.gpu_instance, compute_instance=inst.compute_instance,
                      profile=inst.profile)
            m.add("gpu_mig_memory_used_mib", "gauge", "memory used in the MIG instance's GPU "
                  "instance", inst.mem_used_mib, **il)
            m.add("gpu_mig_memory_total_mib", "gauge", "memory of the MIG instance's GPU "
                  "instance", inst.mem_total_mib, **il)


def prometheus_text(reports: Sequence[HostReport], jobs: JobsReport | None = None,
                    steps_per_s: Mapping[tuple[str, str], float] | None = None) -> str:
    """The Prometheus text exposition format (node_exporter's textfile collector, and
    `gpuwatch watch --listen`'s /metrics); `jobs`: [slurm]'s jobs. `steps_per_s`: a run's pace
    where the caller knows it from the run's history ((host, run) -> steps a second); else the
    run's `progress`'."""
    m = _Metrics()
    if jobs is not None:
        _job_metrics(m, jobs)
    for r in reports:
        host, snap = r.name, r.snapshot
        m.add("up", "gauge", "1 if the host was polled", 1.0 if r.outcome.ok else 0.0, host=host)
        if r.outcome.error_kind is not None:
            m.add("poll_error", "gauge", "1 while the host's last poll failed, with its kind",
                  1.0, host=host, kind=r.outcome.error_kind)
        m.add("last_poll_timestamp_seconds", "gauge", "when the host's last poll ended (epoch)",
              r.outcome.ended_at, host=host)
        verdict = r.verdict
        m.add("host_severity", "gauge",
              "the host's verdict: 0 ok, 1 info, 2 warning, 3 critical (code: the finding)",
              float(LEVELS[verdict.severity]), host=host, code=verdict.code)
        m.add("poll_seconds", "gauge", "wall time of the poll", r.outcome.poll_s, host=host)
        for sev in Severity:
            m.add("findings", "gauge", "findings by severity",
                  float(sum(f.severity == sev for f in r.findings)), host=host,
                  severity=sev.label)
        for f in r.findings[:MAX_FINDING_SERIES]:
            m.add("finding", "gauge", "1 per finding, by code and severity (and run or gpu)",
                  1.0, host=host, code=f.code, severity=f.severity.label, run=f.run, gpu=f.gpu)
        _run_metrics(m, r, steps_per_s or {})
        if snap is None:
            continue
        m.add("uptime_seconds", "gauge", "box uptime", snap.uptime_s, host=host)
        err = snap.gpu_error
        m.add("gpu_query_ok", "gauge", "1 if the GPUs could be read (0: see kind)",
              0.0 if err is not None else 1.0, host=host, error=err.kind if err else None)
        for g in snap.gpus:
            gl = {"host": host, "gpu": g.index, "uuid": g.uuid}
            m.add("gpu_info", "gauge", "1 per GPU, with its model name", 1.0, **gl, name=g.name)
            m.add("gpu_utilization_percent", "gauge",  # U21: util% is not SM occupancy
                  "GPU util: the share of time a kernel ran (not how busy the SMs are)",
                  g.util_pct, **gl)
            m.add("gpu_sm_clock_mhz", "gauge", "SM clock", g.sm_clock_mhz, **gl)
            m.add("gpu_sm_clock_max_mhz", "gauge", "max SM clock", g.sm_clock_max_mhz, **gl)
            m.add("gpu_power_watts", "gauge", "power draw", g.power_w, **gl)
            m.add("gpu_power_limit_watts", "gauge", "enforced power limit", g.power_limit_w, **gl)
            m.add("gpu_temperature_celsius", "gauge", "GPU temperature", g.temp_c, **gl)
            m.add("gpu_memory_used_mib", "gauge", "VRAM used", g.mem_used_mib, **gl)
            m.add("gpu_memory_total_mib", "gauge", "VRAM total", g.mem_total_mib, **gl)
            for reason in g.throttle_reasons or ():
                m.add("gpu_throttle_active", "gauge", "an active clock event (throttle) reason",
                      1.0, **gl, reason=reason)
            _gpu_health_metrics(m, g, gl)
        for d in snap.disks:
            dl = {"host": host, "path": d.path, "mount": d.mount}
            m.add("disk_bytes_total", "gauge", "filesystem size", d.bytes_total, **dl)
            m.add("disk_bytes_free", "gauge", "bytes free to unprivileged users", d.bytes_free,
                  **dl)
            m.add("disk_inodes_total", "gauge", "inodes", d.inodes_total, **dl)
            m.add("disk_inodes_free", "gauge", "inodes free", d.inodes_free, **dl)
    return m.text()


def _job_metrics(m: _Metrics, jobs: JobsReport) -> None:
    """[slurm]: the scheduler's reachability, and per job its state, times and memory."""
    m.add("slurm_up", "gauge", "1 if the Slurm login host answered this round",
          1.0 if jobs.ok else 0.0, login=jobs.host)
    for view in jobs.jobs:
        j = view.job
        jl = {"job": j.job_id, "name": j.name, "user": j.user, "partition": j.partition}
        m.add("job_info", "gauge", "1 per job; state, cause (why it ended) and nodes as labels",
              1.0, **jl, state=j.state, cause=view.cause, nodes=j.node_list)
        m.add("job_elapsed_seconds", "gauge", "how long the job has run (or ran)", j.elapsed_s,
              **jl)
        m.add("job_time_limit_seconds", "gauge", "the job's time limit", j.time_limit_s, **jl)
        if j.running and j.end_at is not None:
            m.add("job_time_left_seconds", "gauge", "until the time limit ends the job",
                  max(0.0, j.end_at - jobs.polled_at), **jl)
        m.add("job_max_rss_mib", "gauge", "largest resident memory of a step (sacct MaxRSS)",
              j.max_rss_mib, **jl)
        m.add("job_requested_memory_mib", "gauge", "the memory it asked for (--mem)",
              j.req_mem_mib, **jl)
        if view.run is not None and view.run.checkpoint_at is not None:
            m.add("job_checkpoint_age_seconds", "gauge", "age of its run's latest checkpoint",
                  max(0.0, jobs.polled_at - view.run.checkpoint_at), **jl)
MAX_FINDING_SERIES = 64
"""`gpuwatch_finding` series per host at most (a host with more is one to open anyway)."""
_TRAIN_LOSS = re.compile(r"^(?!.*(eval|val|valid|test|dev)).*loss", re.I)
"""A training loss by its name where no known name is there (findings/curve_tags.py's rule)."""


def _run_metrics(m: _Metrics, r: HostReport, paces: Mapping[tuple[str, str], float]) -> None:
    """Per run: alive, its step and pace, its last loss and its latest checkpoint's age, from
    the run objects of the report (what `--json` says of it)."""
    snap = r.snapshot
    for run in r.runs:
        name, host = run["name"], r.name
        m.add("run_running", "gauge", "1 if the run's processes are alive",
              1.0 if run.get("status") == "running" else 0.0, host=host, run=name,
              status=run.get("status"))
        series = run.get("series") or {}
        progress = run.get("progress") or {}
        steps = [s["last_step"] for s in series.values() if s.get("last_step") is not None]
        step = progress.get("step") if progress.get("step") is not None else max(
            steps, default=None)
        m.add("run_step", "gauge", "the run's latest step", step, host=host, run=name)
        pace = paces.get((host, name), progress.get("steps_per_s"))
        m.add("run_steps_per_second", "gauge", "the run's recent pace, in steps a second", pace,
              host=host, run=name)
        loss = pick(series, None, LOSS_NAMES, _TRAIN_LOSS)
        value = series[loss].get("last_value") if loss is not None else None
        if isinstance(value, str):  # json_value's "nan", "inf", "-inf": a loss gone NaN
            value = float(value)
        m.add("run_loss", "gauge", "the last value of the run's training loss", value,
              host=host, run=name, tag=loss)
        times = [c["mtime"] for c in run.get("checkpoints") or () if c.get("mtime") is not None]
        if times and snap is not None and snap.taken_at is not None:
            m.add("run_checkpoint_age_seconds", "gauge",
                  "seconds since the run's latest checkpoint was written (the box's clock)",
                  max(0.0, snap.taken_at - max(times)), host=host, run=name)

"""What gpuwatch's polling costs a real training loop: step times polled and not, interleaved.

Run on a GPU box from the repository root (python3 with torch; pynvml for the NVML path; no
gpuwatch install needed, nothing but the stdlib for the probe):

    python3 tests/device/overhead.py            # about 3 minutes on one H100
    python3 tests/device/overhead.py --dry-run  # anywhere: a fake step, the simulator's GPUs

A small transformer trains on random data in bf16 (GPU-bound, ~20-40 ms a step on an H100;
each step ends in a synchronize, as a loop that logs its loss does). Three conditions take
turns in blocks of --block-s seconds, --rounds times, the order rotated each round: polled
every --interval s through gpuwatch's probe on the NVML path, polled on the nvidia-smi path,
and not polled. A poll is what `local` runs (wire/collect.py's poll_local: the probe's command
through /bin/sh, its payload and request on stdin, the hints a steady poll carries), from a
poller process of its own, as gpuwatch's client is another process than the training; its
first poll (site-packages looked at, pynvml found) happens before the blocks, so the blocks
see steady polls. Each poller checks the document's GPU source is the path it stands for.

Prints, per condition, the step time's median and interquartile range; the ratio of each
polled condition's median to the unpolled one with a 95% bootstrap interval, and per round
(each polled block against the unpolled block of its round); and the steps that overlapped
a probe's run against the unpolled median. Writes the raw step times, polls and the summary
to $OUT/overhead.json (or --out DIR), and the report to overhead.txt beside it: two files.

The lent machine exports PYTHONDONTWRITEBYTECODE=1, under which `import pynvml` compiles
293 KB on every poll; a box where Python caches bytecode does not, so the probes here run
without it (the report says so; --keep-env keeps the environment as it is).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONDITIONS = ("nvml", "smi", "none")
SOURCES = {"nvml": "nvml", "smi": "nvidia-smi"}
BOOTSTRAP = 2000


# --------------------------------------------------------------------------------------------
# The poller: a process of its own, polling while it is told to


def poller(mode: str, interval: float) -> None:
    """Reads "on" / "off" / "quit" lines on stdin; while on, polls every `interval` s and prints
    one JSON line per poll ({"t0", "t1", "ok", "source", "error"}); after "off", once its poll
    in flight is done, prints {"idle": true}."""
    sys.path.insert(0, str(ROOT))
    from remote.config.schema import HostConfig
    from remote.wire.collect import Collector

    host = HostConfig("box", "local", python=sys.executable)
    collector = Collector()
    if mode == "smi":  # as after a poll that found no pynvml: no NVML reader, nvidia-smi read
        collector.restore(host, {"of": [host.ssh, host.python], "hints": {"pynvml": False},
                                 "nvml_check_due": 1e18})
    wanted = threading.Event()
    commands: list[str] = []
    changed = threading.Condition()

    def read_commands() -> None:
        for line in sys.stdin:
            with changed:
                commands.append(line.strip())
                changed.notify()
        with changed:
            commands.append("quit")
            changed.notify()

    threading.Thread(target=read_commands, daemon=True).start()
    on = False
    while True:
        with changed:
            while commands:
                command = commands.pop(0)
                if command == "quit":
                    return
                if command == "once":
                    wanted.set()
                on = command == "on"
                if command == "off":
                    print(json.dumps({"idle": True}), flush=True)
        if on or wanted.is_set():
            wanted.clear()
            t0 = time.monotonic()
            outcome = collector.poll_local(host)
            t1 = time.monotonic()
            snap = outcome.snapshot
            print(json.dumps({"t0": t0, "t1": t1, "ok": outcome.ok,
                              "source": snap.gpu_source if snap else None,
                              "gpus": len(snap.gpus) if snap else 0,
                              "error": outcome.error_message or (snap.gpu_error if snap
                                                                 else None)}), flush=True)
            with changed:
                changed.wait_for(lambda: bool(commands), timeout=max(0.0, t0 + interval
                                                                      - time.monotonic()))
        else:
            with changed:
                changed.wait_for(lambda: bool(commands))


class Poller:
    """The driver's handle on one poller process."""

    def __init__(self, mode: str, interval: float, env: dict[str, str]) -> None:
        self.mode = mode
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--poller", mode, "--interval", str(interval)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.polls: list[dict] = []
        self.idle = threading.Event()
        self.polled = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            item = json.loads(line)
            if item.get("idle"):
                self.idle.set()
                continue
            with self.polled:
                self.polls.append(item)
                self.polled.notify_all()

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def once(self, timeout: float = 120.0) -> dict:
        """One poll now (the first: hints learnt), its line."""
        with self.polled:
            count = len(self.polls)
            self.send("once")
            if not self.polled.wait_for(lambda: len(self.polls) > count, timeout):
                raise RuntimeError(f"the {self.mode} poller gave no poll in {timeout:g} s")
            return self.polls[-1]

    def start(self) -> None:
        self.idle.clear()
        self.send("on")

    def stop(self, timeout: float = 60.0) -> None:
        """Stop polling; back once its poll in flight is done."""
        self.send("off")
        if not self.idle.wait(timeout):
            raise RuntimeError(f"the {self.mode} poller did not stop in {timeout:g} s")

    def close(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


# --------------------------------------------------------------------------------------------
# The training loop


def torch_step() -> tuple[object, dict]:
    """A step function of a small transformer's training in bf16, and what it is."""
    import torch

    torch.manual_seed(0)
    d, layers, batch, seq = 1024, 6, 32, 256
    layer = torch.nn.TransformerEncoderLayer(d, 16, 4 * d, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).cuda()
    head = torch.nn.Linear(d, d).cuda()
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-4)
    x = torch.randn(batch, seq, d, device="cuda")
    y = torch.randn(batch, seq, d, device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(head(model(x)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()  # as a loop that reads its loss each step

    props = torch.cuda.get_device_properties(0)
    return step, {"gpu": props.name, "torch": torch.__version__,
                  "model": f"TransformerEncoder d={d} layers={layers} batch={batch} seq={seq} "
                           "bf16 autocast, AdamW"}


def fake_step() -> tuple[object, dict]:
    """--dry-run: a step of ~3 ms of CPU and ~12 ms of waiting, as a GPU-bound loop waits."""

    def step() -> None:
        end = time.thread_time() + 0.003
        while time.thread_time() < end:
            pass
        time.sleep(0.012)

    return step, {"gpu": "none (dry run)", "torch": None, "model": "a fake step"}


# --------------------------------------------------------------------------------------------
# Statistics


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]


def bootstrap_ratio(a: list[float], b: list[float], rng: random.Random) -> tuple[float, float]:
    """95% interval of median(a) / median(b), resampling each."""
    ratios = sorted(statistics.median(rng.choices(a, k=len(a)))
                    / statistics.median(rng.choices(b, k=len(b))) for _ in range(BOOTSTRAP))
    return ratios[int(0.025 * BOOTSTRAP)], ratios[int(0.975 * BOOTSTRAP) - 1]


def overlapping(steps: list[tuple[float, float]], polls: list[dict]) -> list[float]:
    """The step times of the steps whose span overlapped a poll's (the probe running)."""
    spans = sorted((p["t0"], p["t1"]) for p in polls)
    out, i = [], 0
    for start, dt in steps:
        end = start + dt
        while i < len(spans) and spans[i][1] < start:
            i += 1
        if i < len(spans) and spans[i][0] <= end:
            out.append(dt)
    return out


def summarise(steps: dict[str, list[tuple[float, float]]], blocks: list[dict],
              polls: dict[str, list[dict]]) -> tuple[dict, list[str]]:
    rng = random.Random(0)
    times = {c: [dt for _, dt in steps[c]] for c in CONDITIONS}
    base = statistics.median(times["none"])
    summary: dict = {"conditions": {}}
    lines = [f"{'condition':<10} {'steps':>6} {'median ms':>10} {'IQR ms':>17} "
             f"{'ratio to none (95% CI)':>26} {'per round':>22}"]
    for c in CONDITIONS:
        q1, med, q3 = quartiles(times[c])
        entry = {"steps": len(times[c]), "median_s": med, "q1_s": q1, "q3_s": q3,
                 "mean_s": statistics.fmean(times[c])}
        ratio_text = round_text = ""
        if c != "none":
            lo, hi = bootstrap_ratio(times[c], times["none"], rng)
            per_round = [b["median_s"] / n["median_s"] for b in blocks if b["condition"] == c
                         for n in blocks if n["condition"] == "none" and n["round"] == b["round"]]
            during = overlapping(steps[c], polls[c])
            entry.update(ratio=med / base, ci95=[lo, hi], per_round=per_round,
                         polls=len(polls[c]), steps_during_a_poll=len(during),
                         during_a_poll_ratio=(statistics.median(during) / base if during
                                              else None))
            ratio_text = f"{med / base:.4f} ({lo:.4f}-{hi:.4f})"
            round_text = (f"{statistics.median(per_round):.4f} "
                          f"({min(per_round):.3f}-{max(per_round):.3f})")
        summary["conditions"][c] = entry
        lines.append(f"{c:<10} {len(times[c]):>6} {med * 1e3:>10.2f} "
                     f"{q1 * 1e3:>8.2f}-{q3 * 1e3:<8.2f} {ratio_text:>26} {round_text:>22}")
    for c in ("nvml", "smi"):
        e = summary["conditions"][c]
        probe_s = [p["t1"] - p["t0"] for p in polls[c]]
        during = (f"{e['during_a_poll_ratio']:.4f}x the unpolled median"
                  if e["during_a_poll_ratio"] else "none")
        lines.append(f"{c}: {e['polls']} polls (a poll {statistics.median(probe_s) * 1e3:.0f} ms "
                     f"median, the probe's whole run); {e['steps_during_a_poll']} steps "
                     f"overlapped one: their median {during}")
    return summary, lines


# --------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    out = Path(args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="overhead-"))
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if not args.keep_env:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    state = tempfile.mkdtemp(prefix="overhead-state-")
    env.update(XDG_CACHE_HOME=state, XDG_STATE_HOME=state)
    if args.dry_run:
        sys.path.insert(0, str(ROOT))
        from remote.sim import Box, h100_sxm  # the simulator's stand-in nvidia-smi

        env.update(Box(Path(state) / "box", h100_sxm(1)).env())
        step, meta = fake_step()
    else:
        step, meta = torch_step()
    meta.update(python=sys.version.split()[0], interval_s=args.interval, block_s=args.block_s,
                rounds=args.rounds, dry_run=args.dry_run,
                pythondontwritebytecode=("kept" if args.keep_env
                                         else "unset for the probes"))
    pollers = {m: Poller(m, args.interval, env) for m in ("nvml", "smi")}
    try:
        for mode, p in pollers.items():  # first polls: hints learnt, the path checked
            for _ in range(2):
                first = p.once()
            print(f"{mode} poller: first polls done: {first}", flush=True)
            if not first["ok"]:
                raise RuntimeError(f"the {mode} poll failed: {first['error']}")
            if not args.dry_run and first["source"] != SOURCES[mode]:
                raise RuntimeError(f"the {mode} poller read the GPUs through {first['source']}"
                                   f" ({first['error']}), not {SOURCES[mode]}")
            p.polls.clear()
        t_warm = time.monotonic()
        while time.monotonic() - t_warm < args.warmup_s:
            step()  # type: ignore[operator]
        steps: dict[str, list[tuple[float, float]]] = {c: [] for c in CONDITIONS}
        blocks: list[dict] = []
        order = list(CONDITIONS)
        for r in range(args.rounds):
            for c in order[r % 3:] + order[:r % 3]:  # rotated: no condition always first
                if c != "none":
                    pollers[c].start()
                block: list[tuple[float, float]] = []
                end = time.monotonic() + args.block_s
                while time.monotonic() < end:
                    t0 = time.monotonic()
                    step()  # type: ignore[operator]
                    block.append((t0, time.monotonic() - t0))
                if c != "none":
                    pollers[c].stop()
                steps[c] += block
                blocks.append({"round": r, "condition": c, "steps": len(block),
                               "median_s": statistics.median(dt for _, dt in block)})
                print(f"round {r} {c:>4}: {len(block)} steps, median "
                      f"{blocks[-1]['median_s'] * 1e3:.2f} ms", flush=True)
    finally:
        for p in pollers.values():
            p.close()
    polls = {m: list(p.polls) for m, p in pollers.items()}
    polls["none"] = []
    bad = [p for m in ("nvml", "smi") for p in polls[m]
           if not p["ok"] or (not args.dry_run and p["source"] != SOURCES[m])]
    summary, lines = summarise(steps, blocks, polls)
    head = [f"gpuwatch's polling against a training loop: {meta['gpu']}, torch {meta['torch']}, "
            f"Python {meta['python']}; {meta['model']}",
            f"polled every {args.interval:g} s; {args.rounds} rounds of {args.block_s:g} s blocks "
            f"per condition, in turn; PYTHONDONTWRITEBYTECODE {meta['pythondontwritebytecode']}"]
    if bad:
        head.append(f"WARNING: {len(bad)} polls failed or read another path: {bad[:3]}")
    few = [c for c in CONDITIONS if summary["conditions"][c]["steps"] < 200]
    if few:
        head.append(f"WARNING: fewer than 200 steps for {', '.join(few)}: raise --block-s")
    report = "\n".join([*head, *lines])
    print(report, flush=True)
    (out / "overhead.txt").write_text(report + "\n")
    (out / "overhead.json").write_text(json.dumps(
        {"meta": meta, "summary": summary, "blocks": blocks, "polls": polls,
         "steps": {c: [[round(t, 6), round(dt, 7)] for t, dt in steps[c]]
                   for c in CONDITIONS}}) + "\n")
    print(f"written: {out / 'overhead.json'}, {out / 'overhead.txt'}")
    return 1 if bad or few else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="no torch, no GPU: a fake step, the simulator's nvidia-smi")
    parser.add_argument("--interval", type=float, help="seconds between polls (default 2)")
    parser.add_argument("--block-s", type=float, help="seconds a block (default 10)")
    parser.add_argument("--rounds", type=int, help="blocks of each condition (default 4)")
    parser.add_argument("--warmup-s", type=float, help="training before the blocks (5)")
    parser.add_argument("--out", help="folder for the two files (default $OUT)")
    parser.add_argument("--keep-env", action="store_true",
                        help="keep PYTHONDONTWRITEBYTECODE for the probes")
    parser.add_argument("--poller", choices=("nvml", "smi"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    quick = args.dry_run
    args.interval = args.interval or (0.5 if quick else 2.0)
    args.block_s = args.block_s or (2.0 if quick else 10.0)
    args.rounds = args.rounds or (3 if quick else 4)
    args.warmup_s = args.warmup_s if args.warmup_s is not None else (0.5 if quick else 5.0)
    if sys.version_info < (3, 11):  # noqa: UP036 (the device's python3 may be older)
        sys.exit(f"{sys.executable} is Python {sys.version.split()[0]}: the pollers run "
                 "gpuwatch's client, which needs 3.11 or later")
    if args.poller:
        poller(args.poller, args.interval)
        return
    sys.exit(run(args))


if __name__ == "__main__":
    main()

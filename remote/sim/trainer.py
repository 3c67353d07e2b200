#!/usr/bin/env python3
"""gpuwatch's DEMO trainer: a small process that pretends to train a model. It trains nothing.

``gpuwatch --demo`` starts it on its simulated boxes (and a relaunch brings it back) so that the
boxes hold a real, living process with the artifacts of a real training run:

- stdout: one line per logged step ("step 120 | loss 2.3456 | lr 2.9e-04 | 2.0 it/s"),
  flushed at once; the launcher appends it to the run's log (``>> train.log``);
- TensorBoard event files under ``WORKDIR/runs/`` (``train/loss``, ``train/learning_rate``),
  written with a minimal TFRecord + Event encoder (masked CRC32C, as TensorFlow writes them);
- checkpoints ``WORKDIR/outputs/checkpoint-STEP/`` every ``--save-every`` steps, written into
  ``checkpoint-STEP.tmp`` and renamed whole, keeping the newest ``--save-total-limit``;
- ``--resume PATH`` continues from a checkpoint's step (the loss curve picks up where it was).

The loss is a function of the step (a decaying curve plus seeded noise), so a resumed run
continues the same curve. Stdlib only, Python 3.6+, imports nothing of gpuwatch: it runs on any
box. SIGTERM and SIGINT end it after a last log line; SIGHUP is left at its default (a run tied
to a terminal dies with it, seed 000).
"""

import argparse
import json
import math
import os
import random
import shutil
import signal
import socket
import stat
import struct
import sys
import threading
import time

try:  # the C implementation when the box has it; the table below gives the same numbers
    import crc32c as _crc32c_module
except ImportError:  # pragma: no cover - depends on the box
    _crc32c_module = None  # type: ignore[assignment]

# ---------------------------------------------------------------------------------------------
# CRC32C (Castagnoli), reflected polynomial 0x82F63B78, as TFRecord framing uses it.


def _make_table() -> list:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _make_table()


def crc32c(data: bytes) -> int:
    if _crc32c_module is not None:
        return int(_crc32c_module.crc32c(data))
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in bytearray(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """One TFRecord: length (u64 LE), masked CRC of the length, data, masked CRC of the data."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc32c(length)) + data
            + struct.pack("<I", masked_crc32c(data)))


# ---------------------------------------------------------------------------------------------
# The few protobuf messages of an event file (tensorflow/core/util/event.proto, summary.proto).


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        bits = n & 0x7F
        n >>= 7
        if n:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def event_bytes(wall_time: float, step: int, *, file_version: str = "",
                scalars: tuple = ()) -> bytes:
    """An Event: wall_time (1, double), step (2, int64), file_version (3) or summary (5) whose
    values are (tag, simple_value) pairs (Summary.Value: tag 1, simple_value 2 as float)."""
    out = b"\x09" + struct.pack("<d", wall_time)
    if step:
        out += b"\x10" + _varint(step)
    if file_version:
        out += _field_bytes(3, file_version.encode("utf-8"))
    if scalars:
        values = b"".join(
            _field_bytes(1, _field_bytes(1, tag.encode("utf-8"))
                         + b"\x15" + struct.pack("<f", value))
            for tag, value in scalars)
        out += _field_bytes(5, values)
    return out


class EventWriter:
    """Appends events to a new events.out.tfevents.* file, flushing after every record."""

    def __init__(self, folder: str) -> None:
        if not os.path.isdir(folder):
            os.makedirs(folder)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}." \
            f"{os.getpid()}.0"
        self.path = os.path.join(folder, name)
        self._fh = open(self.path, "ab")  # noqa: SIM115 - open for the run's whole life
        self._write(event_bytes(time.time(), 0, file_version="brain.Event:2"))

    def _write(self, event: bytes) -> None:
        self._fh.write(tfrecord(event))
        self._fh.flush()

    def scalars(self, step: int, values: tuple) -> None:
        self._write(event_bytes(time.time(), step, scalars=values))

    def close(self) -> None:
        self._fh.close()


# ---------------------------------------------------------------------------------------------
# The pretend training.


def loss_at(step: int, seed: int) -> float:
    """A decaying curve with noise that depends only on (seed, step): resumes continue it."""
    rng = random.Random(seed * 1000003 + step)
    base = 1.6 + 2.9 * math.exp(-step / 350.0) + 0.4 * math.exp(-step / 60.0)
    return max(0.05, base + rng.gauss(0.0, 0.06 + 0.04 * math.exp(-step / 500.0)))


def lr_at(step: int, peak: float = 3e-4, warmup: int = 50, total: int = 5000) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / float(max(1, total - warmup)))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def resume_step(path: str, workdir: str) -> int:
    """The step saved in a checkpoint folder (trainer_state.json), or its name's number."""
    if not os.path.isabs(path):
        path = os.path.join(workdir, path)
    state = os.path.join(path, "trainer_state.json")
    try:
        with open(state, encoding="utf-8") as fh:
            return int(json.load(fh)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    tail = os.path.basename(path.rstrip("/")).rsplit("-", 1)[-1]
    if tail.isdigit():
        return int(tail)
    raise SystemExit(f"cannot resume from {path}: no trainer_state.json and no step in its name")


def save_checkpoint(outputs: str, step: int, loss: float, history: list, payload_kib: int,
                    keep: int) -> str:
    """checkpoint-STEP written aside as checkpoint-STEP.tmp, then renamed whole (U6)."""
    final = os.path.join(outputs, f"checkpoint-{step}")
    tmp = final + ".tmp"
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    state = {"global_step": step, "loss": loss, "log_history": history[-50:],
             "saved_at": time.time(), "trainer": "gpuwatch demo trainer (pretend training)"}
    with open(os.path.join(tmp, "trainer_state.json"), "w", encoding="utf-8") as fh:
        json.dump(state, fh, indent=1)
    with open(os.path.join(tmp, "model.bin"), "wb") as fh:
        rng = random.Random(step)
        fh.write(bytes(bytearray(rng.getrandbits(8) for _ in range(payload_kib * 1024))))
        fh.flush()
        os.fsync(fh.fileno())
    if os.path.isdir(final):  # a resumed run saving a step it had already saved
        shutil.rmtree(final)
    os.rename(tmp, final)
    if keep > 0:
        done = []
        for name in os.listdir(outputs):
            if name.startswith("checkpoint-") and name[11:].isdigit():
                done.append(int(name[11:]))
        for old in sorted(done)[:-keep]:
            shutil.rmtree(os.path.join(outputs, f"checkpoint-{old}"), ignore_errors=True)
    return final


class Stop(Exception):
    pass


def _stop(signum: int, frame: object) -> None:
    raise Stop(signal.Signals(signum).name)


def watch_lifeline(run: str) -> None:
    """Under gpuwatch --demo only: GPUWATCH_DEMO_LIFELINE names a pipe whose writing end the
    demo holds; when the demo is gone (even killed hard), the pipe closes and so does this."""
    fd = os.environ.get("GPUWATCH_DEMO_LIFELINE", "")
    if not fd.isdigit():
        return
    try:  # a launcher that closed inherited descriptors (tmux does): no lifeline to watch
        if not stat.S_ISFIFO(os.fstat(int(fd)).st_mode):
            return
    except OSError:
        return

    def watch() -> None:
        try:
            while os.read(int(fd), 1):
                pass
        except OSError:
            pass
        print(f"[{run}] the gpuwatch demo ended; exiting", flush=True)
        os._exit(0)

    thread = threading.Thread(target=watch, name="lifeline")
    thread.daemon = True
    thread.start()


def parse_args(argv: list) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="gpuwatch demo trainer: pretends to train")
    p.add_argument("--run", default="demo", help="a name for the run (shown in the log)")
    p.add_argument("--workdir", default=".", help="where runs/, outputs/ go")
    p.add_argument("--resume", nargs="?", const="", default="",
                   help="a checkpoint folder to continue from (empty: start fresh)")
    p.add_argument("--step-s", type=float, default=0.5, help="seconds per step")
    p.add_argument("--log-every", type=int, default=1, help="steps between log lines")
    p.add_argument("--save-every", type=int, default=60, help="steps between checkpoints")
    p.add_argument("--save-total-limit", type=int, default=3, help="checkpoints kept; 0: all")
    p.add_argument("--checkpoint-kib", type=int, default=64, help="size of model.bin")
    p.add_argument("--max-steps", type=int, default=0, help="stop after this step; 0: never")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


def main(argv: list) -> int:
    args = parse_args(argv)
    workdir = os.path.abspath(args.workdir)
    outputs = os.path.join(workdir, "outputs")
    if not os.path.isdir(outputs):
        os.makedirs(outputs)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    watch_lifeline(args.run)
    step = 0
    if args.resume:
        step = resume_step(args.resume, workdir)
        print(f"[{args.run}] resuming from {args.resume} at step {step}", flush=True)
    else:
        print(f"[{args.run}] starting a new run in {workdir} (pid {os.getpid()})", flush=True)
    writer = EventWriter(os.path.join(workdir, "runs"))
    history = []  # type: list
    started = time.time()
    next_at = time.monotonic()
    try:
        while not args.max_steps or step < args.max_steps:
            if not os.path.isdir(workdir):  # the run's folder was removed under it
                print(f"[{args.run}] {workdir} is gone; exiting", flush=True)
                return 1
            next_at += args.step_s
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()
            step += 1
            loss = loss_at(step, args.seed)
            lr = lr_at(step)
            writer.scalars(step, (("train/loss", loss), ("train/learning_rate", lr)))
            history.append({"step": step, "loss": round(loss, 4), "learning_rate": lr})
            if step % args.log_every == 0:
                rate = 1.0 / args.step_s if args.step_s > 0 else 0.0
                print(f"step {step} | loss {loss:.4f} | lr {lr:.2e} | {rate:.1f} it/s",
                      flush=True)
            if args.save_every and step % args.save_every == 0:
                path = save_checkpoint(outputs, step, loss, history, args.checkpoint_kib,
                                       args.save_total_limit)
                print(f"saved checkpoint {path}", flush=True)
    except Stop as exc:
        print(f"[{args.run}] received {exc} at step {step}, exiting", flush=True)
        return 143 if str(exc) == "SIGTERM" else 130
    finally:
        writer.close()
    print(f"[{args.run}] done: {step} steps in {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

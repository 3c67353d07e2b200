"""A tiny training script for the real Slurm's jobs: steps, a metrics file, checkpoints, a log.

    python3 slurm_train.py --steps N --step-s S --save-every K [--save-until N] [--grow-mib M]

Each step appends ``{"step", "loss"}`` to ``metrics.jsonl`` and prints a line (flushed: the job's
StdOut is the log); every ``--save-every`` steps it writes ``checkpoints/step-N.pt`` (through a
``.tmp`` renamed into place, as trainers do). ``--grow-mib`` makes it hold that much more memory
each step (to be killed for exceeding ``--mem``). At the end it writes ``DONE``. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.5)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--save-until", type=int, default=0,
                        help="no checkpoint after this step (0: save to the end)")
    parser.add_argument("--grow-mib", type=int, default=0)
    args = parser.parse_args()
    os.makedirs("checkpoints", exist_ok=True)
    held: list[bytearray] = []
    print(f"job {os.environ.get('SLURM_JOB_ID')} starting on {os.uname().nodename}", flush=True)
    for step in range(1, args.steps + 1):
        if args.grow_mib:
            block = bytearray(args.grow_mib * 1024 * 1024)
            block[::4096] = b"x" * len(block[::4096])  # touch every page: resident, not virtual
            held.append(block)
        loss = 2.0 * math.exp(-step / 50.0) + 0.1
        with open("metrics.jsonl", "a") as fh:
            fh.write(json.dumps({"step": step, "loss": round(loss, 5)}) + "\n")
        print(f"step {step} loss {loss:.4f}", flush=True)
        if step % args.save_every == 0 and (not args.save_until or step <= args.save_until):
            tmp = f"checkpoints/step-{step}.pt.tmp"
            with open(tmp, "wb") as fh:
                fh.write(b"weights" * 64)
            os.replace(tmp, f"checkpoints/step-{step}.pt")
            print(f"saved checkpoints/step-{step}.pt", flush=True)
        time.sleep(args.step_s)
    with open("DONE", "w") as fh:
        fh.write("done\n")
    print("finished", flush=True)


if __name__ == "__main__":
    main()

"""`gpuwatch job requeue|cancel JOB [--yes]`: a Slurm job's actions, through the scheduler.

requeue = `scontrol requeue JOB` (the job goes back to pending and runs again: a job killed at
its time limit comes back from its checkpoint if its script resumes); cancel = `scancel JOB`.
The same shape as kill and relaunch: the scheduler is asked first (one round of `[slurm]`), the
job is shown (id, name, state, nodes, user) and confirmed (or --yes), the action is its own
bounded call on the login host, audited in the store, and verified by the next rounds (requeue:
the job pending or running again; cancel: the job ended). Exit 0 verified; 1 refused, cancelled
or not verified; 2 the scheduler could not be asked; 78 no [slurm] in the config.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from gpuwatch.remote.config.load import load_config
from gpuwatch.remote.sources.slurm import Answer, SlurmError
from gpuwatch.remote.sources.slurm_act import plan_job
from gpuwatch.remote.store import Store
from gpuwatch.remote.textsafe import visible
from gpuwatch.remote.watch.fleet import FleetWatch
from gpuwatch.remote.watch.jobs import JobsWatch

EXIT_OK, EXIT_FAILED, EXIT_UNPOLLED, EXIT_CONFIG = 0, 1, 2, 78
VERIFY_ROUNDS = 10
VERIFY_GAP_S = 3.0
"""The next rounds verify: at most VERIFY_ROUNDS, this far apart (slurmctld takes a moment)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("A Slurm job's actions through the scheduler ([slurm] in the config): "
                          "requeue (scontrol requeue) or cancel (scancel); confirmed, audited, "
                          "verified by the next rounds.")
    parser.add_argument("action", choices=("requeue", "cancel"))
    parser.add_argument("job", metavar="JOB", help="the job id (1234, or 1234_7 for an array task)")
    parser.add_argument("--yes", action="store_true", help="do not ask")


def run_verb(args: argparse.Namespace, store_path: str | None = None) -> int:
    config = load_config(args.config)
    if config.slurm is None:
        print("gpuwatch: the config has no [slurm] table: say where the jobs are "
              '([slurm] host = "login1", docs/slurm.md)', file=sys.stderr)
        return EXIT_CONFIG
    with Store.open(store_path) as store:
        fleet = FleetWatch(config, store, role="action",
                           accept_new_host_keys=args.accept_new_host_keys)
        assert fleet.jobs is not None
        return asyncio.run(_act(fleet.jobs, store, args.action, args.job, yes=args.yes,
                                readonly=args.readonly or config.readonly))


async def _act(jobs: JobsWatch, store: Store, kind: str, job_id: str, *, yes: bool,
               readonly: bool) -> int:
    login = jobs.config.host
    answer = await jobs.poll()
    if isinstance(answer, SlurmError):
        say(f"gpuwatch: the scheduler on {login} could not be asked: {answer.message}", err=True)
        return EXIT_UNPOLLED
    try:
        plan = plan_job(kind, job_id, answer.jobs, readonly=readonly)
    except ValueError as exc:
        say(f"gpuwatch: {exc}", err=True)
        return EXIT_FAILED
    if plan.refusal is not None:
        say(f"cannot {kind}: {plan.refusal}")
        jobs.refused(plan, store)
        return EXIT_FAILED
    say(plan.describe())
    if not yes:
        if not sys.stdin.isatty():
            print("gpuwatch: not confirmed: pass --yes (there is no terminal to ask on)",
                  file=sys.stderr)
            return EXIT_FAILED
        said = await asyncio.to_thread(input, "Proceed? [y/N] ")
        if said.strip().lower() not in ("y", "yes"):
            print("cancelled; nothing was sent")
            return EXIT_FAILED
    sent = await jobs.act(plan, store)
    say(("gpuwatch: " if sent.error_kind else "") + sent.message, err=bool(sent.error_kind))
    if sent.error_kind is not None:
        return EXIT_UNPOLLED
    if not sent.ok:
        return EXIT_FAILED

    async def next_round() -> Answer | SlurmError:
        await asyncio.sleep(VERIFY_GAP_S)  # slurmctld takes a moment; a round is one call
        return await jobs.poll()

    done = await jobs.verify(plan, next_round, store, VERIFY_ROUNDS)
    say(("verified: " if done.ok else "NOT verified: ") + done.message)
    return EXIT_OK if done.ok else EXIT_FAILED


def say(text: str, *, err: bool = False) -> None:
    print(visible(text, multiline=True), file=sys.stderr if err else sys.stdout, flush=True)

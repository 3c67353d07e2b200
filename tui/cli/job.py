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
import time

from gpuwatch.remote.actions.execute import who
from gpuwatch.remote.config.load import load_config
from gpuwatch.remote.model.slurm_job import ENDED, Job
from gpuwatch.remote.sources.slurm import SlurmError, action_command
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


def describe(kind: str, job: Job) -> str:
    nodes = ", ".join(job.nodes) or job.node_list or "no node"
    return (f"{kind} job {job.job_id} ({job.name}), {job.state}, on {nodes}, user "
            f"{job.user or '?'}: {action_command(kind, job.job_id).removesuffix(' 2>&1')}")


def refusal(kind: str, job: Job | None, job_id: str) -> str | None:
    if job is None:
        return f"the scheduler has no job {job_id} of yours (ended long ago, or another user's?)"
    if kind == "cancel" and job.state in ENDED:
        return f"job {job_id} has already ended ({job.state}): nothing to cancel"
    if kind == "requeue" and job.pending:
        return f"job {job_id} is already pending: nothing to requeue"
    return None


def verified(kind: str, before: Job, after: Job | None) -> bool:
    if after is None:
        return False
    if kind == "cancel":
        return after.state in ENDED
    return (after.pending or after.running) and (
        before.state in ENDED or after.pending or (after.restarts or 0) > (before.restarts or 0))


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
        return asyncio.run(_act(fleet, fleet.jobs, store, args.action, args.job, yes=args.yes,
                                readonly=args.readonly or config.readonly))


async def _find(jobs: JobsWatch, job_id: str) -> Job | SlurmError | None:
    answer = await jobs.poll()
    if isinstance(answer, SlurmError):
        return answer
    return next((j for j in answer.jobs if j.job_id == job_id), None)


async def _act(fleet: FleetWatch, jobs: JobsWatch, store: Store, kind: str, job_id: str, *,
               yes: bool, readonly: bool) -> int:
    login = jobs.config.host
    found = await _find(jobs, job_id)
    if isinstance(found, SlurmError):
        say(f"gpuwatch: the scheduler on {login} could not be asked: {found.message}", err=True)
        return EXIT_UNPOLLED
    why = refusal(kind, found, job_id)
    target = [{"job": job_id, "name": found.name if found else None}]
    if why is None and readonly:
        why = "gpuwatch is read-only here (--readonly or readonly = true)"
    if why is not None:
        say(f"cannot {kind}: {why}")
        store.record_action(who=who(), host=login, action=f"job {kind}", phase="execute",
                            targets=target, command=None, outcome="refused", ok=False,
                            message=why)
        return EXIT_FAILED
    assert found is not None
    say(describe(kind, found))
    if not yes:
        if not sys.stdin.isatty():
            print("gpuwatch: not confirmed: pass --yes (there is no terminal to ask on)",
                  file=sys.stderr)
            return EXIT_FAILED
        answer = await asyncio.to_thread(input, "Proceed? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("cancelled; nothing was sent")
            return EXIT_FAILED
    command = action_command(kind, job_id)
    try:
        status, said = await jobs.source.act(kind, job_id)
    except SlurmError as exc:
        store.record_action(who=who(), host=login, action=f"job {kind}", phase="execute",
                            targets=target, command=command, outcome=exc.kind, ok=False,
                            message=exc.message)
        say(f"gpuwatch: {kind} of job {job_id} not sent: {exc.message}", err=True)
        return EXIT_UNPOLLED
    ok = status == 0
    message = f"{kind} of job {job_id}: " + (said or ("sent" if ok else f"exit {status}"))
    store.record_action(who=who(), host=login, action=f"job {kind}", phase="execute",
                        targets=target, command=command, outcome="sent" if ok else "failed",
                        ok=ok, message=message)
    say(message)
    if not ok:
        return EXIT_FAILED
    after: Job | None = None
    for _ in range(VERIFY_ROUNDS):  # the next rounds verify, never the exit code alone
        await asyncio.sleep(VERIFY_GAP_S)
        seen = await _find(jobs, job_id)
        if isinstance(seen, SlurmError):
            continue
        after = seen
        if verified(kind, found, after):
            break
    good = verified(kind, found, after)
    state = after.state if after is not None else "not listed"
    verdict = (f"job {job_id} is {state}" + (f" ({after.reason})" if after and after.reason
                                             else ""))
    store.record_action(who=who(), host=login, action=f"job {kind}", phase="verify",
                        targets=target, command=None,
                        outcome="verified" if good else "not verified", ok=good,
                        message=verdict, at=time.time())
    say(("verified: " if good else "NOT verified: ") + verdict)
    return EXIT_OK if good else EXIT_FAILED


def say(text: str, *, err: bool = False) -> None:
    print(visible(text, multiline=True), file=sys.stderr if err else sys.stdout, flush=True)

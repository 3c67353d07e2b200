"""`gpuwatch kill | reap | relaunch`: the TUI's actions for scripts, with the same checks and the
same audit log (DESIGN §3, §4).

Poll the host once (its history comes from the store), build the plan, print exactly what will
be hit, ask (or take --yes), execute, poll again to verify, print the verdict. Exit 0 verified;
1 refused, failed or not verified; 2 the host could not be polled. Config errors propagate as
ConfigError (the caller exits 78). No Textual here.

What is printed quotes the box (command lines, paths, its errors): every line goes through
`say`, so the box's control characters show as `\x1b` and an escape sequence in a command line
cannot redraw the lines that say what will be hit (STYLE 14).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable

from gpuwatch.remote.actions import plan as actions
from gpuwatch.remote.config.load import load_config
from gpuwatch.remote.config.schema import ConfigError, HostConfig, select_hosts
from gpuwatch.remote.findings.base import recent
from gpuwatch.remote.model.launches import recorded_launch
from gpuwatch.remote.store import Store
from gpuwatch.remote.textsafe import visible
from gpuwatch.remote.watch.fleet import FleetWatch

EXIT_OK, EXIT_FAILED, EXIT_UNPOLLED = 0, 1, 2
VERIFY_PAUSE_S = actions.VERIFY_PAUSE_S  # also the pause between the polls a reap needs first


def run_verb(kind: str, args: argparse.Namespace) -> int:
    """`gpuwatch kill HOST PID`, `reap HOST`, `relaunch HOST RUN` from their parsed arguments."""
    return run_action(kind, host_name=args.host, config_path=args.config,
                      pid=getattr(args, "pid", None), signal=getattr(args, "signal", "TERM"),
                      run=getattr(args, "run", None), yes=args.yes, readonly=args.readonly,
                      accept_new_host_keys=args.accept_new_host_keys)


def run_action(kind: str, *, host_name: str, config_path: str | None = None,
               pid: int | None = None, signal: str = "TERM", run: str | None = None,
               yes: bool = False, readonly: bool = False, accept_new_host_keys: bool = False,
               store_path: str | None = None, ask: Callable[[str], str] = input) -> int:
    """One action verb, start to finish; returns the exit code."""
    if kind not in ("kill", "reap", "relaunch"):
        raise ValueError(kind)
    config = select_hosts(load_config(config_path), [host_name])
    host = config.hosts[0]
    readonly = readonly or config.readonly
    with Store.open(store_path) as store:
        if store.warning:
            print(f"gpuwatch: {store.warning}", file=sys.stderr)
        fleet = FleetWatch(config, store, role="action",
                           accept_new_host_keys=accept_new_host_keys)
        return asyncio.run(_run(kind, fleet, host, pid=pid, signal=signal, run=run, yes=yes,
                                readonly=readonly, ask=ask))


async def _run(kind: str, fleet: FleetWatch, host: HostConfig, *, pid: int | None,
               signal: str, run: str | None, yes: bool, readonly: bool,
               ask: Callable[[str], str]) -> int:
    history = fleet.history(host.name)  # the store's memory, the config's thresholds
    error = await poll_into(fleet, host)
    # Sustained judgements (a zombie's idle GPU, U21) need more than one snapshot: with no
    # earlier one in the store, look again.
    while (kind == "reap" and error is None
           and len(recent(history)) < history.thresholds.sustain_polls):
        await asyncio.sleep(VERIFY_PAUSE_S)
        error = await poll_into(fleet, host)
    if error is not None:
        say(f"gpuwatch: {host.name} could not be polled: {error}", err=True)
        return EXIT_UNPOLLED
    if kind == "kill":
        if pid is None:
            raise ConfigError("kill needs a PID")
        plan = actions.plan_kill(host, history, pid, signal)
    elif kind == "reap":
        plan = actions.plan_reap(host, history)
    else:
        name = run or ""
        configured = any(r.name == name for r in host.runs)
        # A run that is not configured was discovered: the store has how it was started.
        launch = None if configured else recorded_launch(fleet.store, host.name, name)
        plan = actions.plan_relaunch(host, name, history, launch)
    if plan.refusal is not None:  # said once: not "no process to signal / cannot / refused"
        say("\n".join([*(f"note: {note}" for note in plan.notes),
                       f"cannot {plan.kind} on {host.name}: {plan.refusal}"]))
        # execute() refuses it without touching the box; it is called for the audit log
        await fleet.execute(plan, readonly=readonly)
        return EXIT_FAILED
    say(plan.describe())
    if not readonly and not yes:
        if not sys.stdin.isatty():
            print("gpuwatch: not confirmed: pass --yes (there is no terminal to ask on)",
                  file=sys.stderr)
            return EXIT_FAILED
        if ask("Proceed? [y/N] ").strip().lower() not in ("y", "yes"):
            print("cancelled; nothing was sent")
            return EXIT_FAILED
    outcome = await fleet.execute(plan, readonly=readonly)
    say(outcome.message)
    if outcome.ok is False:
        return EXIT_FAILED
    errors: list[str] = []

    async def fresh_poll() -> str | None:
        error = await poll_into(fleet, host)
        if error is not None:
            errors.append(error)
        return error

    # the one verify loop (remote/actions/verify.py), its last verdict audited in the store
    verdict = await fleet.verify(plan, fresh_poll)
    if verdict is None:
        why = errors[-1] if errors else "no poll landed"
        say(f"gpuwatch: {host.name} could not be polled to verify: {why}", err=True)
        return EXIT_UNPOLLED
    say(("verified: " if verdict.ok else "NOT verified: ") + verdict.message)
    return EXIT_OK if verdict.ok else EXIT_FAILED


def say(text: str, *, err: bool = False) -> None:
    """Print text that quotes the box, its control characters visible (line breaks kept)."""
    print(visible(text, multiline=True), file=sys.stderr if err else sys.stdout, flush=True)


async def poll_into(fleet: FleetWatch, host: HostConfig) -> str | None:
    """One poll through the pipeline (judged as --once and the TUI judge, remembered); the
    error when it failed."""
    outcome = (await fleet.poll(host.name)).outcome
    return None if outcome.ok else f"{outcome.error_kind}: {outcome.error_message}"

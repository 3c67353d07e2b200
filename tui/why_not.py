"""Why an action key cannot act here, in words, with what to do instead (a toast, never
silence: a key in the footer either acts or says why not). Plain strings; no Textual."""

from __future__ import annotations

TITLES = {"kill": "Kill", "reap": "Reap", "relaunch": "Relaunch", "next_run": "Run", "pin": "Pin",
          "ack": "Acknowledge"}


def why_not(action: str, *, readonly: bool, in_host: bool,
            host: str | None, selected_run: str | None, in_processes: bool = False,
            gpus_unread: str | None = None) -> str:
    """K, z, r, n / N or P pressed while greyed out (or hidden). `in_host`: the host view is open;
    `host`: the host it shows, or the fleet's highlighted one; `in_processes`: the process
    table has the focus; `gpus_unread`: why the host's GPUs could not be read at its last
    poll (then nobody can tell what holds their memory)."""
    if action == "next_run":
        if not in_host:
            return "n / N go from run to run in a host's view: open a host (Enter) first"
        return (f"{host} has no run to go to" if selected_run is None else
                f"{selected_run} is the only run on {host}: n / N go from run to run")
    if readonly:
        return ("actions are off: this gpuwatch was started read-only (--readonly, or "
                "readonly in the config)")
    if action == "kill":
        if in_processes:
            return ("the cursor is on a run's heading, not a process: move it onto a process "
                    "(j or ↓), then press K")
        return ("no process selected: go to Processes (6), put the cursor on a process "
                "(not a run's heading), then press K" if in_host else
                "K kills a process from a host's view: open the host (Enter), go to "
                "Processes (6), pick the process, then press K")
    if action == "pin":
        if not in_host:
            return "P pins a run from a host's view: open the host (Enter), pick the run"
        return (f"{selected_run} is already in your config: P pins a run gpuwatch found by "
                "itself (a tab marked as discovered)" if selected_run else
                f"no run on {host} to pin")
    if action == "ack":
        if not in_host:
            return ("a acknowledges a dead run from a host's view: open the host (Enter), pick "
                    "the dead run (n / N), then press a")
        if selected_run is None:
            return f"no run on {host} to acknowledge: none is configured or discovered"
        return (f"{selected_run} is not dead: a acknowledges a dead run's death, so that it "
                "stops being critical (a new death is critical again)")
    if action == "relaunch":
        if not in_host:
            return ("r relaunches a run from a host's view: open the host (Enter), pick "
                    "the run (n / N), then press r")
        if selected_run is None:
            return f"no run on {host} to relaunch: none is configured or discovered"
        return (f"{selected_run} is running: r relaunches a run that has stopped "
                "(to restart it, end it first with K on its process)")
    if host is None:
        return "no host selected"
    if gpus_unread:
        return (f"cannot tell what holds VRAM on {host}: its GPUs could not be read at the "
                f"last poll ({gpus_unread})")
    return f"nothing to reap on {host}: no process holds VRAM without a live run"

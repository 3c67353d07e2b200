"""`gpuwatch [HOST ...]` and `gpuwatch --demo`: the full-screen TUI. Textual is imported here,
inside the functions, once the command line has asked for the TUI."""

from __future__ import annotations

import argparse
from dataclasses import replace

from .common import EXIT_OK, internal_error, load, started, warn_store


def run_tui(args: argparse.Namespace) -> int:
    """The full-screen TUI on the config's (or the command line's) hosts."""
    from gpuwatch.remote.store import Store
    from gpuwatch.tui.app import build_app

    config = load(args, sources=True)
    started()
    with Store.open() as store:
        warn_store(store)
        app = build_app(config, store=store, readonly=args.readonly, theme=args.theme,
                        accept_new_host_keys=args.accept_new_host_keys)
        app.run()
    return app_exit(app)


def app_exit(app: object) -> int:
    """The TUI's exit status: 0, or 70 where Textual ended it on an exception of ours (Textual
    has printed it; the error log keeps it too)."""
    if not getattr(app, "return_code", 0):
        return EXIT_OK
    from gpuwatch.tui.textual_compat import unhandled_exception

    error = unhandled_exception(app)
    return internal_error(error if error is not None else RuntimeError("the TUI failed"),
                          "the TUI")


def run_demo(args: argparse.Namespace) -> int:
    """The TUI on the demo fleet: simulated boxes behind real SSH servers on loopback, reached
    through exactly the pipeline real hosts go through (host-key checking included). Its store
    lives with the fleet's files, so a demo never mixes into the person's own history."""
    import asyncio
    import signal

    from gpuwatch.remote.config.load import load_file
    from gpuwatch.remote.sim.fleet import DemoFleet
    from gpuwatch.remote.store import Store
    from gpuwatch.tui.app import build_app

    started()

    async def main() -> object:
        async with DemoFleet.start() as fleet:
            config = load_file(fleet.config_path)
            if args.interval:
                config = replace(config, interval=args.interval)
            with Store.open(fleet.root / "gpuwatch-demo.sqlite3") as store:
                app = build_app(config, store=store, readonly=args.readonly, theme=args.theme,
                                accept_new_host_keys=args.accept_new_host_keys)
                # A closed terminal (tmux kill-session, a dropped SSH) sends SIGHUP: end as on
                # `q`, so that the fleet's servers, processes and temp folder go too.
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGHUP, signal.SIGTERM):
                    loop.add_signal_handler(sig, app.exit)
                await app.run_async()
                return app

    return app_exit(asyncio.run(main()))

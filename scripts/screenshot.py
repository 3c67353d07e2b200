"""Write docs/screenshot.svg: the demo's host view, as Textual exports it (README's picture).

Run from the repository root after ./demo.sh has set up .venv:
    .venv/bin/python scripts/screenshot.py [HOST] [--size 120x36] [--out docs/screenshot.svg]
It starts the demo fleet (simulated boxes over real SSH on loopback), polls until HOST has a
finding at warning or worse (its story told: demo-oom's death, ~20 s in; or --wait passes),
opens its host view and saves what the terminal would show. The boxes' /proc are their own
(remote/sim/proc_view.py): nothing of the machine that takes it shows but its uptime.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from gpuwatch.remote.config.load import load_file
from gpuwatch.remote.model.finding import Severity
from gpuwatch.remote.sim.fleet import DemoFleet
from gpuwatch.remote.store import Store
from gpuwatch.tui.app import build_app


async def shoot(host: str, size: tuple[int, int], out: Path, wait_s: float) -> None:
    async with DemoFleet.start() as fleet:
        config = load_file(fleet.config_path)
        with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "s.db") as store:
            app = build_app(config, store=store)
            async with app.run_test(size=size) as pilot:
                data = app.hosts[host]
                for _ in range(int(wait_s * 10)):  # its story told, and seen twice
                    if any(f.severity >= Severity.WARNING for f in data.findings) \
                            and len(data.history.snapshots) >= 3:
                        break
                    await pilot.pause(0.1)
                app.open_host(host)  # as Enter on its row does
                await pilot.pause(1.0)
                out.parent.mkdir(parents=True, exist_ok=True)
                app.save_screenshot(filename=out.name, path=str(out.parent))
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("host", nargs="?", default="demo-oom")
    parser.add_argument("--size", default="120x36")
    parser.add_argument("--out", default="docs/screenshot.svg")
    parser.add_argument("--wait", type=float, default=120.0,
                        help="seconds to wait at most for the host to have findings")
    args = parser.parse_args()
    width, height = (int(n) for n in args.size.split("x"))
    asyncio.run(shoot(args.host, (width, height), Path(args.out), args.wait))


if __name__ == "__main__":
    main()

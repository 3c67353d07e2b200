"""The terminal driver: Textual's, less one way its shutdown could hang for ever.

Textual's LinuxDriver starts its terminal output again on every SIGCONT (for Ctrl+Z, then `fg`),
also when it was never suspended. A closed terminal (tmux kill-session, a dropped SSH) sends the
app SIGHUP, and SIGCONT can come with it: the driver then began a second output thread on the
dead terminal, whose first write failed and ended that thread, so that the app's shutdown waited
for ever to hand it its last write. The demo's fleet (SSH servers, simulated runs) and its temp
folder were left behind, about one closed terminal in six. Here SIGCONT resumes only a driver
that SIGTSTP suspended.
"""

from __future__ import annotations

from typing import Any

from textual.drivers.linux_driver import LinuxDriver


class Driver(LinuxDriver):
    _suspended = False

    def _sigtstp_application(self, *args: Any) -> None:
        self._suspended = True
        super()._sigtstp_application(*args)  # stops the process here, until SIGCONT

    def _sigcont_application(self, *args: Any) -> None:
        if self._suspended:
            self._suspended = False
            super()._sigcont_application(*args)

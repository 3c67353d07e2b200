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

from .textual_compat import SignalHooksDriver


class Driver(SignalHooksDriver):
    suspended = False
    """SIGTSTP stopped the app, and no SIGCONT has resumed it yet."""

    def on_sigtstp(self) -> None:
        self.suspended = True
        self.textual_sigtstp()  # stops the process here, until SIGCONT

    def on_sigcont(self) -> None:
        if self.suspended:
            self.suspended = False
            self.textual_sigcont()

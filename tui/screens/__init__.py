"""gpuwatch.tui.screens: the fleet, a host, the action confirmation and the help screen."""

"""The one pipeline (DESIGN §1, §2): fleet.py's FleetWatch owns a fleet's watching; landing.py
(restore, judge, remember) and hooks.py (the watchdog and notifications) are its parts, called
from nowhere else."""

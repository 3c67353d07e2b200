"""FleetScreen: every host in one table, in groups where the fleet is large; `/` filters
(Enter on a single match opens it), `o` sorts, Space folds a group, Enter opens a host."""

from __future__ import annotations

import fnmatch
import time
from typing import ClassVar

from gpuwatch.remote.model.finding import Severity
from rich.cells import cell_len
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Input, Static

from ..format import human_age
from ..groups import GROUP_FROM, FleetGroup, group_key_name, group_names
from ..messages import ActionRequested, HostUpdated, OpenHost, PrepareAround, Restyled, Ticked
from ..state import HostData
from ..view import FleetView
from ..why_not import TITLES, why_not
from ..widgets.fleet_table import FleetTable, Row
from ..widgets.key_footer import KeyFooter
from .kept import KEEP, KeptScreen
from .users import UsersScreen

SORTS: tuple[tuple[str | None, str], ...] = (
    ("state", "worst first"), (None, "the config's order"), ("host", "name"),
    ("util", "GPU util, busiest first"), ("vram", "VRAM used, most first"))
"""What `o` cycles through: the fleet table's column it sorts by (its header is marked). The
first is the default: the worst host is the first row."""
STATE_RANK = {"unreachable": 0, "stale": 1, "ok": 1, "waiting": 2}
ATTENTION = "!"
"""The filter that keeps only the hosts that need a person: a warning or worse, or not polled."""
SEVERITY_WORDS = ("critical", "warning", "info", "ok")


def sort_key(column: str, h: HostData, now: float, interval: float) -> tuple[object, ...]:
    """Where host `h` goes when the fleet is sorted by `column` (the sort is stable: ties keep
    the config's order)."""
    snap = h.snapshot
    gpus = snap.gpus if snap is not None else ()
    if column == "host":
        return (h.name.lower(),)
    if column == "state":  # the verdict: critical (a failed poll too), warning, info, ok
        verdict = h.verdict(now, interval)
        return (-verdict.level, STATE_RANK.get(verdict.state, 1))
    if column == "util":
        utils = [g.util_pct for g in gpus if g.util_pct is not None]
        return (-(sum(utils) / len(utils)) if utils else 1.0,)
    used = sum(g.mem_used_mib or 0 for g in gpus)
    return (-used,)


def needs_attention(h: HostData, now: float, interval: float) -> bool:
    """A warning or worse, or data that is not fresh (a failed poll, stale, never polled)."""
    verdict = h.verdict(now, interval)
    return verdict.level >= 2 or verdict.state != "ok"


def matches(needle: str, h: HostData, now: float, interval: float) -> bool:
    """Whether the filter keeps a host: `!` the hosts that need attention; a severity or state
    word (`critical`, `warning`, `info`, `ok`, `unreachable`, `stale`) the hosts at that
    verdict; words with * or ? a glob over the host's words; else any of its words contains
    the text (name, ssh, runs, the users of its GPUs' processes, the state's words, finding
    codes, its configured group)."""
    if needle == ATTENTION:
        return needs_attention(h, now, interval)
    verdict = h.verdict(now, interval)
    if needle in SEVERITY_WORDS:
        return verdict.label == needle
    if needle in ("unreachable", "stale", "waiting"):
        return verdict.state == needle
    words = [h.name, h.config.ssh, *h.run_names(), *h.gpu_users(), h.status(now, interval).text,
             h.headline(now, interval).words, verdict.label, *(f.code for f in h.findings),
             *([h.config.group] if h.config.group else [])]
    if any(c in needle for c in "*?["):
        return any(fnmatch.fnmatchcase(w.lower(), needle) for w in words)
    return needle in " ".join(words).lower()


def summary(hosts: list[HostData], now: float, interval: float) -> list[tuple[int, str]]:
    """The fleet in the title's parts, each with how much it is needed (0 most): hosts by
    verdict ("✖1 ▲3 ●2", "…5" not polled yet), the GPUs broken (a critical finding of the
    GPU's own: ECC, recovery, off the bus), the runs dead and alive, then GPUs and idle GPUs
    ("14 GPUs", "5 idle")."""
    verdicts = [h.verdict(now, interval) for h in hosts]
    waiting = sum(v.state == "waiting" for v in verdicts)  # not polled yet: not ok either
    levels = [v.level for v in verdicts if v.state != "waiting"]
    counts = [f"{glyph}{n}" for glyph, n in (("✖", levels.count(3)), ("▲", levels.count(2)),
                                              ("●", sum(lv < 2 for lv in levels)),
                                              ("…", waiting)) if n]
    parts = [(0, " ".join(counts))] if counts else []
    broken = {(h.name, f.gpu) for h in hosts for f in h.findings
              if f.gpu is not None and f.code.startswith("gpu.")
              and f.severity is Severity.CRITICAL}
    if broken:
        parts.append((1, f"{len(broken)} GPU{'s' * (len(broken) != 1)} broken"))
    statuses = [h.run_status(name) for h in hosts for name in h.run_names()]
    dead, alive = statuses.count("dead"), statuses.count("running")
    if dead:
        parts.append((2, f"{dead} run{'s' * (dead != 1)} dead"))
    if alive:
        parts.append((6, f"{alive} running"))  # the first to go where narrow
    gpus = [g for h in hosts if h.snapshot is not None for g in h.snapshot.gpus]
    if gpus:
        parts.append((5, f"{len(gpus)} GPU{'s' * (len(gpus) != 1)}"))
        idle = sum(1 for g in gpus if g.util_pct is not None and g.util_pct < IDLE_PCT)
        if idle:
            parts.append((5, f"{idle} idle"))
    return parts


SETTLE_S = 0.2
"""A fleet of more than SETTLE_FROM hosts paints its landed polls' rows, order and title at
most this often (a smaller one as each lands)."""
SETTLE_FROM = 64
SETTLE_MAX_S = 1.0


def settle_every(hosts: int) -> float:
    """Seconds between two settles of a fleet of `hosts`: none under SETTLE_FROM, SETTLE_S
    from there, then longer as the fleet grows (0.4 s at 256 hosts, 0.8 s at 512, at most
    SETTLE_MAX_S): one repaint of the table after cells changed costs tens of milliseconds of
    the event loop whatever the fleet's size (DataTable renders each visible row anew), and a
    fleet of hundreds lands a poll every few milliseconds (bench_fleet.py's loop lag)."""
    if hosts <= SETTLE_FROM:
        return 0.0
    return min(SETTLE_MAX_S, SETTLE_S * max(1.0, hosts / (2 * SETTLE_FROM)))
IDLE_PCT = 5.0
"""A GPU under this util is idle, for the title's count."""


class FleetScreen(KeptScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        # A priority binding: taken as it arrives, before the keys behind it (a paste, a laggy
        # link: `/equip` in one read), which then go into the filter rather than to commands.
        Binding("slash", "filter", "Filter", priority=True),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("o", "sort", "Sort"),
        Binding("exclamation_mark", "attention", "Attention", key_display="!"),
        Binding("space", "fold", "Fold", key_display="Space"),
        Binding("u", "users", "Users"),
        Binding("z", "reap", "Reap"),
        # When the action above is greyed out (or hidden), its key falls through to this: a
        # toast says why nothing happened and what to do, instead of silence.
        Binding("z", "cannot('reap')", show=False),
        Binding("K", "cannot('kill')", show=False),
        Binding("r", "cannot('relaunch')", show=False),
        Binding("a", "cannot('ack')", show=False),
        Binding("n,N", "cannot('next_run')", show=False),
        Binding("P", "cannot('pin')", show=False),
        # The host view's own keys, pressed here: a toast says where they act, not silence.
        Binding("left_square_bracket,right_square_bracket", "host_only('[ ]', 'change tag')",
                show=False),
        Binding("s,S", "host_only('s S', 'smooth the loss curve')", show=False),
        Binding("l", "host_only('l', 'turn log-y on and off')", show=False),
        Binding("x", "host_only('x', 'switch the x axis')", show=False),
        Binding("1,2,3,4,5,6,7", "host_only('1-7', 'jump to a pane')", show=False),
    ]

    def __init__(self, view: FleetView) -> None:
        super().__init__(id="fleet")
        self.view = view
        self.filter_text = ""
        self.touched = False
        """A person has moved the cursor or typed here: till then it rests on the first row
        (the worst host), whatever the order brings there."""
        self.sort = 0
        """An index into SORTS: worst first, then the config's order, name, util, VRAM."""
        self._keys: dict[str, tuple[object, ...]] = {}
        """Each host's sort key when the rows were last ordered: a landed poll that leaves
        its host's key as it was cannot move it (no need to sort the fleet again)."""
        self._moved = False
        self._rows: set[str] = set()
        """Hosts whose polls landed since the last settle: their rows are painted then."""
        self._settle_due = False
        self._settled_at = float("-inf")
        self._group_of: dict[str, str] | None = group_names(list(view.hosts.values()))
        """Each host's group (tui/groups.py), or None: the fleet is not grouped."""
        self._folded: dict[str, bool] = {}
        """The groups a person folded (True) or unfolded (False) here, by name: others follow
        their default (folded where the fleet is large and every host of it is fine)."""
        self._groups: dict[str, FleetGroup] = {}
        """The groups as last shown, by name."""

    def compose(self) -> ComposeResult:
        self.mark_styled()  # its widgets are styled as they mount (screens/kept.py)
        yield Static(id="fleet-title", markup=False)
        yield Input(placeholder="filter: host, run, finding code; critical, warning, ok; "
                                "! needs attention; gpu-* globs", id="filter")
        yield FleetTable(id="fleet-table")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.query_one("#filter", Input).display = False
        self.refresh_all()
        self.query_one(FleetTable).focus()

    def on_screen_resume(self) -> None:
        self.refresh_all()
        host = self.selected_host  # back from a host: the rows around it, built ahead
        if host is not None:
            self.prepare_around(host)

    @property
    def table(self) -> FleetTable:
        return self.query_one(FleetTable)

    @property
    def selected_host(self) -> str | None:
        tables = self.query(FleetTable)  # none while the screen is being torn down
        return tables.first().selected_host if tables else None

    # -- data in ---------------------------------------------------------------------------
    def visible_hosts(self) -> list[HostData]:
        hosts = list(self.view.hosts.values())
        needle = self.filter_text.strip().lower()
        if not needle:
            return hosts
        now, interval = self.view.now(), self.view.interval
        return [h for h in hosts if matches(needle, h, now, interval)]

    def ordered_hosts(self) -> list[HostData]:
        """The hosts shown, in the order picked with `o` (the sort is stable: ties keep the
        config's order)."""
        hosts = self.visible_hosts()
        column = SORTS[self.sort][0]
        if column is None:
            return hosts
        now, interval = self.view.now(), self.view.interval
        self._keys = {h.name: sort_key(column, h, now, interval) for h in hosts}
        return sorted(hosts, key=lambda h: self._keys[h.name])

    def rows(self) -> list[Row]:
        """The table's rows: the hosts in order, or, in a grouped fleet, each group's row
        followed by its hosts unless it is folded; groups in the order of their first host
        (sorted worst first: the worst group first). While filtering, every group with a match
        is unfolded."""
        hosts = self.ordered_hosts()
        if self._group_of is None:
            self._groups = {}
            return list(hosts)
        members: dict[str, list[HostData]] = {}
        for h in hosts:
            members.setdefault(self._group_of[h.name], []).append(h)
        now, interval = self.view.now(), self.view.interval
        filtering = bool(self.filter_text.strip())
        large = len(self.view.hosts) > GROUP_FROM
        rows: list[Row] = []
        self._groups = {}
        for name, its in members.items():
            folded = False if filtering else self._folded.get(name, large and not any(
                needs_attention(h, now, interval) for h in its))
            group = self._groups[name] = FleetGroup(name, tuple(its), folded)
            rows.append(group)
            if not folded:
                rows.extend(its)
        return rows

    def refresh_all(self) -> None:
        self.table.paused = self.view.paused
        self.table.show(self.rows(), self.view.now(), self.view.interval,
                        sorted_by=SORTS[self.sort][0])
        if not self.touched and self.table.row_count:
            self.rest_on_first_host()  # the worst host, till a person moves the cursor
        self.refresh_title()

    def rest_on_first_host(self) -> None:
        """The cursor on the first host's row (under its group's row), or the first row."""
        keys = self.table.row_keys
        first = next((i for i, k in enumerate(keys) if group_key_name(k) is None), 0)
        self.table.move_cursor(row=first)

    def on_key(self) -> None:
        self.touched = True

    def on_click(self) -> None:
        self.touched = True

    def refresh_host(self, name: str) -> None:
        if not self.query(FleetTable):  # a poll landing while the screen is torn down (quit)
            return
        self.table.update_host(self.view.hosts[name], self.view.now(), self.view.interval)
        self.refresh_group_of(name)
        self.refresh_title()

    def refresh_group_of(self, host: str) -> None:
        """The row of the host's group (its counts), where the fleet is grouped."""
        name = self._group_of.get(host) if self._group_of is not None else None
        group = self._groups.get(name) if name is not None else None
        if group is not None:
            self.table.update_group(group, self.view.now(), self.view.interval)

    def tick(self) -> None:
        if not self.is_mounted or not self.query(FleetTable):
            return  # not yet composed, or being torn down (the app's tick outlives them)
        # a sorted table follows its values as they move; groups fold and unfold with theirs
        if ((SORTS[self.sort][0] is not None or self._group_of is not None)
                and self.row_keys() != self.table.row_keys):
            self.refresh_all()
            return
        self.table.paused = self.view.paused
        self.table.update_states(self.visible_hosts(), self.view.now(), self.view.interval)
        for group in self._groups.values():
            self.table.update_group(group, self.view.now(), self.view.interval)
        if self.view.paused:  # the data's age moves on
            self.refresh_title()

    def row_keys(self) -> list[str]:
        """The rows' keys as they would be shown now (hosts' names, groups' keys)."""
        return [r.name if isinstance(r, HostData) else r.key for r in self.rows()]

    def refresh_title(self) -> None:
        """One line: the parts that fit, whole; where the screen is narrow the least needed
        go first (the interval, then the sort), never a part cut mid-number."""
        view = self.view
        n = len(view.hosts)
        shown = len(self.table.shown)  # the hosts' rows (not the groups')
        parts: list[tuple[int, str]] = [(0, f"gpuwatch · {n} host{'s' * (n != 1)}")]
        parts += summary(list(view.hosts.values()), view.now(), view.interval)
        if shown != n:
            what = ("needing attention" if self.filter_text.strip() == ATTENTION
                    else f"(filter {self.filter_text!r})")
            parts.append((1, f"{shown} shown {what}"))
        if self._group_of is not None:
            k = len(set(self._group_of.values()))
            parts.append((3, f"{k} group{'s' * (k != 1)}"))
        if self.sort:  # the default, worst first, goes without saying
            parts.append((3, f"sorted by {SORTS[self.sort][1]}"))
        parts.append((4, f"polling every {view.interval:g} s"))
        if view.paused:
            now, interval = view.now(), view.interval
            ages = [s.age_s for s in (h.status(now, interval, True)
                                      for h in view.hosts.values())
                    if s.paused and s.age_s is not None]
            old = f", data {human_age(max(ages))} old" if ages else ""
            parts.append((0, f"PAUSED{old} (p resumes)"))
        if view.readonly:
            parts.append((2, "read-only"))
        title = self.query_one("#fleet-title", Static)
        width = title.size.width or self.app.size.width - 2  # less its padding
        while len(parts) > 1 and cell_len(" · ".join(p for _, p in parts)) > width:
            drop = max(range(len(parts)), key=lambda i: (parts[i][0], i))
            if parts[drop][0] == 0:
                break
            del parts[drop]
        title.update(" · ".join(p for _, p in parts))

    def on_resize(self) -> None:
        if self.is_mounted and self.query(FleetTable):
            self.refresh_title()

    # -- what the app says -----------------------------------------------------------------
    def on_host_updated(self, message: HostUpdated) -> None:
        """Landed polls settle together, at most SETTLE_S apart: their rows, then what
        depends on every host (the order, the title's counts). Each landed poll of a 512-host
        fleet sorting and counting all 512 again, and repainting the table (DataTable paints
        every visible row anew after any cell changes), was most of a blocked event loop."""
        if not (self.is_mounted and self.query(FleetTable)) or message.host not in self.view.hosts:
            return
        column = SORTS[self.sort][0]
        if column is not None:  # a host whose sort key changed moves (in the settle)
            key = sort_key(column, self.view.hosts[message.host], self.view.now(),
                           self.view.interval)
            self._moved = self._moved or key != self._keys.get(message.host)
        self._rows.add(message.host)
        self._settle_soon()

    def _settle_soon(self) -> None:
        if self._settle_due:
            return
        self._settle_due = True
        every = settle_every(len(self.view.hosts))
        wait = self._settled_at + every - time.monotonic()
        if wait > 0:
            self.set_timer(wait, self._settle)
        else:  # after the messages already queued: a burst of polls settles once
            self.call_later(self._settle)

    def _settle(self) -> None:
        self._settle_due = False
        self._settled_at = time.monotonic()
        rows, self._rows = self._rows, set()
        if not (self.is_mounted and self.query(FleetTable)):
            return
        if self._moved or self._group_of is not None:  # a group folds as its hosts turn bad
            self._moved = False
            if self.row_keys() != self.table.row_keys:
                self.refresh_all()
                return
        now, interval = self.view.now(), self.view.interval
        for name in rows:
            if name in self.view.hosts:
                self.table.update_host(self.view.hosts[name], now, interval)
        if self._group_of is not None:
            for group in {self._group_of[n] for n in rows if n in self._group_of}:
                if group in self._groups:
                    self.table.update_group(self._groups[group], now, interval)
        self.refresh_title()

    def on_ticked(self, _message: Ticked) -> None:
        self.tick()

    def on_restyled(self, _message: Restyled) -> None:
        if self.is_mounted and self.query(FleetTable):
            self.refresh_all()

    # -- keys and mouse --------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "fold":  # only a grouped fleet has groups to fold
            return self._group_of is not None
        if action == "reap":
            host = self.selected_host
            data = self.view.hosts.get(host) if host is not None else None
            if self.view.readonly or data is None:
                return None
            return True if data.reap_targets else None
        return True

    def action_reap(self) -> None:
        host = self.selected_host
        if host is not None:
            self.post_message(ActionRequested("reap", host))

    def action_cannot(self, action: str) -> None:
        """A key that cannot act here (greyed out, or a host view's key): why, and what to
        do instead."""
        host = self.selected_host
        data = self.view.hosts.get(host) if host is not None else None
        snap = data.snapshot if data is not None else None
        why = why_not(action, readonly=self.view.readonly, in_host=False, host=host,
                      selected_run=None,
                      gpus_unread=snap.gpu_error.summary if snap is not None
                      and snap.gpu_error is not None else None)
        self.notify(why, title=TITLES[action], severity="warning")

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        key = event.row_key.value
        if key is None:
            return
        group = group_key_name(str(key))
        if group is not None:  # Enter on a group's row folds or unfolds it
            self.fold_group(group)
        else:
            self.post_message(OpenHost(str(key)))

    def action_fold(self) -> None:
        """Space: fold the group under the cursor (on a host's row, the host's group, the
        cursor then on the group's row), or unfold it."""
        key = self.table.selected_key
        if key is None or self._group_of is None:
            return
        group = group_key_name(key)
        self.fold_group(group if group is not None else self._group_of[key])

    def fold_group(self, name: str) -> None:
        group = self._groups.get(name)
        if group is None:
            return
        if self.filter_text.strip():
            self.notify("every group with a match is open while filtering: Esc clears the "
                        "filter", title="Groups", timeout=3)
            return
        self._folded[name] = not group.collapsed
        self.touched = True
        self.table.move_cursor(row=self.table.row_keys.index(group.key))
        self.refresh_all()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.app.refresh_bindings()
        if event.row_key.value is not None:
            self.prepare_around(str(event.row_key.value))

    def prepare_around(self, host: str) -> None:
        """The host under the cursor, then the rows around it, nearest first (below, above,
        two below, ...), built ahead while there is room among the kept screens: in a fleet
        of up to KEEP hosts, every first opening finds its screen built."""
        shown = self.table.shown
        around: list[str] = []
        if host in shown:
            i = shown.index(host)
            nearest = (j for d in range(1, len(shown)) for j in (i + d, i - d))
            around = [shown[j] for j in nearest if 0 <= j < len(shown)][:KEEP - 1]
        self.post_message(PrepareAround(host, around))

    def action_attention(self) -> None:
        """`!`: only the hosts that need a person (a warning or worse, not polled fine); again:
        every host."""
        box = self.query_one("#filter", Input)
        if self.filter_text.strip() == ATTENTION:
            box.value = ""
            box.display = False
        else:
            box.value = ATTENTION
            box.display = True
        self.table.focus()

    def action_users(self) -> None:
        """u: who holds the GPUs; Enter there filters the fleet to that user's hosts."""
        self.app.push_screen(UsersScreen(self.view), self.filter_to)

    def filter_to(self, text: str | None) -> None:
        if not text:
            return
        box = self.query_one("#filter", Input)
        box.value = text
        box.display = True
        self.table.focus()

    def action_sort(self) -> None:
        self.sort = (self.sort + 1) % len(SORTS)
        self.refresh_all()
        self.notify(f"hosts sorted by {SORTS[self.sort][1]}", timeout=2)

    def action_host_only(self, keys: str, does: str) -> None:
        self.notify(f"{keys} {does} in a host's view: open a host (Enter) first",
                    title="Host view keys", timeout=4)

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        if box.has_focus:  # a `/` typed into the filter (the binding comes first)
            box.insert_text_at_cursor("/")
            return
        box.display = True
        # Focused now, not after the keys already queued behind `/` (Widget.focus waits its
        # turn): a paste or a laggy link brings `/equip` in one read, and its `q` quit the app.
        self.set_focus(box)

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        if box.has_focus and box.value:
            box.value = ""
            return
        box.value = ""
        box.display = False
        self.table.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        self.refresh_all()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter: back to the table, the filter kept and the cursor on the first match; where
        one host matches, it is opened (`/` a name Enter: a host found in two keys)."""
        if not event.value:
            event.input.display = False
        elif not self.table.row_count:
            self.notify(f"no host matches {event.value!r}: Esc clears the filter",
                        title="Filter", severity="warning", timeout=4)
        else:
            self.rest_on_first_host()
        self.table.focus()
        shown = self.table.shown
        if event.value and len(shown) == 1:
            self.post_message(OpenHost(shown[0]))

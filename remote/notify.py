"""Notifications: one message per finding transition and per restart, off the poll path.

Targets are Apprise URLs (`[notify] urls`, and more from the environment variable named by
`urls_env`, so tokens stay out of the config file): ntfy, Slack, Discord, Telegram, Matrix,
email, a generic JSON webhook, each as people already write it for other tools.

What is sent: a finding's appearance, escalation and clearance (computed against the store's
`notified` rows, so a cron `watch --once` sends each transition once, never again while the
finding holds), and each restart, failed restart and give-up of the watchdog. Findings below
`min_severity` or named in `mute` are never sent; in `quiet_hours` only critical ones and
give-ups are (the state is kept, so nothing bursts out when the quiet ends).

How: the poll path only appends lines to a host's batch (never waits); a batcher thread sends a
host's lines as one message `batch_s` after the first, to each target through its own thread
and queue, so a target that hangs delays only itself. Each send is bounded by `timeout_s` (the
socket timeouts Apprise gives its HTTP plugins); a failed send is retried `retries` times, 2 s,
4 s, 8 s... apart, each failure logged with the URL's secrets masked. Nothing here raises into
the poll loop.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .config.schema import NotifyConfig, quiet_span
from .model.finding import Finding, Severity
from .store import Store
from .textsafe import visible

Log = Callable[[str], None]
MARK = {"appeared": "▲", "escalated": "▲▲", "cleared": "✓", "restart": "↻",
        "verified": "✓", "failed": "✗", "gave_up": "✖", "test": "·"}


def target_urls(cfg: NotifyConfig, env: Mapping[str, str] | None = None) -> list[str]:
    """The config's URLs, then those of the environment variable (whitespace or commas)."""
    env = os.environ if env is None else env
    extra = env.get(cfg.urls_env, "") if cfg.urls_env else ""
    more = [u for u in extra.replace(",", " ").split() if u]
    return list(dict.fromkeys([*cfg.urls, *more]))


def mask(url: str) -> str:
    """A URL as it may be shown: its scheme, and its host where that is a host name or an
    address (ntfy.sh, 127.0.0.1:8080); a login, a token in the host's place (Telegram, Slack,
    Discord put theirs there) and the whole path are elided. Apprise's own privacy form was
    not enough: it shows ntfy's token, which sits where a user name would."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "***"
    authority, slash, _path = rest.partition("/")
    _login, at, hostport = authority.rpartition("@")
    shown = hostport if _HOSTLIKE.fullmatch(hostport) and (
        "." in hostport or hostport.split(":")[0] == "localhost") else "***"
    return visible(f"{scheme[:20]}://{'***@' if at else ''}{shown[:100]}{'/…' if slash else ''}")


_HOSTLIKE = re.compile(r"[A-Za-z0-9.-]+(?::\d{1,5})?")


def finding_key(f: Finding) -> str:
    return "|".join(("" if v is None else str(v)) for v in f.key)


def muted(cfg: NotifyConfig, code: str) -> bool:
    return any(code == m or (m.endswith("*") and code.startswith(m[:-1])) for m in cfg.mute)


def in_quiet_hours(cfg: NotifyConfig, at: float) -> bool:
    span = quiet_span(cfg.quiet_hours) if cfg.quiet_hours else None
    if span is None:
        return False
    t = datetime.fromtimestamp(at).astimezone()
    minute = t.hour * 60 + t.minute
    start, end = span
    return start <= minute < end if start <= end else (minute >= start or minute < end)


def _numbers(evidence: Mapping[str, Any]) -> str:
    text = json.dumps(dict(evidence), sort_keys=True, default=str, separators=(", ", ": "))
    return text if len(text) <= 300 else text[:297] + "..."


def finding_line(kind: str, f: Finding, was: str | None = None) -> str:
    where = f" run {f.run}" if f.run else (f" GPU {f.gpu}" if f.gpu is not None else "")
    head = f"{MARK[kind]} {kind} [{f.severity.label}] {f.code}{where}"
    if kind == "escalated" and was:
        head += f" (was {was})"
    return visible(f"{head}: {f.message} {_numbers(f.evidence)}")


def transitions(store: Store, cfg: NotifyConfig, host: str, findings: Iterable[Finding], *,
                polled: bool, now: float) -> list[tuple[Severity, str]]:
    """The lines to send for this poll's findings against what was notified before, and the
    store brought up to date. A failed poll clears nothing (its data is stale, not gone)."""
    before = store.notified(host)
    min_sev = Severity.parse(cfg.min_severity)
    quiet = in_quiet_hours(cfg, now)
    out: list[tuple[Severity, str]] = []
    changes: dict[str, tuple[str, float] | None] = {}
    seen: set[str] = set()
    for f in findings:
        if f.severity < min_sev or muted(cfg, f.code):
            continue
        key = finding_key(f)
        seen.add(key)
        old = before.get(key)
        if old is None:
            kind = "appeared"
        elif Severity.parse(old[0]) < f.severity:
            kind = "escalated"
        else:
            if Severity.parse(old[0]) != f.severity:
                changes[key] = (f.severity.label, now)  # eased: remembered, not sent
            continue
        changes[key] = (f.severity.label, now)
        if not quiet or f.severity >= Severity.CRITICAL:
            out.append((f.severity, finding_line(kind, f, old[0] if old else None)))
    if polled:
        for key, (sev, _) in before.items():
            if key not in seen and not key.startswith("@"):
                changes[key] = None
                code, _gpu, run, _subject = [*key.split("|"), "", "", ""][:4]
                if not quiet:
                    where = f" run {run}" if run else ""
                    out.append((Severity.INFO, visible(
                        f"{MARK['cleared']} cleared {code}{where} (was {sev})")))
    if changes:
        store.set_notified(host, changes)
    return out


@dataclass(frozen=True, slots=True)
class Sent:
    """The result of one message to one target."""

    host: str
    target: str
    """Masked."""
    title: str
    ok: bool
    at: float
    attempts: int
    error: str | None = None


def send_one(url: str, title: str, body: str, severity: Severity, timeout_s: float) -> str | None:
    """One message to one target, bounded by timeout_s; None when delivered, else why not."""
    import apprise

    plugin = apprise.Apprise.instantiate(url)
    if plugin is None:
        return "Apprise does not recognise this URL"
    for attr in ("socket_read_timeout", "socket_connect_timeout"):  # HTTP-based plugins
        if hasattr(plugin, attr):
            setattr(plugin, attr, min(float(getattr(plugin, attr) or timeout_s), timeout_s))
    said: list[str] = []

    def heard(entry: Any, _plugin: Any = None) -> None:  # Apprise >= 2: this call's own log
        said.append(str(getattr(entry, "message", "")))  # warnings and worse (log_level)

    kind = {Severity.CRITICAL: apprise.NotifyType.FAILURE,
            Severity.WARNING: apprise.NotifyType.WARNING}.get(severity, apprise.NotifyType.INFO)
    obj = apprise.Apprise()
    obj.add(plugin)
    try:
        try:
            result = obj.notify(body=body, title=title, notify_type=kind, log_callback=heard,
                                log_level=logging.WARNING)
        except TypeError:  # an Apprise before 2.0: no per-call log
            result = obj.notify(body=body, title=title, notify_type=kind)
        ok = bool(result)
    except Exception as exc:
        return scrub(f"{type(exc).__name__}: {exc}", url)[:300]
    if ok:
        return None
    return (scrub(said[-1], url)[:300] if said
            else "the target refused it or did not answer in time")


def scrub(text: str, url: str) -> str:
    """Text about a URL with the URL's secret parts (what mask() elides) made ***."""
    shown = mask(url)
    for part in sorted(set(re.split(r"[:/@?&=,#;]+", url.partition("://")[2])), key=len,
                       reverse=True):
        if len(part) >= 3 and part not in shown:
            text = text.replace(part, "***")
    return visible(text)


class _Target(threading.Thread):
    """One target's queue and sender: a target that hangs delays only itself."""

    def __init__(self, url: str, owner: Notifier) -> None:
        super().__init__(name=f"notify {mask(url)}", daemon=True)
        self.url, self.shown, self.owner = url, mask(url), owner
        self.jobs: queue.Queue[tuple[str, str, str, Severity] | None] = queue.Queue()
        self.busy = False

    def run(self) -> None:
        cfg = self.owner.cfg
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self.busy = True
            host, title, body, severity = job
            error: str | None = None
            attempt = 0
            for attempt in range(1, cfg.retries + 2):
                error = self.owner.sender(self.url, title, body, severity, cfg.timeout_s)
                if error is None or self.owner.stopping.is_set():
                    break
                wait = min(2.0 ** attempt, 300.0)
                if attempt <= cfg.retries:
                    self.owner.log(f"notify: {self.shown}: sending failed ({error}); try "
                                   f"{attempt + 1} of {cfg.retries + 1} in {wait:g} s")
                    if self.owner.stopping.wait(wait):
                        break
            sent = Sent(host, self.shown, title, error is None, time.time(), attempt, error)
            if error is not None:
                self.owner.log(f"notify: {self.shown}: message {title!r} NOT delivered after "
                               f"{attempt} tries: {error}")
            self.owner.done(sent)
            self.busy = False


class Notifier:
    """Batches each host's lines and hands each message to every target's own thread."""

    def __init__(self, cfg: NotifyConfig, urls: list[str], log: Log, *,
                 sender: Callable[[str, str, str, Severity, float], str | None] = send_one
                 ) -> None:
        self.cfg, self.log, self.sender = cfg, log, sender
        self.stopping = threading.Event()
        self._lock = threading.Condition()
        self._batches: dict[str, tuple[float, list[tuple[Severity, str]]]] = {}
        self._results: list[Sent] = []
        self._verdicts: dict[str, str] = {}
        self.targets = [_Target(u, self) for u in urls]
        for t in self.targets:
            t.start()
        self._batcher = threading.Thread(target=self._batch_loop, name="notify batcher",
                                         daemon=True)
        self._batcher.start()

    def post(self, host: str, lines: Iterable[tuple[Severity, str]],
             verdict: str | None = None) -> None:
        """Queue lines for a host (returns at once: the poll path never waits); `verdict`:
        the host's one verdict as it stands ("critical: run died: OOM-killed"), the message's
        first line."""
        lines = list(lines)
        if not lines or not self.targets:
            return
        with self._lock:
            if verdict is not None:
                self._verdicts[host] = verdict
            due, held = self._batches.get(host, (time.monotonic() + self.cfg.batch_s, []))
            held.extend(lines)
            self._batches[host] = (due, held)
            self._lock.notify_all()

    def _batch_loop(self) -> None:
        while not self.stopping.is_set():
            with self._lock:
                now = time.monotonic()
                ready = [h for h, (due, _) in self._batches.items() if due <= now]
                if not ready:
                    wait = min((d for d, _ in self._batches.values()), default=now + 1) - now
                    self._lock.wait(max(0.01, min(wait, 1.0)))
                    continue
                batches = [(h, self._batches.pop(h)[1]) for h in ready]
                verdicts = {h: self._verdicts.pop(h, None) for h in ready}
            for host, lines in batches:
                worst = max(s for s, _ in lines)
                title = f"gpuwatch: {host}: {len(lines)} event{'s' * (len(lines) != 1)}"
                if len(lines) == 1:
                    title = f"gpuwatch: {host}: " + lines[0][1].split(":", 1)[0]
                said = verdicts.get(host)
                body = (f"host {host}" + (f": {said}" if said else "") + "\n"
                        + "\n".join(line for _, line in lines))
                for t in self.targets:
                    t.jobs.put((host, visible(title[:200]), body, worst))

    def done(self, sent: Sent) -> None:
        with self._lock:
            self._results.append(sent)
            self._lock.notify_all()

    def results(self) -> list[Sent]:
        """The sends finished since the last call (for the store and the TUI)."""
        with self._lock:
            out, self._results = self._results, []
        return out

    def idle(self) -> bool:
        with self._lock:
            pending = bool(self._batches)
        return not pending and all(t.jobs.empty() and not t.busy for t in self.targets)

    def flush(self, timeout_s: float) -> bool:
        """Send what is batched now and wait for it, at most timeout_s; True when all went."""
        with self._lock:
            self._batches = {h: (0.0, lines) for h, (_, lines) in self._batches.items()}
            self._lock.notify_all()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.idle():
                return True
            time.sleep(0.02)
        return self.idle()

    def close(self, timeout_s: float = 0.0) -> None:
        if timeout_s:
            self.flush(timeout_s)
        self.stopping.set()
        for t in self.targets:
            t.jobs.put(None)


def event_line(kind: str, message: str) -> str:
    return visible(f"{MARK.get(kind, '·')} {message}")


def remember_sent(store: Store, results: Iterable[Sent]) -> None:
    """The last message sent per host, for the TUI (a row of `notified` keyed `@last`)."""
    for r in results:
        state = "sent" if r.ok else f"FAILED ({r.error})"
        store.set_notified(r.host, {"@last": (f"{r.title} → {r.target}: {state}"[:300], r.at)})


def last_sent(store: Store, host: str) -> tuple[str, float] | None:
    return store.notified(host).get("@last")

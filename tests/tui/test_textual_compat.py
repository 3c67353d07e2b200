"""The canary for Textual upgrades: each private Textual name tui/textual_compat.py relies on is
named here and checked to exist with the kind it is used as, so that an upgrade fails here, by
name, rather than as odd behaviour. And the quarantine holds: no other module of the TUI, and no
TUI test, reaches a private Textual name itself."""

from __future__ import annotations

import ast
import contextvars
import importlib
import inspect
import pkgutil
import signal
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import gpuwatch.tui
import pytest
import textual
from gpuwatch.tui import textual_compat as compat
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingsMap, BindingType
from textual.css.model import RuleSet
from textual.css.stylesheet import Stylesheet
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

TUI = Path(gpuwatch.tui.__file__).parent
TESTS = Path(__file__).parent
COMPAT = Path(compat.__file__)


# -- each internal, named, with its kind ----------------------------------------------------------

def test_the_pinned_textual_is_the_series_this_canary_passed_on() -> None:
    """pyproject.toml pins Textual to this minor series; moving the pin starts here."""
    major, minor = textual.__version__.split(".")[:2]
    assert (major, minor) == ("8", "2"), textual.__version__


def test_app_internals() -> None:
    app = App[None]()
    # set_binding_description
    assert isinstance(app._bindings, BindingsMap)
    assert isinstance(app._bindings.key_to_bindings, dict)
    # mark_screen_restyled
    assert isinstance(app._css_update_count, int)
    # unhandled_exception
    assert app._exception is None
    # mount_off_stack: what push_screen does to a screen, by these names and parameters
    assert callable(App._load_screen_css)
    assert list(inspect.signature(App._load_screen_css).parameters) == ["self", "screen"]
    assert callable(App._register)
    assert list(inspect.signature(App._register).parameters)[:3] == ["self", "parent", "widgets"]


def test_screen_internals() -> None:
    screen = Screen[None]()
    # mark_screen_restyled
    assert isinstance(screen._css_update_count, int)
    # lay_out_screen
    assert callable(screen._refresh_layout)
    assert list(inspect.signature(Screen._refresh_layout).parameters)[:2] == ["self", "size"]
    # visible_widgets: a property of the compositor, a dict of widget: (region, clip)
    assert isinstance(inspect.getattr_static(type(screen._compositor), "visible_widgets"),
                      property)


def test_stylesheet_internals() -> None:
    sheet = Stylesheet(variables={"primary": "red"})
    assert sheet._variables == {"primary": "red"}  # stylesheet_variables
    # use_parsed_rules sets what Stylesheet.reparse sets
    assert isinstance(sheet._rules, list)
    assert sheet._rules_map is None
    assert sheet._require_parse is False
    reparse = inspect.getsource(Stylesheet.reparse)
    for name in ("self._rules =", "self._rules_map = None", "self._require_parse = False"):
        assert name in reparse, name


def test_footer_internals() -> None:
    from textual import _context
    from textual.widgets import _footer

    assert isinstance(_context.active_message_pump, contextvars.ContextVar)  # as_message_pump
    assert compat.FooterKey is _footer.FooterKey and issubclass(_footer.FooterKey, Widget)
    key = _footer.FooterKey("k", "k", "Kill", "kill", disabled=True)
    assert key._disabled is True  # set_footer_key_disabled
    assert (key.key, key.key_display, key.description, key.action) == ("k", "k", "Kill", "kill")
    assert isinstance(Footer.__dict__["_bindings_ready"], reactive)  # mark_footer_bindings_ready
    assert compat.WATCHERS == "__watchers"
    assert '"__watchers"' in inspect.getsource(importlib.import_module("textual.reactive"))


async def test_the_driver_registers_its_signal_handlers_by_their_private_names(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Textual's LinuxDriver puts `_sigtstp_application` and `_sigcont_application` in place
    as the process's SIGTSTP and SIGCONT handlers; SignalHooksDriver's hooks hang from them."""
    from textual.drivers.linux_driver import LinuxDriver

    assert callable(LinuxDriver._sigtstp_application)
    assert callable(LinuxDriver._sigcont_application)
    calls: list[str] = []
    monkeypatch.setattr(LinuxDriver, "resume_application_mode",
                        lambda self: calls.append("textual"))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTSTP, signal.SIGCONT)}
    try:
        driver = compat.SignalHooksDriver(App[None]())
        assert signal.getsignal(signal.SIGTSTP) == driver._sigtstp_application
        assert signal.getsignal(signal.SIGCONT) == driver._sigcont_application
        driver._sigcont_application(signal.SIGCONT, None)  # the default hook: Textual's own
        assert calls == ["textual"]
        monkeypatch.setattr(driver, "on_sigcont", lambda: calls.append("hook"))
        driver._sigcont_application(signal.SIGCONT, None)
        assert calls == ["textual", "hook"]
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


# -- the functions over them, doing what they say ------------------------------------------------

def test_use_parsed_rules_makes_a_kept_parse_the_stylesheets_rules() -> None:
    def parsed(colour: str) -> Stylesheet:
        sheet = Stylesheet(variables={"c": colour})
        sheet.add_source("Static { color: $c; }", read_from=("test", ""))
        sheet.parse()
        return sheet

    sheet, other = parsed("#FF0000"), parsed("#0000FF")
    assert "#FF0000" in sheet.css
    rules: list[RuleSet] = other.rules
    use_rules_map = sheet.rules_map  # built, to be dropped with the old rules
    assert use_rules_map
    compat.use_parsed_rules(sheet, rules)
    assert sheet.rules is rules and "#0000FF" in sheet.css and "#FF0000" not in sheet.css
    assert compat.stylesheet_variables(other) == {"c": "#0000FF"}


class Tiny(App[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("p", "pause", "Pause")]

    def compose(self) -> ComposeResult:
        yield Static("watched", id="watched")
        yield Footer()

    def action_pause(self) -> None:
        pass


class Watching(Widget):
    seen: list[object]

    def on_mount(self) -> None:
        self.seen = []
        self.watch(self.app.query_one("#watched"), "visible", self.seen.append, init=False)


async def test_set_binding_description_changes_what_the_footer_says() -> None:
    app = Tiny()
    async with app.run_test() as pilot:
        compat.set_binding_description(app, "p", "Resume")
        await pilot.pause()
        assert app.screen.active_bindings["p"].binding.description == "Resume"
        assert app.screen.active_bindings["p"].binding.action == "pause"


async def test_drop_detached_watchers_forgets_only_the_gone() -> None:
    app = Tiny()
    async with app.run_test() as pilot:
        watched = app.query_one("#watched")
        gone, stays = Watching(), Watching()
        await app.screen.mount(gone, stays)
        entries = getattr(watched, compat.WATCHERS)["visible"]
        assert {node for node, _ in entries} >= {gone, stays}
        await gone.remove()
        await pilot.pause()
        compat.drop_detached_watchers(watched)
        nodes = {node for node, _ in getattr(watched, compat.WATCHERS)["visible"]}
        assert stays in nodes and gone not in nodes


async def test_a_screen_laid_out_and_mounted_off_the_stack_shows_its_widgets() -> None:
    app = Tiny()
    async with app.run_test(size=(40, 10)) as pilot:
        screen = Screen[None]()
        app.install_screen(screen, "ahead")
        compat.mount_off_stack(app, screen)
        await screen.mount(Static("ahead", id="ahead"))
        await pilot.pause()
        compat.lay_out_screen(screen, Size(40, 10))
        shown = compat.visible_widgets(screen)
        assert [w.id for w, _ in shown if w is not screen] == ["ahead"]
        assert all(isinstance(r, Region) and r.width == 40 for _, r in shown)
        compat.mark_screen_restyled(app, screen)
        assert screen._css_update_count == app._css_update_count


async def test_as_message_pump_is_the_current_pump_within_the_block() -> None:
    from textual._context import active_message_pump

    app = Tiny()
    async with app.run_test():
        footer = app.query_one(Footer)
        with compat.as_message_pump(footer):
            assert active_message_pump.get() is footer
        assert active_message_pump.get() is not footer


# -- the quarantine -------------------------------------------------------------------------------

def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@cache
def parsed(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"))


@cache
def textual_private_names(cls: type) -> frozenset[str]:
    """The private names Textual's classes in `cls`'s MRO define or set on self."""
    names: set[str] = set()
    for base in cls.__mro__:
        if not base.__module__.startswith("textual"):
            continue
        names |= {n for n in vars(base) if private(n)}
        path = inspect.getsourcefile(base)
        for node in parsed(path).body if path else ():
            if isinstance(node, ast.ClassDef) and node.name == base.__name__:
                names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                          and isinstance(n.value, ast.Name) and n.value.id == "self"
                          and private(n.attr)}
    return frozenset(names)


def tui_modules() -> Iterator[Any]:
    yield gpuwatch.tui
    for info in pkgutil.walk_packages(gpuwatch.tui.__path__, "gpuwatch.tui."):
        if not info.name.endswith(".__main__"):  # that one runs the command line
            yield importlib.import_module(info.name)


def textual_classes() -> set[type]:
    """The Textual classes gpuwatch's code holds: those its classes derive from, and those it
    reaches through them."""
    from textual._compositor import Compositor

    found: set[type] = {App, Screen, Widget, Stylesheet, Compositor, compat.FooterKey}
    for module in tui_modules():
        for value in vars(module).values():
            if inspect.isclass(value) and value.__module__.startswith("gpuwatch."):
                found |= {b for b in value.__mro__ if b.__module__.startswith("textual")}
    return found


def reaches(path: Path, module: Any, every_textual: frozenset[str]) -> list[str]:
    """Where the file reaches a private Textual name: an import from a private module, an
    attribute of another object named as one of Textual's, `self._x` in a subclass of a
    Textual class where Textual has `_x` (also a definition: it would shadow Textual's), or a
    getattr of one by its name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []

    def where(node: ast.AST, what: str) -> None:
        found.append(f"{path.name}:{getattr(node, 'lineno', 0)}: {what}")

    def visit(node: ast.AST, cls: type | None) -> None:
        if isinstance(node, ast.ClassDef):
            value = getattr(module, node.name, None) if module is not None else None
            cls = value if inspect.isclass(value) else None
            ours = textual_private_names(cls) if cls is not None else frozenset()
            for item in node.body:
                names = ([item.name] if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                         else [t.id for t in getattr(item, "targets", [getattr(item, "target",
                                                                                 None)])
                               if isinstance(t, ast.Name)])
                for name in names:
                    if name in ours:
                        where(item, f"{node.name} defines Textual's {name}")
        elif isinstance(node, ast.ImportFrom | ast.Import):
            modules = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                       else [a.name for a in node.names])
            for name in modules:
                if name.split(".")[0] == "textual" and any(private(p) for p in name.split(".")):
                    where(node, f"imports {name}")
        elif isinstance(node, ast.Attribute) and private(node.attr):
            is_self = isinstance(node.value, ast.Name) and node.value.id == "self"
            if is_self and cls is not None and node.attr in textual_private_names(cls):
                where(node, f"self.{node.attr} is Textual's")
            elif not is_self and node.attr in every_textual:
                where(node, f"{ast.unparse(node.value)}.{node.attr} is Textual's")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)
              and (node.args[1].value in every_textual or node.args[1].value == "__watchers")):
            where(node, f"{node.func.id}(..., {node.args[1].value!r})")
        for child in ast.iter_child_nodes(node):
            visit(child, cls)

    visit(tree, None)
    return found


PENDING: set[str] = set()
"""Reaches still to move behind textual_compat (file: what). Each must still be found: one that
went is struck from here."""


def unnumbered(hit: str) -> str:
    path, _line, what = hit.split(":", 2)
    return f"{path}:{what}"


def test_no_module_of_the_tui_but_the_compat_one_reaches_textual_internals() -> None:
    every = frozenset().union(*(textual_private_names(c) for c in textual_classes()))
    modules = {Path(m.__file__): m for m in tui_modules()}
    assert COMPAT in modules and len(modules) > 30
    found = [hit for path, module in sorted(modules.items()) if path != COMPAT
             for hit in reaches(path, module, every)]
    assert [hit for hit in found if unnumbered(hit) not in PENDING] == [], "\n".join(found)
    gone = PENDING - {unnumbered(hit) for hit in found}
    assert not gone, f"moved behind textual_compat, strike from PENDING: {gone}"
    # and the scan finds them where they are
    assert any("imports textual.widgets._footer" in hit for hit in reaches(COMPAT, compat, every))
    assert any("_css_update_count" in hit for hit in reaches(COMPAT, compat, every))


def test_no_tui_test_nor_the_harness_reaches_textual_internals() -> None:
    """Tests record toasts through the app's own notify and name FooterKey from the compat
    module; only this canary names Textual's internals."""
    every = frozenset().union(*(textual_private_names(c) for c in textual_classes()))
    paths = [*sorted(TESTS.glob("*.py")), *sorted((TESTS.parent / "harness").glob("*.py"))]
    assert len(paths) > 10
    found = [hit for path in paths if path != Path(__file__) for hit in reaches(path, None, every)]
    assert found == [], "\n".join(found)

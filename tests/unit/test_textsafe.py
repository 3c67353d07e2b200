"""The one sanitiser for box text on its way to a terminal (remote/textsafe.py): every control
character, escape sequence and reordering character becomes visible text; nothing is dropped."""

from __future__ import annotations

import unicodedata

import pytest
from gpuwatch.remote.textsafe import visible
from hypothesis import given, settings
from hypothesis import strategies as st

ESC, BEL = "\x1b", "\x07"
OSC_TITLE = f"{ESC}]2;PWNED{BEL}"


@pytest.mark.parametrize(("raw", "shown"), [
    ("python train.py --lr 3e-4", "python train.py --lr 3e-4"),
    (f"train.py {OSC_TITLE}", "train.py \\x1b]2;PWNED\\x07"),
    (f"{ESC}[2J{ESC}[H", "\\x1b[2J\\x1b[H"),
    ("a\rb", "a\\rb"),
    ("a\nb\tc", "a\\nb\\tc"),
    ("nul\x00 del\x7f", "nul\\x00 del\\x7f"),
    ("\x9b2J", "\\x9b2J"),  # C1 CSI: one byte that some terminals read as ESC [
    ("\x85next", "\\x85next"),  # NEL
    ("ckpt-\udcff", "ckpt-\\xff"),  # a byte that was not UTF-8 (surrogateescape), as that byte
    ("\ud800", "\\ud800"),
    ("evil\u202etxt.py", "evil\\u202etxt.py"),  # right-to-left override
    ("a\u2028b", "a\\u2028b"),
    ("[bold]x[/] [@click=app.quit]q[/]", "[bold]x[/] [@click=app.quit]q[/]"),  # not markup's job
    ("日本語 ✓ é", "日本語 ✓ é"),
    ("C:\\x1b", "C:\\x1b"),
    ("", ""),
])
def test_one_line(raw: str, shown: str) -> None:
    assert visible(raw) == shown


def test_multiline_keeps_line_breaks_and_tabs() -> None:
    log = f"step 1\tloss 0.9\r\nstep 2 {ESC}[31mred{ESC}[0m\nsaving\r50%\rto [/data/ckpt]\n"
    assert visible(log, multiline=True) == (
        "step 1\tloss 0.9\nstep 2 \\x1b[31mred\\x1b[0m\nsaving\\r50%\\rto [/data/ckpt]\n")


def test_plain_text_is_returned_as_is() -> None:
    text = "python train.py --config llama.yaml"
    assert visible(text) is text


def _allowed(char: str, multiline: bool) -> bool:
    """Multi-line text keeps its line breaks and tabs; one line keeps no control at all."""
    return multiline and char in "\t\n"


def _reference(text: str, multiline: bool) -> str:
    """What visible() must give, written out independently: each unsafe character as its
    escape, every other character as it was (CRLF is one line break in multi-line text)."""
    if multiline:
        text = text.replace("\r\n", "\n")
    out = []
    for char in text:
        code = ord(char)
        if _allowed(char, multiline) or not _unsafe(char):
            out.append(char)
        elif char in "\t\n\r":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r"}[char])
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        else:
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


def _unsafe(char: str) -> bool:
    category = unicodedata.category(char)
    return (category in ("Cc", "Cs", "Zl", "Zp")
            or char in "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


TEXT = st.text(alphabet=st.characters(exclude_categories=()), max_size=60) | st.lists(
    st.sampled_from([ESC, BEL, "\r", "\n", "\t", "\x9b", "\x00", "\udcff", "\u202e", "[", "]",
                     "a", "é", "\\", "x1b", "2;T"]), max_size=30).map("".join)


@settings(derandomize=True, max_examples=400, deadline=None)
@given(text=TEXT, multiline=st.booleans())
def test_any_string_comes_out_printable_and_faithful(text: str, multiline: bool) -> None:
    shown = visible(text, multiline=multiline)
    # Nothing a terminal could take for an order: no control but the allowed whitespace, no
    # surrogate (unprintable), no line separator, no reordering character.
    assert all(_allowed(c, multiline) or not _unsafe(c) for c in shown), repr(shown)
    shown.encode("utf-8")  # printable to any UTF-8 terminal: no lone surrogate left
    # Faithful: every character is there, as itself or as its visible escape, in order.
    assert shown == _reference(text, multiline)
    # Already visible text stays as it is (sanitising twice changes nothing).
    assert visible(shown, multiline=multiline) == shown

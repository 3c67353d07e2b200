"""Box text on its way to a terminal: every control character made visible, nothing dropped.

A command line, a hostname, a file name or a log line from a box is data, and a terminal reads
some characters as orders: ESC starts an escape sequence (`ESC ] 2 ; title BEL` retitles the
window, `ESC [ 2 J` clears it, a cursor move can overwrite the very line that says which pid a
kill will hit), BEL rings, CR goes back over what was printed, and the C1 range holds one-byte
forms of the same (U+009B is CSI). So before any of it is printed, `visible()` replaces each
such character with a short printable escape, `\\x1b`, `\\r`, `\\u202e`, keeping everything else
as written (STYLE 14). It is the one sanitiser: the TUI's widgets, toasts and dialogs and the
CLI's prompts all use it, and it is stdlib only, so `remote/` uses it without Textual.

Markup is a separate matter: the TUI must also show `[bold]` from a box as written, which its
callers do by building Text objects or passing markup=False; nothing here knows about markup.
"""

from __future__ import annotations

import re

SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
"""Bidirectional formatting characters: they reorder how the text around them is drawn, so a
command line could read differently from what it is (the "Trojan source" trick)."""
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff" + BIDI + "]")
"""What is never printed as is: C0, DEL and C1 controls, the Unicode line and paragraph
separators (Python's splitlines and some terminals break lines there), lone surrogates (what
surrogateescape makes of a file name that is not UTF-8: printing one raises
UnicodeEncodeError) and the bidirectional formatting characters."""
LINE_ENDS = re.compile("\r?\n")


def escape_char(char: str) -> str:
    """One unsafe character as printable text: `\\r`, `\\x1b`, `\\u202e`; a surrogate that
    stands for an undecodable byte (surrogateescape, U+DC80-U+DCFF) as that byte, `\\xff`."""
    if char in SHORT:
        return SHORT[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:
        code -= 0xDC00
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, multiline: bool = False) -> str:
    """`text` with every control character made visible (see UNSAFE), safe to print.

    One line (a cell, a title, a prompt): newlines and tabs are shown as `\\n` and `\\t` too,
    so one value stays on one line. multiline=True (a log tail, a dialog's body): line breaks
    (LF, and CRLF, which is one line break written the Windows way) and tabs are kept; a lone CR,
    which a terminal takes for "back to the start of the line", is shown as `\\r`."""
    if multiline:
        return "\n".join(_escape(line, keep_tab=True) for line in LINE_ENDS.split(text))
    return _escape(text, keep_tab=False)


def _escape(text: str, *, keep_tab: bool) -> str:
    if not UNSAFE.search(text):  # the common case: nothing to do, no copy
        return text
    return UNSAFE.sub(lambda m: "\t" if keep_tab and m.group() == "\t" else escape_char(m.group()),
                      text)

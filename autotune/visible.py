"""The one function every untrusted text passes through before autotune shows or stores it (a port holder's command
line, a server's answer, a name from a study file): control characters made visible, so that no ESC or BEL reaches a
terminal, no newline splits an event line, and no bidirectional override reorders what a reader sees; ``cell`` is the
same for a Markdown table's cell (summary.md), where a ``|`` would end the cell and HTML would be rendered."""
from __future__ import annotations

import re

#: C0 and C1 controls, DEL, line and paragraph separators, invisible formatting (bidi overrides and isolates,
#: zero-width characters, the byte-order mark, interlinear annotations), lone surrogates and tag characters
_HIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f"
                     "\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]")


def visible(text: str) -> str:
    """``text`` with each hidden character written as its escape (ESC as \\x1b, U+2028 as \\u2028)."""
    return _HIDDEN.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


#: what Markdown (as GitHub and most viewers render it) would read as markup in a table cell
_MARKUP = {"|": "\\|", "<": "&lt;", ">": "&gt;", "&": "&amp;"}


def cell(text: str) -> str:
    """``text`` as one cell of a Markdown table: ``visible``, with ``|`` escaped and HTML written out as text."""
    return "".join(_MARKUP.get(c, c) for c in visible(text))

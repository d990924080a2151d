"""Names from the store written as text, never as markup (issue 45). A leaf module (standard library only).

Experiment, run, tag and param names come from whoever wrote the store or the histories file. On d747b32 an
experiment named ``x` <img src=x onerror=alert(1)> `\\n# Injected heading`` broke out of its code span in
``report.md`` (a heading, raw HTML and a ``javascript:`` link landed as markup), a ``<script>`` or a remote image
in a tag passed through the tables, CSV cells began with ``=HYPERLINK(`` (a spreadsheet runs them as formulas),
and a label ``$\\undefinedmacro$`` stopped every figure (matplotlib's mathtext; the figures draw text with
``parse_math=False`` instead: :mod:`analysis.figures`). LaTeX was already escaped (:func:`analysis.tables.latex_escape`).

- :func:`md_text`: Markdown text or a table cell: control and bidirectional-override characters become a space
  (no new line, so no new heading or row; no reordered text), ``<`` before a letter, ``/``, ``!`` or ``?`` (an
  HTML tag or autolink) becomes ``&lt;``, ``](`` (a link or an image) becomes ``]\\(``. Ordinary labels
  (``mean_n(n=16)``, ``tis(C=2,token)``, ``1<2<4``, ``P(row > column)``) come out unchanged.
- :func:`md_code`: a code span that no backtick inside the name can close.
- :func:`csv_cell`: a string starting with ``=``, ``+``, ``-``, ``@``, tab or CR (that is not a number) gets a
  leading ``'`` (OWASP's rule against CSV formula injection).
"""
from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_TAG = re.compile(r"<(?=[A-Za-z/!?])")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def plain(text: object) -> str:
    """``text`` on one line, with no control or bidirectional-override character."""
    return _CONTROL.sub(" ", str(text))


def md_text(text: object) -> str:
    """``text`` safe as Markdown text (module docstring)."""
    return _TAG.sub("&lt;", plain(text)).replace("](", "]\\(")


def md_code(text: object) -> str:
    """``text`` as one Markdown code span (literal: no markup inside is rendered)."""
    text = plain(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def csv_cell(value: object) -> object:
    """``value``, with a leading ``'`` when it is a string a spreadsheet would run as a formula."""
    if not isinstance(value, str) or not value.startswith(FORMULA_START):
        return value
    try:
        float(value)
        return value  # a number written as text (-0.5)
    except ValueError:
        return "'" + value

"""Text fit for a file that is shared (a histories file, meant to be committed): no credential, no absolute
local path. A leaf module (standard library and :mod:`harness.uri` only).

Why (issue 45, wrong case 2): ``analysis export`` wrote the tracking URI as given, password included, into the
histories file's header, and every run's ``tracking.uri`` and ``out_dir`` params carried the author's absolute
paths (``sqlite:////home/alice/...``, ``/home/alice/.../runs/<sig>``). Now every string the file holds from the
store (the header's URI, run tags and params, experiment tags) goes through :func:`shareable`:

- a URI (``scheme://...``) loses its userinfo and password-like query values (:func:`harness.uri.redact`);
- a local file URI or an absolute path (``sqlite:////a/b/mlruns.db``, ``file:///a/b``, ``/a/b/c``) keeps its last
  component only, under ``<local>``: ``sqlite:///<local>/mlruns.db``, ``<local>/c`` (the run folder's signature
  stays readable; where it was on the author's disk does not travel).

Run names and metric names are left as they are (chosen names, not paths). The analysis reads none of the
rewritten values (``tracking.*`` and ``out_dir`` are not identity params: :mod:`analysis.load`), so the tables
from a file are unchanged.
"""
from __future__ import annotations

import re

from harness.uri import redact

LOCAL = "<local>"
_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]*")
_FILE_URI = re.compile(r"\b(sqlite|file):/*(/[^\s'\"]*)")
_ABS_PATH = re.compile(r"(?<![\w.~:/\-])/[^\s'\"/]+/[^\s'\"]*")


def _last(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def shareable(text: str) -> str:
    """``text`` with no credential and no absolute local path (module docstring)."""
    if not isinstance(text, str) or ("/" not in text and "@" not in text and "=" not in text):
        return text
    text = _URI.sub(lambda m: redact(m.group(0)), text)
    text = _FILE_URI.sub(lambda m: f"{m.group(1)}:///{LOCAL}/{_last(m.group(2))}", text)
    return _ABS_PATH.sub(lambda m: f"{LOCAL}/{_last(m.group(0))}", text)


def shareable_map(values: dict) -> dict:
    """Every value of ``values`` (tags, params) through :func:`shareable`; keys as they are."""
    return {k: shareable(v) for k, v in values.items()}

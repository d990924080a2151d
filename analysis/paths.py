"""Where the analysis writes: ``--out`` if given, else ``<project>/figures/<experiment>``.

The default folder is resolved under the project, not the working directory, and the experiment name is
made a plain folder name first: an MLflow experiment may be named ``../../x`` or ``team/x`` (MLflow allows
it), and on 56d12ff ``figures/../../x`` was written outside the project. A leaf module (no heavy imports).
"""
from __future__ import annotations

import re
from pathlib import Path

from harness.uri import ROOT

FIGURES = ROOT / "figures"
NAME_MAX = 200


def folder_name(experiment: str) -> str:
    """``experiment`` as one plain folder name: path separators, NUL and control characters become ``_``,
    surrounding blanks go, and a name of dots only (``.``, ``..``) or an empty one gets a leading ``_``."""
    name = re.sub(r"[/\\\x00-\x1f\x7f]", "_", str(experiment)).strip()[:NAME_MAX]
    return name if name.strip(".") else f"_{name}"


def out_folder(experiment: str, out: str | Path | None = None) -> Path:
    """The report's folder: ``out`` as given (the user chose it), else ``FIGURES/<folder_name(experiment)>``."""
    return Path(out) if out else FIGURES / folder_name(experiment)

"""Where the analysis writes: ``--out`` if given, else ``<home>/figures/<experiment>``.

``<home>`` is the harness's one rule for where it writes (:func:`harness.uri.home`: ``$MOE_RL_HOME``, else the
project root in a source checkout, else the working directory of an installed package), read at each call. On
d747b32 the default was ``harness.uri.ROOT / "figures"``: the folder above the package, which for an installed
wheel is ``site-packages`` (issue 45). The experiment name is made a plain folder name first: an MLflow experiment
may be named ``../../x`` or ``team/x`` (MLflow allows it), and on 56d12ff ``figures/../../x`` was written outside
the project. A leaf module (no heavy imports).
"""
from __future__ import annotations

import re
from pathlib import Path

from harness.uri import home

NAME_MAX = 200


def figures_root() -> Path:
    """``<home>/figures`` (module docstring)."""
    return home() / "figures"


def folder_name(experiment: str) -> str:
    """``experiment`` as one plain folder name: path separators, NUL and control characters become ``_``,
    surrounding blanks go, and a name of dots only (``.``, ``..``) or an empty one gets a leading ``_``."""
    name = re.sub(r"[/\\\x00-\x1f\x7f]", "_", str(experiment)).strip()[:NAME_MAX]
    return name if name.strip(".") else f"_{name}"


def out_folder(experiment: str, out: str | Path | None = None) -> Path:
    """The report's folder: ``out`` as given (the user chose it), else ``<home>/figures/<folder_name(experiment)>``."""
    return Path(out) if out else figures_root() / folder_name(experiment)

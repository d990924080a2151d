"""Which code produced a run: the git commit of the checkout (``-dirty`` when it has local changes), or in the
container image (no ``.git``) the commit its build wrote to ``BUILD_COMMIT`` (containers/install_in_image.sh).

The one place the harness asks git; every run (local, seed pack, probe, verl) tags ``git_commit`` with it.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

from harness.uri import BUILD_COMMIT_FILE

ROOT = Path(__file__).resolve().parents[1]


def git_commit(root: Path = ROOT) -> str:
    """``<sha>`` or ``<sha>-dirty``; outside a git checkout the image's ``BUILD_COMMIT``, else ``unknown`` (an
    installed copy, a bare job dir)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root).returncode != 0
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        try:
            return (root / BUILD_COMMIT_FILE).read_text().strip() or "unknown"
        except OSError:
            return "unknown"

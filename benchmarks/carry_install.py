"""Install the carried wheels of every distribution this machine lacks (a bare GPU machine: no network, no index).

    python benchmarks/carry_install.py WHEELS_DIR SITE_DIR

``make gpu-wheels`` resolved the wheels together where there is a network (.whl/study-cpXY); here each one whose
distribution is not installed is installed with ``--no-index --no-deps`` into ``SITE_DIR``, which the caller puts
first on ``PYTHONPATH`` (``benchmarks/gpu_study.sh``, ``benchmarks/gpu_session.sh``). A distribution found on
``sys.path`` (``SITE_DIR`` included, once on ``PYTHONPATH``) counts as installed, so a second call installs nothing.
"""
from __future__ import annotations

import importlib.metadata as md
import pathlib
import re
import subprocess
import sys


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(argv: list[str]) -> int:
    wheels, site = pathlib.Path(argv[0]), argv[1]
    have = {norm(d.metadata["Name"]) for d in md.distributions() if d.metadata["Name"]}
    carried = sorted(wheels.glob("*.whl"))
    missing = [w for w in carried if norm(w.name.split("-")[0]) not in have]
    print(f"carry_install: {len(missing)} of {len(carried)} carried wheels missing here, installed into {site}")
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade",
                        "--target", site, *map(str, missing)], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""A real single-node Slurm cluster on this machine, from Python (the tests' fixture uses it).

    with LocalCluster() as c:          # bash slurm/start.sh; SLURM_CONF exported in os.environ
        ...                            # python -m harness.sweep ... launcher=slurm
                                       # on exit: bash slurm/stop.sh STATE --rm (jobs cancelled, daemons stopped by PID)

``slurm_ready()`` says whether one can be started here, and why not (the reason a test skips with).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from harness.uri import ROOT

SLURM_DIR = ROOT / "slurm"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "srun", "sinfo")


def _which(tool: str, path: str | None) -> str | None:
    found = shutil.which(tool, path=path)
    if found is None and path is None:  # daemons live in /usr/sbin, not always on a user's PATH
        found = shutil.which(tool, path="/usr/sbin:/sbin")
    return found


def missing_tools(path: str | None = None) -> list[str]:
    return [t for t in DAEMONS + CLIENTS if _which(t, path) is None]


def slurm_ready(install: bool = True, path: str | None = None) -> tuple[bool, str]:
    """``(True, "")`` if a local cluster can be started; else ``(False, why)``. With ``install``,
    missing tools are installed first through ``slurm/install.sh`` (Debian/Ubuntu, as root)."""
    missing = missing_tools(path)
    if missing and install and os.geteuid() == 0 and path is None:
        r = subprocess.run(["bash", str(SLURM_DIR / "install.sh")], capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            return False, (f"Slurm tools absent ({', '.join(missing)}) and `bash slurm/install.sh` could not "
                           f"install them: {last}")
        missing = missing_tools(path)
    if missing:
        how = "run `bash slurm/install.sh` as root" if os.geteuid() == 0 else "install slurm-wlm and munge as root"
        return False, f"Slurm tools absent: {', '.join(missing)} not found ({how})"
    if os.geteuid() != 0:
        return False, "a local Slurm cluster needs root (slurmd launches jobs; munged runs as the munge user)"
    return True, ""


class LocalCluster:
    def __init__(self, state_dir: str | Path | None = None, cpus: int | None = None, remove: bool = True):
        self.state_dir = Path(state_dir) if state_dir else None
        self.cpus = cpus
        self.remove = remove
        self.conf: str | None = None
        self.start_s: float | None = None
        self._old_conf: str | None = None

    def start(self) -> "LocalCluster":
        env = dict(os.environ)
        if self.cpus:
            env["SLURM_LOCAL_CPUS"] = str(self.cpus)
        env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"
        t0 = time.time()
        args = ["bash", str(SLURM_DIR / "start.sh")] + ([str(self.state_dir)] if self.state_dir else [])
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"slurm/start.sh failed ({r.returncode}):\n{r.stderr.strip()}")
        line = next(x for x in r.stdout.splitlines() if x.startswith("export SLURM_CONF="))
        self.conf = line.split("=", 1)[1].strip()
        self.state_dir = Path(self.conf).parent
        self.start_s = time.time() - t0
        self._old_conf = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = self.conf
        return self

    def stop(self) -> None:
        if self.state_dir is None:
            return
        args = ["bash", str(SLURM_DIR / "stop.sh"), str(self.state_dir)] + (["--rm"] if self.remove else [])
        subprocess.run(args, capture_output=True, text=True, timeout=120)
        if self._old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = self._old_conf

    def log_tail(self, n: int = 20) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            p = (self.state_dir or Path(".")) / "log" / name
            if p.exists():
                out.append(f"--- {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-n:]))
        return "\n".join(out)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""Jobs inside the container image (issue 44): ``launcher.container`` of a sweep spec.

    launcher:
      name: slurm
      container:
        runtime: apptainer               # apptainer | pyxis
        image: /shared/moe-rl-harness.sif   # apptainer: the SIF; pyxis: what --container-image takes (a .sqsh,
                                         # or docker://... / an enroot URI)
        mounts: [/shared]                # host paths (or src:dst) the job needs: MOE_RL_HOME, the data, the model
        python: python                   # the image's interpreter (the harness is installed in it)
        exe: apptainer                   # apptainer: its binary (e.g. singularity, or a site wrapper)
        workdir: null                    # pyxis: --container-workdir (default: the image's own)

What it changes: the command every Slurm step runs. On the submitit path (``harness.sweep ... launcher=slurm``)
submitit's ``srun ... <python> -u -m submitit.core._submit <folder>`` gets the container: apptainer through the
python command (``apptainer exec --nv --bind <mounts> <image> python``), pyxis through ``srun``'s own flags
(``--container-image``, ``--container-mounts``, ``--container-workdir``) and the image's ``python``. On the sbatch
path (``harness.backends.verl.launch.sbatch_script``) the ``srun`` of the node processes and the USR1 handler's
``requeue`` command run in it the same way, and the script does not ``cd`` into the submitting machine's checkout.
The batch shell itself stays on the host (Slurm's signals, ``scontrol requeue``). The environment passes into the
container (both runtimes do by default): set ``MOE_RL_HOME`` (and ``MLFLOW_TRACKING_URI``) in ``launcher.setup`` or
before submitting. The image's harness must be the submitting checkout's commit: the job's callable is pickled by
reference (its ``BUILD_COMMIT`` is the image's ``git_commit`` tag).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field, fields
from typing import Any, Optional

RUNTIMES = ("apptainer", "pyxis")


class ContainerError(ValueError):
    """A bad ``launcher.container``: the message names the key."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


@dataclass(frozen=True)
class ContainerConfig:
    runtime: str
    image: str
    mounts: tuple = field(default_factory=tuple)
    python: str = "python"
    exe: str = "apptainer"
    workdir: Optional[str] = None


def parse(raw: Any, key: str = "launcher.container") -> Optional[ContainerConfig]:
    """``launcher.container`` (a mapping, or null/empty: no container) as a :class:`ContainerConfig`."""
    if raw in (None, {}):
        return None
    if not isinstance(raw, dict):
        raise ContainerError(key, f"expected a mapping (runtime, image, mounts, python, exe, workdir), got {raw!r}")
    names = [f.name for f in fields(ContainerConfig)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ContainerError(f"{key}.{unknown[0]}", f"unknown key; allowed: {', '.join(names)}")
    runtime = raw.get("runtime")
    if runtime not in RUNTIMES:
        raise ContainerError(f"{key}.runtime", f"expected one of {', '.join(RUNTIMES)}, got {runtime!r}")
    image = raw.get("image")
    if not isinstance(image, str) or not image.strip():
        raise ContainerError(f"{key}.image", "expected the image (apptainer: the .sif path; pyxis: what "
                             "--container-image takes)")
    mounts = raw.get("mounts") or []
    if isinstance(mounts, str):
        mounts = [mounts]
    if not isinstance(mounts, list) or not all(isinstance(m, str) and m and "," not in m for m in mounts):
        raise ContainerError(f"{key}.mounts", f"expected a list of paths or src:dst pairs (no commas), got {mounts!r}")
    for k in ("python", "exe"):
        v = raw.get(k, getattr(ContainerConfig, k))
        if not isinstance(v, str) or not v.strip():
            raise ContainerError(f"{key}.{k}", f"expected a command, got {v!r}")
    workdir = raw.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        raise ContainerError(f"{key}.workdir", f"expected an absolute path inside the image, got {workdir!r}")
    if workdir is not None and runtime != "pyxis":
        raise ContainerError(f"{key}.workdir", "pyxis only (apptainer starts in the submitting directory)")
    return ContainerConfig(runtime=runtime, image=image, mounts=tuple(mounts),
                           python=raw.get("python", "python"), exe=raw.get("exe", "apptainer"), workdir=workdir)


def python_command(c: Optional[ContainerConfig], host_python: str) -> str:
    """The shell words that start the job's python: the host's without a container, else the image's (apptainer:
    wrapped in ``apptainer exec --nv``; pyxis: srun's flags put the step in the image, see :func:`srun_args`)."""
    if c is None:
        return shlex.quote(host_python)
    if c.runtime == "apptainer":
        bind = ["--bind", ",".join(c.mounts)] if c.mounts else []
        return shlex.join([*shlex.split(c.exe), "exec", "--nv", *bind, c.image, *shlex.split(c.python)])
    return shlex.join(shlex.split(c.python))


def srun_args(c: Optional[ContainerConfig]) -> list[str]:
    """``srun``'s container flags (pyxis/enroot); none for apptainer or without a container."""
    if c is None or c.runtime != "pyxis":
        return []
    out = [f"--container-image={c.image}"]
    if c.mounts:
        out.append(f"--container-mounts={','.join(c.mounts)}")
    if c.workdir:
        out.append(f"--container-workdir={c.workdir}")
    return out


def one_off(c: Optional[ContainerConfig], host_python: str) -> str:
    """A command run from the batch shell (the USR1 handler's ``requeue``): inside the image too; with pyxis as a
    one-task step beside the running one (``srun --overlap``)."""
    if c is not None and c.runtime == "pyxis":
        return shlex.join(["srun", "--overlap", "--nodes=1", "--ntasks=1", *srun_args(c)]) + " " + \
            python_command(c, host_python)
    return python_command(c, host_python)

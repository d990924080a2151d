"""The process's CPU numerics: pinned, so that the same spec and seed give the same bits on any x86-64 CPU.

Why (issue 27, item 0): a float32 GEMM's result depends on its summation order, and two libraries choose that
order by the CPU they find:

- **MKL** (torch's CPU BLAS: every ``mm``/``bmm``/``grouped_mm``) dispatches by vendor and ISA. On an AMD EPYC it
  runs one code path whatever ``MKL_CBWR`` branch is asked for, except ``COMPATIBLE``; an Intel Xeon runs its
  AVX-512 kernels. The golden curves written on one failed on the other in the low bits of every estimator.
  ``MKL_CBWR=COMPATIBLE`` (MKL's conditional numerical reproducibility: SSE2 without the approximate ``rcpps`` /
  ``rsqrtps``, fixed cache sizes, deterministic reductions) is the one branch MKL runs identically on Intel and
  non-Intel CPUs (oneMKL Developer Guide, "Specifying Code Branches" and "Getting Started with CNR").
- **ATen** (torch's own elementwise and reduction kernels) dispatches by ``ATEN_CPU_CAPABILITY``: AVX-512 where the
  CPU has it, else AVX2. The two give other bits (the golden curves of every estimator differ between them). Pinned to ``avx2``, which every
  x86-64 CPU of the last decade has: the same instructions, so the same bits, on AVX2-only and AVX-512 machines.

Both are read once per process, before torch's first operator (ATen) or MKL's first call; :func:`pin` sets them
in the environment (so the processes a run starts, an overlap rollout process or a submitit job, inherit them) and
:func:`check`, called before a local run computes anything, refuses to train when they did not take effect (an
operator ran before the pin). The price: GEMMs on SSE2, 1.35x (recompute) to 1.40x (mean_n n=8) the step time
on a 2-core AVX-512 machine (``benchmarks/numerics_cost.py``, docs/speed.md).

What cannot be pinned is recorded: :func:`fingerprint` (torch, MKL branch, ATen capability, CPU model) goes with
every local run (tag ``numerics.fingerprint``) and every golden entry. Its ``key`` is what bitwise identity is
promised over (torch version, the pins in effect); the CPU model is information. A GPU run's kernels are the
GPU's: its key names the device, and it is compared with runs of that device only.
"""
from __future__ import annotations

import ctypes
import os
import platform
from functools import lru_cache
from pathlib import Path

from harness.errors import ConfigError

#: the ATen kernels every run uses (``ATEN_CPU_CAPABILITY``), where the CPU supports them
ATEN_CAPABILITY = "avx2"
#: MKL's conditional-numerical-reproducibility branch, the same on every x86-64 vendor (``MKL_CBWR``)
MKL_BRANCH = "COMPATIBLE"
_MKL_CBWR_BRANCH, _MKL_BRANCHES = 1, {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
                                      8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512",
                                      13: "AVX512_MIC_E1", 14: "AVX512_E1"}


@lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's processor string."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def target_capability() -> str | None:
    """The capability a run pins (``AVX2``), or None where it cannot (not x86-64, or a CPU without AVX2)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or "avx2" not in _cpuinfo().get("flags", "").split():
        return None
    return ATEN_CAPABILITY.upper()


def pin() -> None:
    """Pin the numerics of this process and of the processes it starts: call before torch's first operator."""
    if target_capability() is not None:
        os.environ["ATEN_CPU_CAPABILITY"] = ATEN_CAPABILITY
    os.environ["MKL_CBWR"] = MKL_BRANCH


@lru_cache(maxsize=1)
def _mkl():
    """torch's statically linked MKL service functions, or None (a torch without MKL)."""
    import torch

    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        lib.mkl_serv_cbwr_get.restype = ctypes.c_int
        return lib
    except (OSError, AttributeError):
        return None


def mkl_branch() -> str:
    """The MKL branch in effect (``COMPATIBLE`` when pinned), or ``none`` for a torch without MKL."""
    import torch

    if not torch.backends.mkl.is_available() or _mkl() is None:
        return "none"
    code = _mkl().mkl_serv_cbwr_get(_MKL_CBWR_BRANCH)
    return _MKL_BRANCHES.get(code, f"code {code}")


def fingerprint(device: str = "cpu") -> dict[str, str]:
    """What the bits of a run depend on. ``key``: what bitwise identity is promised over (same key, same bits);
    the rest is recorded for information. A GPU run's key promises bits only with ``deterministic`` in it
    (:func:`deterministic`); without, two runs of one GPU differ in the low bits (docs/reliability.md)."""
    import torch

    fp = {"torch": torch.__version__, "aten": torch.backends.cpu.get_cpu_capability(), "mkl": mkl_branch(),
          "cpu": cpu_model()}
    if str(device).startswith("cuda"):
        fp["device"] = torch.cuda.get_device_name(torch.device(device))
        mode = "deterministic" if torch.are_deterministic_algorithms_enabled() else "nondeterministic"
        fp["key"] = f"torch {fp['torch']} | {fp['device']} | {mode}"
    else:
        fp["key"] = f"torch {fp['torch']} | aten {fp['aten']} | mkl {fp['mkl']}"
    return fp


#: cuBLAS's workspace setting for reproducible GEMMs (CUDA's documentation, "Results reproducibility"; PyTorch's
#: "Reproducibility" notes): without it, use_deterministic_algorithms raises on the first cuBLAS call
CUBLAS_WORKSPACE = ":4096:8"


def deterministic(on: bool = True) -> None:
    """Ask torch for deterministic kernels in this process, or not (``backend.deterministic``; set for each pack, so a
    job's later pack of another spec does not inherit it): on a GPU, the atomic adds and cuBLAS's split reductions
    replaced by reproducible ones, at a price (docs/speed.md); an operation with no deterministic kernel raises
    instead of running. The cuBLAS workspace setting must precede the process's first cuBLAS call."""
    import torch

    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(on)


def pinned() -> bool:
    """Whether the pins are in effect in this process (where they apply)."""
    import torch

    want = target_capability()
    aten_ok = want is None or torch.backends.cpu.get_cpu_capability() == want
    mkl = mkl_branch()
    return aten_ok and mkl in ("none", MKL_BRANCH)


def check() -> None:
    """Refuse to compute a local run's numbers unpinned (the curve would depend on the CPU): pin, then verify."""
    import torch

    pin()
    if pinned():
        return
    raise ConfigError("numerics", f"CPU numerics not pinned (ATen {torch.backends.cpu.get_cpu_capability()}, MKL "
                                  f"{mkl_branch()}; a run needs ATen {target_capability()} and MKL {MKL_BRANCH}): a "
                                  "torch operator ran before harness.numerics.pin(); call it first, or export "
                                  f"ATEN_CPU_CAPABILITY={ATEN_CAPABILITY} MKL_CBWR={MKL_BRANCH}")

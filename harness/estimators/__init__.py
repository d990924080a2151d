"""Old-policy estimators, one module each (docs/design.md section 2)."""
from harness.estimators.base import REGISTRY, Estimator, OldPolicy, PolicyForward, build
from harness.estimators import (  # noqa: F401  (registration)
    rollout, recompute, tis, mis, icepop, r3, mean_n, rais, deterministic,
)

NAMES = tuple(REGISTRY)

__all__ = ["REGISTRY", "NAMES", "Estimator", "OldPolicy", "PolicyForward", "build"]

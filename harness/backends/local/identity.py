"""What the local backend adds to a spec's identity (``Backend.identity``, read by ``harness.spec.identity``).

The local engines are this project's code: when a change to them changes a curve bitwise, or changes what a key
means, the signature must move so that runs computed before are never found as finished by, nor pooled with, the
new code's. Stored runs keep their old signatures and stay readable. Imports nothing (no torch).
"""
from __future__ import annotations

from typing import Any, Mapping

#: the local engines' numerics version, part of every local run's signature: bump it whenever a change to the local
#: kernels changes a curve bitwise (2: grouped expert GEMMs, seed packs, batched mean_n; 3: CPU numerics pinned,
#: harness/numerics.py; 4: keyed random numbers, philox.py, for the engine, the prompts and the minibatch shuffles,
#: and split-K selected per row). tests/test_golden.py pins the curves and tells when to bump it.
LOCAL_NUMERICS = 4
#: since issue 15 the local training engine applies ``inference.temperature`` to its log-probs (before, logp_rec was
#: at T = 1 whatever the sampler's T): a local spec at T != 1 computes something new, so its signature carries this
#: marker; at T = 1 nothing changed (no division) and the signature stays. verl's actor always applied T.
LOCAL_TRAIN_TEMPERATURE = "sampler"
#: the KL-held controller's rule (kl_control.py), signed by every local spec with ``inference.kl_target`` > 0:
#: 2 = the stochastic-approximation rule whose fixed point is E[k3] = K*. Version 1 (commit 2b2a5d3, unsigned) held
#: the geometric mean of k3 at K*; its runs are never found as finished by, nor pooled with, runs of this rule
KL_CONTROL = 2


def markers(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The markers a local spec signs: the numerics version always, the others where their meaning applies."""
    inference = spec.get("inference") or {}
    out: dict[str, Any] = {"local_numerics": LOCAL_NUMERICS}
    if inference.get("temperature", 1.0) != 1.0:
        out["train_temperature"] = LOCAL_TRAIN_TEMPERATURE
    if inference.get("kl_target", 0.0) > 0:
        out["kl_control"] = KL_CONTROL
    return out

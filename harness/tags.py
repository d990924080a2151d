"""The MLflow tags of a run (docs/design.md section 6), one list for every backend.

Local runs, seed packs, probes and verl runs all tag with ``run_tags``; analysis groups by ``group_sig``
and labels by the rest. ``tag_values`` keeps the Python types (the verl translation passes them to its
plugin as Hydra values); MLflow stores their ``str``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.provenance import git_commit

if TYPE_CHECKING:  # pragma: no cover
    from harness.spec import RunConfig


def model_shape(cfg: "RunConfig") -> str:
    """The policy's shape in one word, e.g. ``L2-E8-k4-d64`` (MoE) or ``L2-ff256-d64`` (dense)."""
    m = cfg.model
    if m.kind == "moe":
        return f"L{m.n_layers}-E{m.n_experts}-k{m.top_k}-d{m.d_model}"
    return f"L{m.n_layers}-ff{m.ffn_hidden}-d{m.d_model}"


def perturbation(cfg: "RunConfig") -> str:
    """The explicit inference perturbations that are on, e.g. ``router=1,bias=0.5`` (or ``none``); a KL-held run
    (``inference.kl_target`` > 0: its one perturbation scaled to hold the KL) is ``kind@k3=target``, e.g.
    ``router@k3=0.003``: its arm is the target, not the starting level."""
    from harness.spec import perturbations_on

    i = cfg.inference
    on = [(kind, value) for kind, _, value in perturbations_on(i)]
    if i.kl_target > 0 and len(on) == 1:
        return f"{on[0][0]}@k3={i.kl_target:g}"
    return ",".join(f"{k}={v:g}" for k, v in on) or "none"


def tag_values(cfg: "RunConfig", commit: str | None = None) -> dict[str, Any]:
    """The run's tags with their Python types (``na`` for an estimator knob the estimator does not use)."""
    e = cfg.estimator
    na = lambda v: "na" if v is None else v  # noqa: E731
    return {
        "estimator": e.name, "n": na(e.n), "clip_c": na(e.clip_c), "level": na(e.level), "seed": cfg.seed,
        "backend": cfg.backend.name, "model": cfg.model.name, "model_kind": cfg.model.kind, "task": cfg.task.name,
        "spec_sig": cfg.signature, "group_sig": cfg.group_signature,
        "git_commit": commit if commit is not None else git_commit(),
        "perturbation": perturbation(cfg), "model_shape": model_shape(cfg),
        **estimator_extras(cfg),
    }


def estimator_extras(cfg: "RunConfig") -> dict[str, Any]:
    """The run estimator's parameters declared after the original six (``harness.spec.identity.LEGACY_ESTIMATOR_PARAMS``),
    when set: a new estimator's knobs reach its tags, so analysis labels it (``toy(scale=0.5)``); the nine
    estimators' tags are unchanged."""
    from harness.spec.identity import LEGACY_ESTIMATOR_PARAMS as LEGACY_PARAMS

    return {k: v for k, v in vars(cfg.estimator).items()
            if k not in LEGACY_PARAMS and k != "name" and v is not None}


def run_tags(cfg: "RunConfig", commit: str | None = None) -> dict[str, str]:
    """The tags as MLflow stores them (strings)."""
    return {k: str(v) for k, v in tag_values(cfg, commit).items()}

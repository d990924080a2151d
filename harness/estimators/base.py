"""The estimator interface and its registry: how pi_old (the IS denominator) is obtained.

An estimator turns a rollout batch into an :class:`OldPolicy` - the denominator ``logp`` of the
PPO ratio, an extra detached per-token ``weight`` (TIS/MIS/IcePop), a ``mask`` (rejected tokens
contribute no gradient) and an optional routing ``replay`` for the training forwards (R3). It may
also rescale the ratio inside the loss (RAIS) or replace the objective itself (``loss``: token-mean PPO by
default; ``gmpo_rs``: GMPO's per-sequence geometric mean). The trainer only calls these hooks; it never
looks at an estimator's name.

**Row-wise.** Every hook works on the rows of a batch ([B, R] tensors) and reduces nothing across rows: ``loss``
returns the objective's unreduced terms (:class:`~harness.estimators.losses.LossTerms`, per token or per
sequence, with how they aggregate), and the trainer aggregates them within each seed's slice of a seed pack (as
verl's ``agg_loss``). So no hook receives the pack's size: a pack of S seeds is S x B rows to an estimator.

Everything an estimator may need is reached through :class:`OldPolicyContext` (lazy, cached,
timed by the trainer), so an estimator pays only for what it uses.

**Declared once.** Each estimator is one module of this package with one ``@register``-ed subclass
of :class:`Estimator` that declares, beside its formula: ``name``; ``Params``, the dataclass of its
parameters with their types and its own ``validate()``; ``needs`` (:class:`Needs`: an MoE router, routing
replay, n inference passes, deterministic inference); ``rank`` and ``style`` (table order, plot colour and
line style); ``camp`` (the family of fixes it belongs to: the figures' small multiples draw one panel per camp);
``verl`` (:class:`Verl`, how it runs on verl, or None: refused there). Config validation, run labels,
analysis labels and palette, the verl translation and the tests read this registry
(``harness.estimators.NAMES`` / ``get(name)``); a new estimator is one module plus
``experiments/estimator/<name>.yaml``.

**Composing** (the seam for e.g. mean_n's denominator with a TIS weight): ``old_policy`` returns the
denominator and the weight separately, so a composed estimator is a subclass whose ``old_policy`` takes
another estimator's :class:`OldPolicy` and replaces its ``weight``/``mask`` (:meth:`OldPolicy.with_weight`),
with ``Params`` inheriting both parameter dataclasses (``mean_n_tis``: mean_n's denominator estimate inside TIS).
An estimator may also change the inference engine it runs with (``Estimator.inference``: ``deterministic``).

This module imports no torch at import time (only tensor methods are used), so that ``harness.spec``
can read the registry cheaply.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Optional, Protocol

from harness.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

    from harness.estimators.losses import LossTerms
    from harness.spec import EstimatorConfig, RunConfig


@dataclass
class PolicyForward:
    """What a training-engine forward returns for the response tokens of a batch."""

    logp: Tensor  # [B, R] log-prob of each response token
    router_logp: Optional[Tensor] = None  # [B, R, L, E] log router probs at the predicting positions
    selected: Optional[Tensor] = None  # [B, R, L, k] experts used at the predicting positions
    entropy: Optional[Tensor] = None  # [B, R]
    routes: Optional[Tensor] = None  # [B, T, L, k] experts used at every position of the sequence (r2's replay)


@dataclass
class OldPolicy:
    logp: Tensor  # [B, R] IS denominator (detached)
    weight: Tensor  # [B, R] extra detached weight, 1 when the estimator has none
    mask: Tensor  # [B, R] 1 = token contributes to the loss
    replay: Optional[Tensor] = None  # [B, T, L, k] experts to replay in training forwards (-1 = own routing)
    router_logp: Optional[Tensor] = None  # [B, R, L, E] pre-update router log-probs (RAIS)
    selected: Optional[Tensor] = None  # [B, R, L, k] pre-update top-k (RAIS)

    def select(self, idx: Tensor) -> "OldPolicy":
        """The rows ``idx`` of every tensor (a minibatch)."""
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        return OldPolicy(pick(self.logp), pick(self.weight), pick(self.mask), pick(self.replay),
                         pick(self.router_logp), pick(self.selected))

    def with_weight(self, weight: Tensor, mask: Optional[Tensor] = None) -> "OldPolicy":
        """The same denominator with another detached weight (and mask): the composing seam."""
        return dataclasses.replace(self, weight=weight.detach(), mask=self.mask if mask is None else mask)


class OldPolicyContext(Protocol):
    """Lazy access to the quantities an estimator may use (see trainer.OldPolicyContext)."""

    logp_roll: Tensor  # [B, R] inference engine's sampling log-prob
    mask: Tensor  # [B, R] response mask
    routed_experts: Optional[Tensor]  # [B, T, L, k] experts the inference engine used

    def recompute(self, replay: Optional[Tensor] = None) -> PolicyForward: ...
    def score(self, n: int) -> Tensor: ...  # [n, B, R] fresh inference scorings


# --------------------------------------------------------------------------------- declarations
def knob(label: Optional[str] = None, doc: str = "", axis: bool = False, default: Any = dataclasses.MISSING) -> Any:
    """A parameter field. ``label``: its short name in the estimator's label (``"C"`` -> ``tis(C=2,...)``,
    ``""`` -> the bare value, ``None`` -> not in the label). ``axis``: a sweep axis the analysis tables, plots and
    trend-tests by default (any numeric knob is one with ``report --x KNOB``). ``default``: the knob's one default
    (the spec's estimator section takes it where the knob is unset); none: the knob is required."""
    return field(default=default, metadata={"label": label, "doc": doc, "axis": axis})


@dataclass
class Params:
    """An estimator's parameters, the schema of its part of the spec: subclasses add typed fields with their
    defaults and axis flags (:func:`knob`) and check their values in ``validate``, raising
    ``ConfigError("estimator.<field>", ...)``. A field without a default is required (null refused)."""

    def validate(self) -> None:
        pass


@dataclass(frozen=True)
class Needs:
    """What an estimator needs from the model and the engines (checked and provided from here)."""

    router: bool = False  # an MoE router (router log-probs or routed experts): refused on a dense model
    replay: bool = False  # the inference engine's routed experts, replayed in the training forwards
    deterministic: bool = False  # a batch-invariant, fixed-order inference engine


@dataclass(frozen=True)
class Style:
    """Plot style of the estimator's curves: a colour name of ``analysis.palette.COLOURS`` (matplotlib's tab10
    names but gray - the palette's "unknown" - plus a few more: navy, teal, ...) and a line style."""

    colour: str
    linestyle: str = "-"


@dataclass(frozen=True)
class Verl:
    """How the estimator runs on verl 0.9.1 (``harness/backends/verl/translate.py`` applies it).

    Beyond these fields, ``needs.replay`` switches on Megatron's router replay (R3) and
    ``needs.deterministic`` vLLM's full determinism. ``Params`` arguments below are the run's parameters."""

    bypass: bool = False  # rollout_correction.bypass_mode: pi_old := the rollout log-prob, no actor forward
    #: rollout_correction fields beyond the defaults (IS weight, rejection sampling), from the Params
    correction: Optional[Callable[[Any], dict[str, Any]]] = None
    #: with a ``correction``: verl computes an IS weight (``rollout_is``); False: rejection sampling only (geo_rs)
    is_weight: bool = True
    agent_loop: Optional[str] = None  # the rollout's agent loop (registered by our plugins)
    #: its multi-turn variant on verl's ToolAgentLoop, used when the spec sets ``verl.tools``; an estimator with
    #: an ``agent_loop`` but no ``tool_agent_loop`` is refused there (ConfigError), never run single-turn
    tool_agent_loop: Optional[str] = None
    loss_mode: str = "vanilla"  # actor.policy_loss.loss_mode
    #: Megatron's ``router_replay.mode`` the estimator needs beyond ``needs.replay`` (R3): "R2" (r2), or None
    router_replay: Optional[str] = None
    env: Optional[Callable[[Any], dict[str, str]]] = None  # the workers' environment, from the Params
    harness: Optional[Callable[[Any], dict[str, Any]]] = None  # ``+harness.<k>`` keys read by our plugins
    #: verl metric -> harness metric, beyond those every (bypass / decoupled / weighted) run maps
    metrics: Mapping[str, str] = field(default_factory=dict)
    check: Optional[Callable[["RunConfig"], None]] = None  # verl-only checks of a spec (raise ConfigError)

    @property
    def weighted(self) -> bool:
        """verl computes an IS weight (``rollout_is``) for this estimator."""
        return self.correction is not None and self.is_weight


class Estimator:
    """Base class: the denominator is the training engine's recomputed log-prob, weight 1."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = Params
    needs: ClassVar[Needs] = Needs()
    rank: ClassVar[int] = 100  # position in tables and legends (then by name)
    style: ClassVar[Optional[Style]] = None  # None: the palette picks a free colour
    camp: ClassVar[str] = ""  # the family of fixes it belongs to (baseline, re-weighting, ...): figure panels
    verl: ClassVar[Optional[Verl]] = None  # None: the verl backend refuses it

    def __init__(self, params: Params):
        self.params = params

    def passes(self) -> int:
        """Fresh inference passes per step this estimator needs (the rollout side makes them: mean_n's n)."""
        return 0

    def old_policy(self, ctx: OldPolicyContext) -> OldPolicy:
        raise NotImplementedError

    def inference(self, icfg: Any) -> Any:
        """The inference engine's config (``InferenceConfig``) this estimator's runs use: the spec's, in
        deterministic mode where ``needs.deterministic``; an estimator may change more (``deterministic``)."""
        return dataclasses.replace(icfg, deterministic=True) if self.needs.deterministic else icfg

    def ratio(self, logp_new: Tensor, old: OldPolicy, new: PolicyForward) -> Tensor:
        """The PPO ratio r = pi_new / pi_old; RAIS rescales it."""
        return (logp_new - old.logp).exp()

    def loss(self, logp_new: Tensor, old: OldPolicy, new: PolicyForward, adv: Tensor, clip_eps: float) -> LossTerms:
        """The unreduced terms of the policy objective on a minibatch's rows ([B, R]; ``adv`` [B, 1]): per token,
        or per sequence where the objective is per sequence (:class:`LossTerms`). The trainer reduces them
        (``agg``: token-mean, seq-mean) within each seed of a pack, so a loss never sees the pack's size. Default:
        PPO's clipped objective of ``ratio`` weighted by ``old.weight`` on ``old.mask`` (``losses.ppo_terms``, clip
        ``trainer.clip_eps``), aggregated token-mean; an estimator with another objective overrides it
        (``gmpo_rs``: GMPO's per-sequence geometric mean)."""
        from harness.estimators.losses import ppo_terms

        return ppo_terms(self.ratio(logp_new, old, new), adv, old.weight, old.mask, clip_eps)

    # helpers for subclasses
    @staticmethod
    def plain(ctx: OldPolicyContext, logp: Tensor, **kw) -> OldPolicy:
        """pi_old = ``logp`` (detached; 0 where the response mask is 0: an observation or padding position's
        log-prob is never used, and may not even be finite there), weight 1, the response mask."""
        logp = logp.detach().masked_fill(ctx.mask == 0, 0.0)
        return OldPolicy(logp=logp, weight=logp.new_ones(logp.shape), mask=ctx.mask.clone(), **kw)

    # declarations read by the rest of the harness
    @classmethod
    def param_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls.Params))

    @classmethod
    def parse(cls, values: Any) -> Params:
        """The estimator's ``Params`` from a config carrying every registered parameter (``EstimatorConfig``):
        its own take their ``Params`` defaults where unset (one without a default is required), the others must be
        unset; then its own ``validate``."""
        used = cls.param_names()
        defaults = cls.defaults()
        for knob_ in parameters():
            value = getattr(values, knob_, None)
            if knob_ in used and value is None and knob_ not in defaults:
                raise ConfigError(f"estimator.{knob_}", f"required by estimator {cls.name}")
            if knob_ not in used and value is not None:
                takers = [n for n in sorted(REGISTRY, key=lambda n: (REGISTRY[n].rank, n))
                          if knob_ in REGISTRY[n].param_names()]
                raise ConfigError(f"estimator.{knob_}", f"not a parameter of estimator {cls.name} "
                                  f"(its parameters: {', '.join(used) or 'none'}); {knob_} is a parameter of "
                                  f"{', '.join(takers)}")
        given = {k: getattr(values, k, None) for k in used}
        params = cls.Params(**{k: v for k, v in given.items() if v is not None})
        params.validate()
        return params

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """The defaults its ``Params`` declare (a knob without one is absent)."""
        return {f.name: f.default for f in dataclasses.fields(cls.Params) if f.default is not dataclasses.MISSING}

    @classmethod
    def label(cls, values: Mapping[str, Any]) -> str:
        """``name(knob,...)`` from parameter values, e.g. ``tis(C=2,token)``, ``mean_n(n=8)``, ``rollout``."""
        return label_from(cls.name, [(f.metadata.get("label"), values.get(f.name))
                                     for f in dataclasses.fields(cls.Params)])


def label_from(name: str, knobs: list[tuple[Optional[str], Any]]) -> str:
    """``name(short=value,...)`` of the knobs with a label and a value (numbers as ``%g``)."""
    parts = []
    for short, value in knobs:
        if short is None or value is None:
            continue
        text = f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
        parts.append(f"{short}={text}" if short else text)
    return f"{name}({','.join(parts)})" if parts else name


# ------------------------------------------------------------------------------------- registry
REGISTRY: dict[str, type[Estimator]] = {}


def register(cls: type[Estimator]) -> type[Estimator]:
    assert cls.name and cls.name not in REGISTRY, cls.name
    assert dataclasses.is_dataclass(cls.Params) and issubclass(cls.Params, Params), cls.name
    REGISTRY[cls.name] = cls
    return cls


def parameters() -> dict[str, Any]:
    """Every registered parameter -> its type (the union ``EstimatorConfig`` is built from). Two estimators
    sharing a parameter name must give it the same type."""
    out: dict[str, Any] = {}
    for name in sorted(REGISTRY):
        hints = typing.get_type_hints(REGISTRY[name].Params)
        for f in dataclasses.fields(REGISTRY[name].Params):
            tp = hints[f.name]
            assert out.setdefault(f.name, tp) == tp, f"estimator parameter {f.name}: {out[f.name]} vs {tp} ({name})"
    return out


def axes() -> tuple[str, ...]:
    """The parameters some registered estimator declares a sweep axis (``knob(..., axis=True)``), in the order
    :func:`parameters` lists them."""
    out: dict[str, None] = {}
    for name in sorted(REGISTRY):
        out.update({f.name: None for f in dataclasses.fields(REGISTRY[name].Params) if f.metadata.get("axis")})
    return tuple(out)


def build(cfg: "EstimatorConfig") -> Estimator:
    """The estimator of the spec's section ``cfg``, with the ``Params`` the section parsed once (``cfg.params``)."""
    return REGISTRY[cfg.name](cfg.params)

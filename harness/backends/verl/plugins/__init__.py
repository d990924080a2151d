"""Our code inside verl's processes, loaded by ``VERL_USE_EXTERNAL_MODULES=harness.backends.verl.plugins``.

verl imports the modules named in that variable at the end of ``verl/__init__.py``, so every
process that imports verl (the driver, the TaskRunner, the agent-loop workers, the actor workers)
gets, by importing this package:

* ``mean_n``   - the agent loop ``harness_mean_n`` (``actor_rollout_ref.rollout.agent.default_agent_loop``)
* ``mean_n_tool`` - its multi-turn variant ``harness_mean_n_tool`` on verl's ToolAgentLoop (with ``verl.tools``)
* ``deterministic`` - the agent loop ``harness_deterministic`` (a seed and request id per sample)
* ``rais``     - the policy loss ``harness_rais`` (``actor_rollout_ref.actor.policy_loss.loss_mode``)
* ``gmpo_rs``  - the policy loss ``harness_gmpo_rs`` (verl's GMPO ``geo_mean`` on the router-shifted ratio)
* ``rais_fsdp`` - the FSDP engine patch that feeds both router log-probs (installed only with HARNESS_RAIS=1)
* ``tracking`` - our MLflow tags, the harness metric names beside verl's, no step logged twice
* ``routing`` - ``moe/routing_flip_rate`` around the trainer's old-log-prob pass (installed only with
  HARNESS_ROUTING_METRICS=1: ``verl.routing_metrics``)

Each piece only acts when the run's verl config carries our ``harness`` block (translate.py),
so a plain verl run in the same environment is unaffected.
"""
from harness.backends.verl.plugins import (deterministic, gmpo_rs, mean_n, mean_n_tool, rais, rais_fsdp,  # noqa: F401
                                          routing, tracking)  # (registration)

tracking.install()
if rais_fsdp.active():  # rais runs only: imports verl's engines (slow) and patches the FSDP engine
    rais_fsdp.install()
if routing.active():  # verl.routing_metrics runs only: imports verl's trainer (slow) and wraps its old-log-prob pass
    routing.install()

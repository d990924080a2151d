"""FAKE of ``python -m verl.trainer.main_ppo`` for CPU tests (the real one starts Ray, vLLM and GPU
workers). It does what main_ppo does before that, with verl's own code: Hydra-composes verl's
``ppo_trainer.yaml`` with the argv overrides and runs ``validate_config``; then, in place of the
training loop, verl's own ``Tracking`` (as the legacy trainer's ``fit`` builds it) logs made-up steps.
FAKE_STEPS (env) lists the steps to log, e.g. "1,2" (default: 1 .. trainer.total_training_steps, a whole run); FAKE_EXIT (env) the exit status after ``tracking.finish()``
(a crash in verl's teardown: its MLflow run is already ended FINISHED).
"""
import os
import signal
import sys
from pathlib import Path

if os.environ.get("FAKE_SIGNALS_FILE"):  # how main_ppo was started: USR2 ignored (issue 44, runner -> signals.py)
    Path(os.environ["FAKE_SIGNALS_FILE"]).write_text(
        "ignored" if signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN else "default")

import verl  # imports our plugins through VERL_USE_EXTERNAL_MODULES, as in every verl process
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.tracking import Tracking

# our plugins arrived with `import verl` (VERL_USE_EXTERNAL_MODULES), as in main_ppo's processes
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry  # noqa: E402
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402

get_policy_loss_fn("harness_rais")
assert "harness_mean_n" in _agent_loop_registry and getattr(Tracking, "_harness_installed", False)

with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer/config"), version_base=None):
    config = compose(config_name="ppo_trainer", overrides=sys.argv[1:])
validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
tracking = Tracking(project_name=config.trainer.project_name, experiment_name=config.trainer.experiment_name,
                    default_backend=list(config.trainer.logger), config=OmegaConf.to_container(config, resolve=True))
steps = os.environ.get("FAKE_STEPS") or ",".join(map(str, range(1, config.trainer.total_training_steps + 1)))
for step in [int(s) for s in steps.split(",")]:
    tracking.log({"training/global_step": step, "critic/score/mean": 0.1 * step, "rollout_corr/kl": 0.01,
                  "rollout_corr/k3_kl": 0.001, "timing_s/gen": 2.0, "timing_per_token_ms/gen": 0.25}, step=step)
tracking.finish()
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))

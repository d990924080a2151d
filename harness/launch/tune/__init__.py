"""``python -m harness.tune SPEC.yaml [OVERRIDE ...] [--no-wait] [--report] [--timeout S]``

An Optuna study over scalar knobs of a run (TIS's C first of all), with trials as Slurm jobs (or
local worker processes). The spec is a sweep spec (``harness.launch.spec``) whose ``base`` fixes
everything but the tuned keys, plus a ``tune:`` block::

    tune:
      study: tis_clip                # default: the spec's name
      storage: null                  # default: Optuna journal file <sweep_dir>/optuna.journal;
                                     # or an RDB URL (sqlite:///..., postgresql://...)
      n_trials: 24                   # trials per call; a second call on the same study adds as many
      direction: maximize
      params:
        estimator.clip_c: {type: float, low: 1.1, high: 20.0, log: true}
      sampler: {name: tpe, seed: 0, n_startup_trials: 6}          # or random
      pruner: {name: median, n_startup_trials: 4, n_warmup_steps: 40, interval_steps: 1}
                                     # or {name: successive_halving, min_resource: 20, reduction_factor: 3}
                                     # or {name: none}
      report_every: 10               # smoothed reward -> trial.report every K steps
      objective: {name: tail_mean, tail_frac: 0.2, window: 10}    # see Objective below
                                     # (what the pruner sees: a trailing mean over `window` steps)

Each trial is one run (its own signature and run folder, its MLflow run tagged ``optuna_study``
and ``optuna_trial``) executed by one job: the job opens the shared storage, asks for a trial
(or, after a requeue, takes back its own RUNNING trial), runs its backend (``harness.backends``; local: ``execute``) with an
``on_step`` that reports the smoothed reward and asks the pruner, and tells the study the
pre-registered objective (or PRUNED). The objective, the search space, the base run and the MLflow store
(redacted) are stored in the study when it is created; a later call with a different one is refused
(pre-registration; a study's trials are runs of its store).

Modules: ``objective`` (the pre-registered score), ``spec`` (the ``tune:`` block, its validation),
``study`` (Optuna storage, sampler, pruner, the registered study), ``trial`` (one trial's job),
``driver`` (submit trials, wait, mark lost ones), ``report`` (table, best value, plots), ``cli``.
"""

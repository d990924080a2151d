"""Launching many runs, on top of everything else (nothing below imports it; ``tests/test_layers.py``).

``spec`` (a sweep YAML, its command-line overrides, ``SweepError``) -> ``expand`` (planned runs, each built
and validated, each backend's launcher needs) -> ``submit`` (submitit: Slurm arrays or local workers,
each run's backend job) -> ``jobs`` (``jobs.json`` records, job states) and ``progress`` (the one MLflow
reader). Commands: ``sweep``, ``status``, ``tune/`` (Optuna studies), sharing ``cli``; ``cluster`` starts a
single-node Slurm. The collapse rule and the curve definitions they use are the report's
(``analysis.measures``, ``harness.curves``).
"""

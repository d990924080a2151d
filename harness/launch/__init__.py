"""Launching many runs: sweep specs (``sweep``), submitit executors for Slurm and this machine
(``executors``), progress (``status``) and Optuna studies (``tune``). The collapse rule and the
curve definitions they use are the report's (``analysis.measures``, ``harness.curves``). Arrows point
down: launch -> analysis / harness.run -> backends.
"""

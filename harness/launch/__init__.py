"""Launching many runs: sweep specs (``sweep``), submitit executors for Slurm and this machine
(``executors``), progress (``status``), Optuna studies (``tune``) and the pre-registered scores
they share (``scoring``). Arrows point down: launch -> harness.run -> backends.
"""

"""The harness's error for bad input (a leaf: imports nothing of the harness).

A :class:`ConfigError` names the offending key (``estimator.clip_c``, ``trainer.lr``) and what is allowed;
the command-line entry points turn it into one line on stderr and exit status 2, before anything runs.
"""


class ConfigError(ValueError):
    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")

"""The harness's error for bad input (a leaf: imports nothing of the harness).

A :class:`ConfigError` names the offending key (``estimator.clip_c``, ``trainer.lr``) and what is allowed;
the command-line entry points turn it into one line on stderr and exit status 2, before anything runs.
``require`` and ``one_of`` are the checks that raise it (harness.spec, the backends, the estimators).
"""


class ConfigError(ValueError):
    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


def require(ok: bool, key: str, message: str) -> None:
    """Raise ``ConfigError(key, message)`` unless ``ok`` (the checks of ``harness.spec`` and the backends)."""
    if not ok:
        raise ConfigError(key, message)


def one_of(value, allowed, key: str) -> None:
    """Raise ``ConfigError(key, "unknown value ...; allowed: ...")`` unless ``value`` is one of ``allowed``."""
    require(value in allowed, key, f"unknown value {value!r}; allowed: {', '.join(map(str, allowed))}")


def fail(exc: BaseException, code: int) -> int:
    """What every entry point does with an expected error: ``error: <exc>`` as one line on stderr (no
    traceback), and ``code`` as the exit status (2: bad input, nothing ran; 1: the run or submission failed)."""
    import sys

    print(f"error: {exc}", file=sys.stderr)
    return code

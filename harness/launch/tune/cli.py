"""``python -m harness.tune SPEC.yaml [OVERRIDE ...] [--no-wait] [--report] [--timeout S]``."""
from __future__ import annotations

import sys

from harness.launch.cli import cli, split_args
from harness.launch.spec import SweepError, load_spec
from harness.launch.tune.driver import run_tune
from harness.launch.tune.report import report
from harness.launch.tune.spec import parse_tune


USAGE = """usage: python -m harness.tune SPEC.yaml [OVERRIDE ...] [--no-wait] [--report] [--timeout S]

  SPEC.yaml     a sweep spec with a `tune:` block (sweeps/tis_clip.yaml)
  OVERRIDE      as harness.sweep, plus tune.KEY=VALUE (tune.n_trials=8, tune.study=NAME, ...)
  --no-wait     submit the trials and return at once (harness.status / --report show progress)
  --report      submit nothing: print the trials table and the best value, save the plots
  --timeout S   stop waiting after S seconds (the jobs keep running)
Exit status: 0 done, 2 invalid spec (nothing submitted), 1 submission failed or no trial completed."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    timeout = None
    if "--timeout" in argv:
        i = argv.index("--timeout")
        try:
            timeout = float(argv[i + 1])
        except (IndexError, ValueError):
            print("error: --timeout needs a number of seconds", file=sys.stderr)
            return 2
        del argv[i:i + 2]
    def body() -> int:
        path, overrides, opts = split_args(argv, ("--no-wait", "--report"), USAGE)
        spec = load_spec(path, overrides)
        if spec.tune is None:
            raise SweepError(f"tune: {path} has no `tune:` block (a plain sweep: python -m harness.sweep {path})",
                             key="tune")
        if "--report" in opts:
            parse_tune(spec)
            res = report(spec)
        else:
            res = run_tune(spec, wait="--no-wait" not in opts, timeout=timeout)
            if res is None and "--no-wait" in opts:
                return 0
        return 0 if res and res.get("best") else 1

    return cli(body)

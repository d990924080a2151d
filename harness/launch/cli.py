"""What the launch commands share: argument splitting, the error wrapper (exit 2 for an invalid spec,
1 for a failed submission or a folder that cannot be written) and plain-text tables."""
from __future__ import annotations

import os
import sys
from typing import Callable

from harness.errors import fail
from harness.launch.spec import SweepError
from harness.launch.submit import SubmissionError


def split_args(argv: list[str], flags: tuple[str, ...], usage: str) -> tuple[str, list[str], set[str]]:
    if any(a in ("-h", "--help") for a in argv):
        print(usage)
        raise SystemExit(0)
    opts = {a for a in argv if a.startswith("--")}
    unknown = sorted(opts - set(flags))
    if unknown:
        raise SweepError(f"unknown option {unknown[0]}\n{usage}")
    pos = [a for a in argv if not a.startswith("--")]
    if not pos or "=" in pos[0]:
        raise SweepError(f"the first argument must be a sweep spec (sweeps/*.yaml)\n{usage}")
    return pos[0], pos[1:], opts


def cli(body: Callable[[], int]) -> int:
    """Run a launch command: an invalid spec exits 2, a failed submission 1, each with one line; a reader
    that stops early (``| head``) ends the command quietly, as Unix tools do."""
    try:
        code = body()
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not as a traceback at exit
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 1
    except SweepError as exc:
        return fail(exc, 2)
    except SubmissionError as exc:
        return fail(exc, 1)
    except OSError as exc:  # a read-only or full sweep folder, study journal, jobs.json: one line (issue 45)
        where = f" {exc.filename}" if exc.filename else ""
        return fail(f"cannot write or read{where}: {exc.strerror or exc}; make it writable or free space there "
                    "(sweep_dir=PATH, runs_dir=PATH choose other folders)", 1)


def format_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])

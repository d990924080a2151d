"""Do the archived parts of a stage hold runs of this machine's numerics? (exit 2 when not)

    python scripts/parts_numerics.py docs/results/v4_map/parts

A stage that outlives its store restores its archived runs and trains only the rest (scripts/run_study_v4.sh). The
archived runs stand for runs not trained again, so they must carry the numerics key this machine trains with
(``harness.numerics.fingerprint``: torch build and the CPU pins); otherwise the stage would mix two numerics
versions, which may not be pooled (docs/preregistration_v4.md). Run the stage where its parts were trained.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from analysis.histories import read_source
    from harness import numerics

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python scripts/parts_numerics.py PARTS_DIR", file=sys.stderr)
        return 2
    numerics.pin()
    here = numerics.fingerprint("cpu")["key"]
    keys = sorted({str(r["tags"].get("numerics.key")) for r in read_source(args[0])["runs"]})
    if keys != [here]:
        print(f"error: {args[0]} holds runs of numerics {keys}; this machine trains {here!r}: the stage's runs would "
              "not pool (docs/preregistration_v4.md). Run it where its parts were trained", file=sys.stderr)
        return 2
    print(f"{args[0]}: every archived run is of this machine's numerics ({here})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

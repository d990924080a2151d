"""`python -m harness.tune`: see harness/launch/tune/."""
from harness.launch.tune.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

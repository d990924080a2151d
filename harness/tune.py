"""`python -m harness.tune`: see harness/launch/tune.py."""
from harness.launch.tune import main

if __name__ == "__main__":
    raise SystemExit(main())

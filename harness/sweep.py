"""`python -m harness.sweep`: see harness/launch/sweep.py."""
from harness.launch.sweep import main

if __name__ == "__main__":
    raise SystemExit(main())

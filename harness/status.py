"""`python -m harness.status`: see harness/launch/status.py."""
from harness.launch.status import main

if __name__ == "__main__":
    raise SystemExit(main())

"""The shipped experiment configs (Hydra's config tree: ``config.yaml`` and one folder per group), a package only so
that a wheel carries them as package data beside ``harness`` (``harness.spec.EXPERIMENTS``)."""

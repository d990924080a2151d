"""Typed knobs of the verl backend (filled in by the verl backend work)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class VerlConfig:
    pass

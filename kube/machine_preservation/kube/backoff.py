"""Exponential backoff, shared by the controller's work queue (per key), the informers (reconnects) and the drain
(evictions a PodDisruptionBudget refused)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Exponential per-key backoff: base, 2·base, 4·base, … capped."""

    base: float = 0.2
    cap: float = 300.0

    def delay(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return float(min(self.base * (2 ** min(failures - 1, 62)), self.cap))

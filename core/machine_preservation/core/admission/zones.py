"""Spreading a worker pool's value over its zones the way Gardener does (one MachineDeployment per zone).

Gardener's `DistributeOverZones`: every zone gets `total // zones`, and the first `total % zones` zones get
one more (the remainder goes to the first zones, whatever its doc comment says).
"""

from __future__ import annotations


def distribute_over_zones(*, total: int, zone_count: int) -> tuple[int, ...]:
    if zone_count <= 0:
        return ()
    share, remainder = divmod(total, zone_count)
    return tuple(share + (1 if index < remainder else 0) for index in range(zone_count))

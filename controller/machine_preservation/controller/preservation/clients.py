"""The API clients of one controller: the control cluster (Machines) and the target cluster (Nodes, pods)."""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes.aio import client


@dataclass
class Clients:
    """One ApiClient per cluster; the same object when control and target are one cluster is fine."""

    control: client.ApiClient
    target: client.ApiClient

    async def close(self) -> None:
        await self.control.close()  # type: ignore[no-untyped-call]
        if self.target is not self.control:
            await self.target.close()  # type: ignore[no-untyped-call]

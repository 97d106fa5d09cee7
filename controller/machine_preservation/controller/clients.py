"""kubernetes.aio API clients for the control and target clusters (kubeconfig file or in-cluster)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from kubernetes.aio import client, config

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


async def new_api_client(
    *, kubeconfig: Path | None, trace_configs: list[aiohttp.TraceConfig] | None = None
) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, or the in-cluster service account when `kubeconfig` is None."""
    configuration = client.Configuration()
    if kubeconfig is None:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=configuration
        )
    configuration.trace_configs = trace_configs
    return client.ApiClient(configuration=configuration)


@dataclass
class Clients:
    """One ApiClient per cluster; the same object when control and target are one cluster is fine."""

    control: client.ApiClient
    target: client.ApiClient

    async def close(self) -> None:
        await self.control.close()  # type: ignore[no-untyped-call]
        if self.target is not self.control:
            await self.target.close()  # type: ignore[no-untyped-call]

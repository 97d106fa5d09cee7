"""`--mcm-native-preservation`: whether the cluster's MCM preserves machines itself, decided once at start.

`auto` reads what the control cluster shows (MCM's Deployment in the control namespace when one is named,
MCM's Machine and MachineSet CRDs) and leaves the decision to the core. Anything that cannot be read is
evidence not given, never an error: the webhook must come up to serve its other rules.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException
from kubernetes.aio.config.config_exception import ConfigException

from machine_preservation.core.mcm_evidence import MACHINE_CRD, MACHINE_SET_CRD, MCM_DEPLOYMENT, cluster_evidence
from machine_preservation.core.mcm_generation import (
    ClusterEvidence,
    NativeDecision,
    NativePreservationMode,
    decide_native_preservation,
)
from machine_preservation.webhook.machine_sets import new_api_client

logger = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS = 5.0


async def _read(call: Callable[..., Awaitable[Any]], *args: str) -> Mapping[str, Any] | None:
    """One object as JSON; None when it cannot be read (missing, forbidden, unreachable, not JSON)."""
    try:
        response = await call(*args, _request_timeout=READ_TIMEOUT_SECONDS)
        body = await response.read()
        if response.status != 200:
            return None
        document = json.loads(body)
    except (ApiException, aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None
    return document if isinstance(document, Mapping) else None


async def read_evidence(api_client: client.ApiClient, *, namespace: str | None) -> ClusterEvidence:
    """What the control cluster shows about its MCM; `namespace`: where MCM's Deployment runs, if known."""
    extensions = client.ApiextensionsV1Api(api_client)
    read_crd = extensions.read_custom_resource_definition_without_preload_content

    async def read_deployment() -> Mapping[str, Any] | None:
        if not namespace:
            return None
        apps = client.AppsV1Api(api_client)
        return await _read(apps.read_namespaced_deployment_without_preload_content, MCM_DEPLOYMENT, namespace)

    deployment, machine_crd, machine_set_crd = await asyncio.gather(
        read_deployment(), _read(read_crd, MACHINE_CRD), _read(read_crd, MACHINE_SET_CRD)
    )
    return cluster_evidence(deployment=deployment, machine_crd=machine_crd, machine_set_crd=machine_set_crd)


async def decide(*, mode: NativePreservationMode, kubeconfig: Path | None, namespace: str | None) -> NativeDecision:
    """The decision for `mode`, reading the cluster only for `auto`; logged once."""
    evidence = ClusterEvidence()
    if mode == NativePreservationMode.AUTO:
        try:
            api_client = await new_api_client(kubeconfig=kubeconfig)
        except (ConfigException, OSError, ValueError) as error:
            logger.warning("cannot read the control cluster to detect MCM's generation: %s", error)
        else:
            async with api_client:
                evidence = await read_evidence(api_client, namespace=namespace)
    decision = decide_native_preservation(mode=mode, evidence=evidence)
    logger.info(
        "MCM native preservation: %s (%s)%s",
        "on" if decision.native else "off",
        decision.because,
        "; the deletion guard covers only preservations our controller still holds" if decision.native else "",
    )
    return decision

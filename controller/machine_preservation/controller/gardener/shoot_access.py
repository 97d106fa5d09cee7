"""An API client for a shoot, built from what Gardener keeps in the shoot's namespace of the seed.

- Where the shoot's API server is: its Service, `https://kube-apiserver.<namespace>.svc:443` (in the server
  certificate's SANs), the one address every process of the seed can reach, as Gardener's own in-seed access uses
  it. The generic token kubeconfig's server is not: it is `https://kube-apiserver` (the Service as seen from inside
  the shoot namespace) or, with gardenlet's `IstioTLSTermination` (on by default since Gardener v1.144), the
  out-of-cluster `https://api.<internal domain>`, which only the shoot namespace's pods resolve.
- Which CA signed it: the generic token kubeconfig Secret Gardener writes into every shoot namespace (its name is
  in the `Cluster`'s annotation `generic-token-kubeconfig.secret.gardener.cloud/name`); only its CA is taken.
- Who we are: the token the shoot's gardener-resource-manager writes into our shoot-access Secret (audience
  `gardener`, renewed at ~80% of its 12 h). The client reads it again before a request once `token_max_age` has
  passed, so a renewal is picked up without a new client.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import yaml
from kubernetes.aio import client

from machine_preservation.kube.api_errors import Failed, read_json
from machine_preservation.kube.clients import api_client

API_SERVER_SERVICE: Final = "kube-apiserver"
API_SERVER_PORT: Final = 443
TOKEN_MAX_AGE_SECONDS: Final = 300.0
# A drain evicts up to 10 pods at once, each on a connection of its own to the shoot; all kept for aiohttp's
# 15 s after it, a seed's overlapping drains held hundreds of idle TLS connections (~75 KiB each, +30 MiB at 200
# shoots). Two stay for the next requests (the API server probe every 10 s keeps one warm).
SHOOT_IDLE_CONNECTIONS: Final = 2


class ShootAccessUnavailable(Exception):
    """The shoot cannot be reached yet; the message says what is missing, for the Extension's status."""


@dataclass(frozen=True)
class ShootEndpoint:
    server: str
    ca_pem: str


def in_seed_server(namespace: str) -> str:
    """The shoot's API server as every namespace of the seed reaches it: its Service."""
    return f"https://{API_SERVER_SERVICE}.{namespace}.svc:{API_SERVER_PORT}"


def endpoint_from_kubeconfig(document: Mapping[str, Any], *, namespace: str) -> ShootEndpoint:
    """The shoot's Service with the CA of the kubeconfig's current context (or its only cluster); the kubeconfig's
    server is not used (see the module's docstring)."""
    clusters = {c.get("name"): c.get("cluster") or {} for c in document.get("clusters") or [] if isinstance(c, dict)}
    contexts = {c.get("name"): c.get("context") or {} for c in document.get("contexts") or [] if isinstance(c, dict)}
    context = contexts.get(document.get("current-context")) or {}
    cluster = clusters.get(context.get("cluster")) or (next(iter(clusters.values())) if len(clusters) == 1 else None)
    if not cluster:
        raise ShootAccessUnavailable("the generic token kubeconfig names no cluster")
    ca_data = cluster.get("certificate-authority-data")
    if not ca_data:
        raise ShootAccessUnavailable("the generic token kubeconfig has no certificate-authority-data")
    return ShootEndpoint(server=in_seed_server(namespace), ca_pem=base64.b64decode(ca_data).decode())


async def _read_secret(seed: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    response = await client.CoreV1Api(seed).read_namespaced_secret_without_preload_content(name, namespace)
    try:
        secret: dict[str, Any] | None = await read_json(response)
    except Failed as error:
        raise ShootAccessUnavailable(f"reading Secret {namespace}/{name}: HTTP {error.status}") from error
    return secret


def _secret_value(secret: Mapping[str, Any], key: str) -> str | None:
    value = (secret.get("data") or {}).get(key)
    return base64.b64decode(value).decode() if value else None


async def read_endpoint(seed: client.ApiClient, *, namespace: str, kubeconfig_secret: str) -> ShootEndpoint:
    if not kubeconfig_secret:
        raise ShootAccessUnavailable(f"the Cluster {namespace} names no generic token kubeconfig Secret")
    secret = await _read_secret(seed, namespace, kubeconfig_secret)
    text = _secret_value(secret, "kubeconfig") if secret is not None else None
    if text is None:
        raise ShootAccessUnavailable(f"Secret {namespace}/{kubeconfig_secret} with the shoot's kubeconfig is missing")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ShootAccessUnavailable(f"Secret {namespace}/{kubeconfig_secret}: kubeconfig does not parse") from error
    if not isinstance(document, dict):
        raise ShootAccessUnavailable(f"Secret {namespace}/{kubeconfig_secret}: kubeconfig is not a mapping")
    return endpoint_from_kubeconfig(document, namespace=namespace)


async def read_token(seed: client.ApiClient, *, namespace: str, access_secret: str) -> str:
    secret = await _read_secret(seed, namespace, access_secret)
    token = _secret_value(secret, "token") if secret is not None else None
    if not token:
        raise ShootAccessUnavailable(
            f"Secret {namespace}/{access_secret} has no token yet (the shoot's gardener-resource-manager writes it)"
        )
    return token


async def new_shoot_client(
    seed: client.ApiClient,
    *,
    namespace: str,
    kubeconfig_secret: str,
    access_secret: str,
    trace_configs: list[aiohttp.TraceConfig] | None = None,
    token_max_age: float = TOKEN_MAX_AGE_SECONDS,
    identity: str | None = None,
) -> client.ApiClient:
    """A client for the shoot of `namespace` (`identity`: the replica, named in the User-Agent); raises
    ShootAccessUnavailable while the parts are not there yet."""
    endpoint = await read_endpoint(seed, namespace=namespace, kubeconfig_secret=kubeconfig_secret)
    token = await read_token(seed, namespace=namespace, access_secret=access_secret)
    configuration = client.Configuration(host=endpoint.server)
    configuration.ca_cert_data = endpoint.ca_pem
    configuration.api_key = {"BearerToken": token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    read_at = time.monotonic()

    async def refresh(current: client.Configuration) -> None:
        nonlocal read_at
        if time.monotonic() - read_at < token_max_age:
            return
        read_at = time.monotonic()  # also on failure: the old token stays until the next attempt
        # On failure the last token stays in use; a rejected request surfaces as 401 where it is made.
        with contextlib.suppress(ShootAccessUnavailable):
            current.api_key = {"BearerToken": await read_token(seed, namespace=namespace, access_secret=access_secret)}

    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]
    return api_client(configuration, trace_configs=trace_configs, identity=identity, max_idle=SHOOT_IDLE_CONNECTIONS)

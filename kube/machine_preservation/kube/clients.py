"""kubernetes.aio API clients, made in this one place for every component (kubeconfig file, in-cluster service
account, or a Configuration built by the caller, such as a shoot's).

kubernetes.aio opens its aiohttp session with `trust_env=True`, so for every request aiohttp looks up the proxy
variables and reads `~/.netrc`, each in a worker thread: two thread hops per request, and a quarter of the
extension's CPU while it preserved machines (py-spy, 20 shoots). Here the proxy the environment names for the API
server is resolved once, when the client is made, by the same rules (`HTTPS_PROXY`, `NO_PROXY`, ... as Python's
urllib reads them); netrc is not read (client-go does not read it either).
"""

from __future__ import annotations

import os
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ConnectionKey
from kubernetes.aio import client, config
from kubernetes.aio.client import rest

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True)
class Proxy:
    url: str  # without credentials
    headers: dict[str, str]  # Proxy-Authorization, when the variable carries credentials


def environment_proxy(server: str) -> Proxy | None:
    """The proxy the environment names for requests to `server`, if any (None when NO_PROXY exempts its host)."""
    url = urllib.parse.urlsplit(server)
    proxies = urllib.request.getproxies_environment()
    if url.hostname is None or urllib.request.proxy_bypass(url.hostname):
        return None
    named = proxies.get(url.scheme)
    if not named:
        return None
    proxy = urllib.parse.urlsplit(named)
    if proxy.username is None:
        return Proxy(url=named, headers={})
    bare = proxy._replace(netloc=proxy.netloc.rpartition("@")[2]).geturl()
    user, password = urllib.parse.unquote(proxy.username), urllib.parse.unquote(proxy.password or "")
    return Proxy(url=bare, headers={"Proxy-Authorization": aiohttp.encode_basic_auth(user, password)})


def user_agent(identity: str) -> str:
    """The User-Agent naming a replica: the API servers' audit logs then tell which replica sent what."""
    return f"machine-preservation ({identity})"


class _IdleBoundedConnector(aiohttp.TCPConnector):
    """A TCPConnector that keeps at most `max_idle` idle connections per host for reuse: one released beyond them
    is closed at once. A burst (a drain's evictions, up to 10 at once) then leaves a few connections, not all it
    opened for aiohttp's 15 s keep-alive; during it each finished request hands its connection to the next."""

    def __init__(self, *, max_idle: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._max_idle = max_idle

    def _release(self, key: ConnectionKey, protocol: ResponseHandler, *, should_close: bool = False) -> None:
        idle = self._conns.get(key)
        crowded = idle is not None and len(idle) >= self._max_idle
        super()._release(key, protocol, should_close=should_close or crowded)


class _RestClient(rest.RESTClientObject):
    """The library's REST client, its connections bounded by `_IdleBoundedConnector`."""

    def __init__(self, configuration: client.Configuration, *, max_idle: int) -> None:
        super().__init__(configuration)
        self.max_idle = max_idle

    def _create_connector(self) -> aiohttp.TCPConnector:
        return _IdleBoundedConnector(max_idle=self.max_idle, limit=self.maxsize, ssl=self.ssl_context)


def api_client(
    configuration: client.Configuration,
    *,
    trace_configs: list[aiohttp.TraceConfig] | None = None,
    identity: str | None = None,
    max_idle: int | None = None,
) -> client.ApiClient:
    """An ApiClient for the configured server whose requests look up nothing in the environment, naming the replica
    `identity` in its User-Agent; keeping at most `max_idle` idle connections (None: aiohttp's pool)."""
    configuration.client_session_kwargs = {"trust_env": False}
    configuration.trace_configs = trace_configs
    if configuration.proxy is None and (proxy := environment_proxy(configuration.host)) is not None:
        configuration.proxy = proxy.url
        configuration.proxy_headers = proxy.headers or None
    api = client.ApiClient(configuration=configuration)
    if max_idle is not None:
        api.rest_client = _RestClient(configuration, max_idle=max_idle)
    if identity is not None:
        api.user_agent = user_agent(identity)
    return api


async def new_api_client(
    *, kubeconfig: Path | None, trace_configs: list[aiohttp.TraceConfig] | None = None, identity: str | None = None
) -> client.ApiClient:
    """A client from the kubeconfig file; without one, from the in-cluster service account when running in a pod,
    else from the default kubeconfig ($KUBECONFIG, ~/.kube/config), in controller-runtime's order."""
    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig) if kubeconfig is not None else None, client_configuration=configuration
        )
    return api_client(configuration, trace_configs=trace_configs, identity=identity)

"""The plugin's requests to the API server, with the blocking kubernetes client (a command line waits anyway):
the kubeconfig read as kubectl reads it, raw JSON in and out (no models: a Node is shown as served), every
failure raised as its `PluginError`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from machine_preservation.cli.kubectl.outcomes import ExitCode, PluginError, answer_error, cut

# Every request but a watch is answered within this many seconds, or the command fails (a CLI must not hang).
REQUEST_TIMEOUT: Final = 30.0
# Objects per page of a list: a shoot of thousands of nodes is read a page at a time.
PAGE_SIZE: Final = 250
# A watch is renewed after this many seconds (the API server ends it at its own timeout too).
WATCH_SECONDS: Final = 300
_WATCH_LINE_LIMIT: Final = 16 * 1024 * 1024


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    warnings: tuple[str, ...]

    def json(self) -> Any:
        return json.loads(self.body)


def _unreachable(error: Exception) -> PluginError:
    return PluginError(f"the server could not be reached: {cut(str(error), 300)}", ExitCode.ERROR)


def warnings_of(headers: Any) -> tuple[str, ...]:
    """The API server's warnings (`Warning: 299 - "text"`), as kubectl prints them."""
    found = []
    for raw in headers.getlist("Warning") if hasattr(headers, "getlist") else []:
        text = raw.split(" ", 2)[-1] if raw.startswith("299 ") else raw
        found.append(text.strip().removeprefix('"').removesuffix('"'))
    return tuple(found)


def kubectl_context(kubeconfig: str | None, context: str | None) -> str | None:
    """The context kubectl would use: `--context`; else, for several files in $KUBECONFIG, the current context of
    the first that names one (kubectl's rule: the first file to set a key wins; the kubernetes client lets the
    last win)."""
    if context is not None or kubeconfig is not None:
        return context
    for path in os.environ.get("KUBECONFIG", "").split(os.pathsep):
        try:
            document = yaml.safe_load(Path(path).expanduser().read_text()) if path else None
        except (OSError, yaml.YAMLError):
            continue  # kubectl skips a file that is missing too; one that does not parse fails the load below
        current = document.get("current-context") if isinstance(document, dict) else None
        if isinstance(current, str) and current:
            return current
    return None


def kubeconfig_namespace(kubeconfig: str | None, context: str | None) -> str | None:
    """The namespace of the kubeconfig's context (`--context`, else the current one), as kubectl defaults it."""
    context = kubectl_context(kubeconfig, context)
    try:
        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError) as error:
        raise PluginError(f"cannot load the kubeconfig: {error}", ExitCode.ERROR) from error
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    namespace = (chosen or {}).get("context", {}).get("namespace")
    return namespace if isinstance(namespace, str) and namespace else None


class Api:
    """One API server, as the kubeconfig (`--kubeconfig`, else $KUBECONFIG, else ~/.kube/config) and its context
    (`--context`, else the current one) say."""

    def __init__(self, *, kubeconfig: str | None, context: str | None) -> None:
        configuration = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig,
                context=kubectl_context(kubeconfig, context),
                client_configuration=configuration,
                persist_config=False,
            )
        except (ConfigException, OSError) as error:
            raise PluginError(f"cannot load the kubeconfig: {error}", ExitCode.ERROR) from error
        self._client = client.ApiClient(configuration)

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
        timeout: float | None = REQUEST_TIMEOUT,
        stream: bool = False,
    ) -> Any:
        """The raw answer (kubernetes' RESTResponse): its body unread when `stream`, else read."""
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        try:
            _, url, headers, body, _ = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=list(query),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(method, url, header_params=headers, body=body, _request_timeout=timeout)
            if not stream:
                response.read()  # type: ignore[no-untyped-call]
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            raise _unreachable(error) from error
        return response

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
    ) -> Answer:
        response = self.request(method, path, query=query, body=body, content_type=content_type)
        return Answer(status=response.status, body=response.data or b"", warnings=warnings_of(response.headers))

    def get(
        self,
        path: str,
        *,
        resource: str,
        name: str | None = None,
        namespace: str | None = None,
        absent_ok: bool = False,
    ) -> dict[str, Any] | None:
        """The object (or list) at `path`; None when absent and `absent_ok`; else its error."""
        answer = self.call("GET", path)
        if answer.status == 404 and absent_ok:
            return None
        if answer.status != 200:
            raise answer_error(
                answer.status, answer.body, verb="get", resource=resource, name=name, namespace=namespace
            )
        document = answer.json()
        if not isinstance(document, dict):
            raise PluginError(f"get {resource}: the answer is not a JSON object", ExitCode.ERROR)
        return document

    def pages(
        self, path: str, *, resource: str, namespace: str | None = None, verb: str = "list"
    ) -> Iterator[tuple[list[Mapping[str, Any]], str]]:
        """A collection a page at a time, with the list's resourceVersion (to watch from)."""
        token = ""
        while True:
            query = [("limit", str(PAGE_SIZE))] + ([("continue", token)] if token else [])
            answer = self.call("GET", path, query=query)
            if answer.status != 200:
                raise answer_error(answer.status, answer.body, verb=verb, resource=resource, namespace=namespace)
            document = answer.json()
            items = document.get("items") if isinstance(document, dict) else None
            metadata = document.get("metadata") if isinstance(document, dict) else None
            metadata = metadata if isinstance(metadata, dict) else {}
            yield (
                [i for i in items if isinstance(i, dict)] if isinstance(items, list) else [],
                str(metadata.get("resourceVersion") or ""),
            )
            token = str(metadata.get("continue") or "")
            if not token:
                return

    def watch(self, path: str, resource_version: str) -> Iterator[Mapping[str, Any]]:
        """The watch events of the collection from `resource_version`, until the server ends the watch."""
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(WATCH_SECONDS)),
        ]
        response = self.request("GET", path, query=query, timeout=WATCH_SECONDS + 30, stream=True)
        if response.status != 200:
            body = response.read() or b""
            raise answer_error(response.status, body, verb="watch", resource=path.rsplit("/", 1)[-1])
        pending = b""
        try:
            for chunk in response.response.stream(64 * 1024, decode_content=True):
                pending += chunk
                if len(pending) > _WATCH_LINE_LIMIT:
                    raise PluginError("watch: an event larger than 16 MiB", ExitCode.ERROR)
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        if isinstance(event, dict):
                            yield event
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise _unreachable(error) from error
        finally:
            response.response.release_conn()

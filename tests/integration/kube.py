"""Small helpers for the integration tests' calls to the API server (the synchronous kubernetes client)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

# How the API server refuses a request: a webhook's or a policy's denial (400, 403, 422), or a webhook that
# failed with failurePolicy Fail (500).
_REFUSALS = (400, 403, 422, 500)


def denial(action: Callable[[], object]) -> str | None:
    """The API server's message for a refused request, or None if it was allowed."""
    try:
        action()
    except ApiException as error:
        if error.status in _REFUSALS:
            return str(json.loads(error.body)["message"])
        raise
    return None


def status_of(action: Callable[[], object]) -> int:
    """The HTTP status the API server answered `action` with (200 for any success)."""
    try:
        action()
    except ApiException as error:
        return int(error.status)
    return 200


def unused_webhook(name: str) -> dict[str, Any]:
    """A webhook for a configuration that only has to exist: it matches nothing the tests do."""
    return {
        "name": name,
        "clientConfig": {"url": "https://127.0.0.1:9/unused"},
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}],
        "namespaceSelector": {"matchLabels": {"machine-preservation.test/never": "true"}},
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Ignore",
        "timeoutSeconds": 1,
    }

"""Kubernetes Events (core/v1, what `kubectl describe` shows) with aggregation of repeats.

An Event's name is derived from what it says (object, type, reason, message), so a repeat finds the
existing Event (409 on create) and bumps its `count` and `lastTimestamp` at the version it read instead of
adding a new object; this needs no memory in the process and survives restarts. Node events go to the `default`
namespace, as the kubelet's do.

core/v1 rather than events.k8s.io/v1: the aio client serialises `eventTime` (MicroTime) through
`datetime.isoformat()`, which drops the fraction on whole seconds and the apiserver then rejects it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from dataclasses import dataclass

from kubernetes.aio import client

from machine_preservation.core import vocabulary as v
from machine_preservation.core.preservation_record import format_timestamp
from machine_preservation.kube.api_errors import Conflict, call
from machine_preservation.kube.clients import MERGE_PATCH

logger = logging.getLogger(__name__)

NODE_EVENT_NAMESPACE = "default"
# Reads and counts of a repeat before its conflict fails the plan (which records it again when retried).
REPEAT_ATTEMPTS = 5


# The kinds of the control (seed) cluster's namespace Events can be about, with their API versions; else a Node.
_CONTROL_KINDS = {
    "Machine": f"{v.MACHINE_API_GROUP}/{v.MACHINE_API_VERSION}",
    "Extension": "extensions.gardener.cloud/v1alpha1",
}


@dataclass(frozen=True)
class Regarding:
    kind: str  # "Machine" | "Extension" | "Node"
    name: str
    uid: str = ""


@dataclass
class EventRecorder:
    control: client.ApiClient
    target: client.ApiClient
    machine_namespace: str
    instance: str

    async def record(
        self,
        *,
        regarding: Regarding,
        type: str,
        reason: str,
        message: str,
        action: str,
        now: dt.datetime,
        once: bool = False,
        key: str = "",
    ) -> None:
        """Create the Event, or count a repeat of it (`once`: a repeat changes nothing). The Event is named
        after `key` where one is given, else after the message."""
        api_client, namespace, reference = self._where(regarding)
        digest = hashlib.sha256("\0".join((regarding.kind, type, reason, key or message)).encode()).hexdigest()[:16]
        name = f"{regarding.name[:200]}.{digest}"  # object names reach 253 characters, Event names too
        api = client.CoreV1Api(api_client)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            involved_object=reference,
            reason=reason,
            message=message[:1024],
            type=type,
            count=1,
            first_timestamp=now,
            last_timestamp=now,
            source=client.V1EventSource(component=v.EVENT_REPORTING_COMPONENT),
            reporting_component=v.EVENT_REPORTING_COMPONENT,
            reporting_instance=self.instance,
            action=action,
        )
        try:
            await call(api.create_namespaced_event(namespace, body))
            return
        except Conflict:
            pass  # the same Event again: counted below
        if not once:
            await _count_repeat(api, name, namespace, now=now)

    def _where(self, regarding: Regarding) -> tuple[client.ApiClient, str, client.V1ObjectReference]:
        """The cluster and namespace an Event about `regarding` goes to, and its reference to the object."""
        if regarding.kind in _CONTROL_KINDS:
            reference = client.V1ObjectReference(
                api_version=_CONTROL_KINDS[regarding.kind],
                kind=regarding.kind,
                namespace=self.machine_namespace,
                name=regarding.name,
                uid=regarding.uid or None,
            )
            return self.control, self.machine_namespace, reference
        reference = client.V1ObjectReference(
            api_version="v1", kind="Node", name=regarding.name, uid=regarding.uid or None
        )
        return self.target, NODE_EVENT_NAMESPACE, reference


async def _count_repeat(api: client.CoreV1Api, name: str, namespace: str, *, now: dt.datetime) -> None:
    """One more of an Event that exists: its count and last timestamp, at the version read."""
    for attempt in range(1, REPEAT_ATTEMPTS + 1):
        existing = await api.read_namespaced_event(name, namespace)
        # At the version read: two repeats counted at once (a plan's Events are sent together) both count.
        repeat = {
            "metadata": {"resourceVersion": existing.metadata.resource_version},
            "count": (existing.count or 1) + 1,
            "lastTimestamp": format_timestamp(now),
        }
        try:
            await call(api.patch_namespaced_event(name, namespace, repeat, _content_type=MERGE_PATCH))
            return
        except Conflict:
            if attempt == REPEAT_ATTEMPTS:
                raise

"""A gardenlet stand-in for tests and the playground: Gardener's seed CRDs, shoot API servers, and the per-shoot
objects gardenlet puts into a seed for an extension (namespace, `Cluster`, generic token kubeconfig, `Extension`).

gardenlet itself cannot run here (it deploys pods and needs a garden), so this plays its part towards an extension,
with the same object shapes, and judges an `Extension`'s readiness the way gardenlet does (`extension_ready`).

- CRDs: Gardener's own, unchanged, from the Gardener Go module (`mcm.go_module_dir`), at `mcm.GARDENER_VERSION`.
- A shoot's API server: `start_shoot_control_plane` runs one more kube-apiserver on the seed's etcd (its own
  `--etcd-prefix`), accepting the audience `gardener` as a shoot's does, on a loopback address of its own at port
  443, which `kube-apiserver.<namespace>.svc` names (`hosts`); its gardener-resource-manager: `grm`.
- The generic token kubeconfig names what gardenlet v1.150 names with `IstioTLSTermination` on (its default since
  v1.144): the shoot's out-of-cluster address `https://api.<internal domain>`, which nothing here resolves, as
  nothing outside the shoot namespace of a real seed can.
- Builders (`*_manifest`) are pure; the `async` functions write them with a `kubernetes.aio` ApiClient of the seed.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

from machine_preservation.localcluster import hosts
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.crds import install_crd_manifests, single_document
from machine_preservation.localcluster.mcm import GARDENER_MODULE, GARDENER_VERSION, go_module_dir
from machine_preservation.localcluster.toolchain import ToolchainError

EXTENSIONS_GROUP = "extensions.gardener.cloud"
EXTENSIONS_VERSION = "v1alpha1"
RESOURCES_GROUP = "resources.gardener.cloud"
RESOURCES_VERSION = "v1alpha1"
EXTENSION_TYPE = "machine-preservation"
FORCE_DELETION_ANNOTATION = "confirmation.gardener.cloud/force-deletion"
# The seed's internal domain under which gardenlet names each shoot's API server (`api.<shoot>.<project>.<this>`).
INTERNAL_DOMAIN = "internal.local.gardener.cloud"

# Gardener's seed CRDs an extension works with, and the garden's operator `Extension` CRD (to validate example/).
SEED_CRD_PATHS = (
    "example/seed-crds/10-crd-extensions.gardener.cloud_clusters.yaml",
    "example/seed-crds/10-crd-extensions.gardener.cloud_extensions.yaml",
    "example/seed-crds/10-crd-extensions.gardener.cloud_workers.yaml",
    "example/seed-crds/10-crd-resources.gardener.cloud_managedresources.yaml",
)
OPERATOR_EXTENSION_CRD_PATH = "example/operator/10-crd-operator.gardener.cloud_extensions.yaml"

# The annotations gardenlet drives extension objects with.
OPERATION_ANNOTATION = "gardener.cloud/operation"
TIMESTAMP_ANNOTATION = "gardener.cloud/timestamp"
# gardenlet names the shoot namespace's generic token kubeconfig Secret on the Cluster (the name carries a hash of
# the content, so extensions must read it from here; without the annotation the old fixed name applies).
GENERIC_KUBECONFIG_ANNOTATION = "generic-token-kubeconfig.secret.gardener.cloud/name"
GENERIC_KUBECONFIG_BASE_NAME = "generic-token-kubeconfig"
# Where gardenlet's control-plane pods mount the token of their shoot-access Secret; the generic kubeconfig points
# there, so a component combines it with its own token.
GENERIC_KUBECONFIG_TOKEN_FILE = "/var/run/secrets/gardener.cloud/shoot/generic-kubeconfig/token"
SHOOT_AUDIENCE = "gardener"
JSON_PATCH, MERGE_PATCH = "application/json-patch+json", "application/merge-patch+json"


# --- CRDs and API servers --------------------------------------------------------------------------------------


def seed_crd_paths(version: str = GARDENER_VERSION, *, operator: bool = True) -> list[Path]:
    """Gardener's Cluster, Extension, Worker and ManagedResource CRDs (and the operator `Extension` CRD)."""
    module = go_module_dir(GARDENER_MODULE, version)
    paths = [module / path for path in (*SEED_CRD_PATHS, *((OPERATOR_EXTENSION_CRD_PATH,) if operator else ()))]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise ToolchainError(f"{GARDENER_MODULE}@{version} lacks {', '.join(missing)}")
    return paths


def install_seed_crds(kubeconfig: Path, *, operator: bool = True, timeout: float = 60.0) -> None:
    """Install (create or replace) Gardener's seed CRDs and wait until they serve."""
    manifests = [single_document(path) for path in seed_crd_paths(operator=operator)]
    install_crd_manifests(kubeconfig, manifests, timeout=timeout)


def start_shoot_control_plane(
    seed: ControlPlane,
    directory: Path,
    *,
    name: str,
    namespaces: Sequence[str],
    controller_manager: bool = False,
    feature_gates: Mapping[str, bool] | None = None,
    audit_policy: dict[str, object] | None = None,
    timeout: float = 120.0,
) -> ControlPlane:
    """A shoot's kube-apiserver: its own CA, on a loopback address of its own at port 443, stored in the seed's etcd
    under `/shoots/<name>`, accepting tokens for the audience `gardener` (gardener-resource-manager requests those).
    `kube-apiserver.<namespace>.svc` of each of `namespaces` names it (in its certificate and, from now on, in the
    private hosts file: `hosts.make_private` first). Without kube-controller-manager by default (no namespace
    deletion or garbage collection in the shoot); with `audit_policy`, an audit log (`ControlPlane.audit_log`);
    `stop()` ends it."""
    services = [hosts.api_server_service(namespace) for namespace in namespaces]
    shoot = ControlPlane(
        address=hosts.free_loopback_address(),
        apiserver_port=hosts.SHOOT_API_SERVER_PORT,
        dns_names=tuple(services),
        directory=directory,
        bin_dir=seed.bin_dir,
        attached=seed.attached,
        etcd_servers=seed.etcd_url,
        etcd_prefix=f"/shoots/{name}",
        extra_api_audiences=(SHOOT_AUDIENCE,),
        controller_manager=controller_manager,
        feature_gates=dict(feature_gates or {}),
        audit_policy=audit_policy,
    )
    shoot.start(timeout=timeout)
    for service in services:
        hosts.set_host(service, shoot.address)
    return shoot


def out_of_cluster_api_server(namespace: str) -> str:
    """The address gardenlet writes into the generic token kubeconfig with `IstioTLSTermination`:
    `https://api.<internal domain>`, the internal domain `<shoot>.<project>.<seed's internal domain>`."""
    _, project, shoot = namespace.split("--", 2)
    return f"https://api.{shoot}.{project}.{INTERNAL_DOMAIN}"


# --- object builders (pure) --------------------------------------------------------------------------------------


def shoot_namespace_name(project: str, shoot: str) -> str:
    return f"shoot--{project}--{shoot}"


def shoot_namespace_manifest(namespace: str, *, extension_types: Sequence[str] = (EXTENSION_TYPE,)) -> dict[str, Any]:
    """The shoot namespace as gardenlet labels it: role shoot, and one label per enabled extension type."""
    labels = {"gardener.cloud/role": "shoot"}
    labels.update({f"extensions.gardener.cloud/{kind}": "true" for kind in extension_types})
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}}


def worker(
    name: str,
    *,
    minimum: int = 1,
    maximum: int = 3,
    machine_type: str = "fake-small",
    auto_preserve_failed_machine_max: int | None = None,
    machine_preserve_timeout: str | None = None,
) -> dict[str, Any]:
    """One `spec.provider.workers[]` entry of a Shoot; the preservation fields are the Shoot API's (Gardener ≥
    v1.147, `machineControllerManager`), left out when not given."""
    entry: dict[str, Any] = {
        "name": name,
        "minimum": minimum,
        "maximum": maximum,
        "machine": {"type": machine_type, "image": {"name": "fake", "version": "1.0.0"}},
    }
    mcm: dict[str, Any] = {}
    if auto_preserve_failed_machine_max is not None:
        mcm["autoPreserveFailedMachineMax"] = auto_preserve_failed_machine_max
    if machine_preserve_timeout is not None:
        mcm["machinePreserveTimeout"] = machine_preserve_timeout
    if mcm:
        entry["machineControllerManager"] = mcm
    return entry


def shoot_manifest(
    namespace: str,
    *,
    workers: Sequence[Mapping[str, Any]] = (),
    hibernated: bool = False,
    extensions: Sequence[Mapping[str, Any]] = ({"type": EXTENSION_TYPE},),
    last_operation_type: str = "Reconcile",
    last_operation_state: str = "Succeeded",
    deletion_timestamp: str | None = None,
    generation: int = 1,
    seed_name: str = "local",
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Shoot as gardenlet copies it into `Cluster.spec.shoot` (core.gardener.cloud/v1beta1)."""
    _, project, name = namespace.split("--", 2)
    metadata: dict[str, Any] = {"name": name, "namespace": f"garden-{project}", "generation": generation}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if deletion_timestamp is not None:
        metadata["deletionTimestamp"] = deletion_timestamp
    return {
        "apiVersion": "core.gardener.cloud/v1beta1",
        "kind": "Shoot",
        "metadata": metadata,
        "spec": {
            "provider": {"type": "local", "workers": [dict(w) for w in workers]},
            "hibernation": {"enabled": hibernated},
            "extensions": [dict(e) for e in extensions],
            "kubernetes": {"version": "1.36.0"},
            "region": "local",
            "seedName": seed_name,
        },
        "status": {
            "technicalID": namespace,
            "seedName": seed_name,
            "observedGeneration": generation,
            "lastOperation": {
                "type": last_operation_type,
                "state": last_operation_state,
                "progress": 100 if last_operation_state == "Succeeded" else 50,
                "description": f"{last_operation_type} {last_operation_state}",
                "lastUpdateTime": _rfc3339(dt.datetime.now(dt.UTC)),
            },
        },
    }


def cluster_manifest(
    namespace: str,
    *,
    shoot: Mapping[str, Any],
    seed: Mapping[str, Any] | None = None,
    cloud_profile: Mapping[str, Any] | None = None,
    generic_kubeconfig_secret: str | None = None,
) -> dict[str, Any]:
    """The cluster-scoped `Cluster` named after the shoot namespace, with the Shoot, Seed and CloudProfile."""
    metadata: dict[str, Any] = {"name": namespace}
    if generic_kubeconfig_secret is not None:
        metadata["annotations"] = {GENERIC_KUBECONFIG_ANNOTATION: generic_kubeconfig_secret}
    return {
        "apiVersion": f"{EXTENSIONS_GROUP}/{EXTENSIONS_VERSION}",
        "kind": "Cluster",
        "metadata": metadata,
        "spec": {
            "shoot": dict(shoot),
            "seed": dict(seed) if seed is not None else _seed(),
            "cloudProfile": dict(cloud_profile) if cloud_profile is not None else _cloud_profile(),
        },
    }


def generic_token_kubeconfig_secret(namespace: str, *, server: str, ca_pem: bytes) -> dict[str, Any]:
    """The Secret gardenlet keeps in every shoot namespace: a kubeconfig (key `kubeconfig`) with the shoot API
    server, its CA and a token *file* (no credentials; each component mounts its own shoot-access token there),
    context named after the namespace; immutable, named `generic-token-kubeconfig-<hash>`. The server is
    `https://kube-apiserver` (the Service in the shoot namespace) without Istio TLS termination, else the
    out-of-cluster address (`out_of_cluster_api_server`)."""
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": namespace,
        "clusters": [
            {
                "name": namespace,
                "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()},
            }
        ],
        "users": [{"name": namespace, "user": {"tokenFile": GENERIC_KUBECONFIG_TOKEN_FILE}}],
        "contexts": [{"name": namespace, "context": {"cluster": namespace, "user": namespace}}],
        "preferences": {},
    }
    content = yaml.safe_dump(kubeconfig, sort_keys=True)
    digest = hashlib.sha256(content.encode()).hexdigest()[:8]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "metadata": {
            "name": f"{GENERIC_KUBECONFIG_BASE_NAME}-{digest}",
            "namespace": namespace,
            "labels": {
                "name": GENERIC_KUBECONFIG_BASE_NAME,
                "managed-by": "secrets-manager",
                "manager-identity": "gardenlet",
            },
        },
        "data": {"kubeconfig": base64.b64encode(content.encode()).decode()},
    }


def extension_manifest(
    namespace: str,
    *,
    extension_type: str = EXTENSION_TYPE,
    provider_config: Mapping[str, Any] | None = None,
    operation: str | None = "reconcile",
    timestamp: dt.datetime | None = None,
) -> dict[str, Any]:
    """The `Extension` gardenlet creates in the shoot namespace (name = type), with the operation annotation and
    the timestamp it later compares the last operation against."""
    annotations = {TIMESTAMP_ANNOTATION: _rfc3339_nano(timestamp or dt.datetime.now(dt.UTC))}
    if operation is not None:
        annotations[OPERATION_ANNOTATION] = operation
    spec: dict[str, Any] = {"type": extension_type}
    if provider_config is not None:
        spec["providerConfig"] = dict(provider_config)
    return {
        "apiVersion": f"{EXTENSIONS_GROUP}/{EXTENSIONS_VERSION}",
        "kind": "Extension",
        "metadata": {"name": extension_type, "namespace": namespace, "annotations": annotations},
        "spec": spec,
    }


def extension_ready(extension: Mapping[str, Any]) -> str | None:
    """None when gardenlet would consider the extension object ready, else why not — in gardenlet's order (its
    CheckExtensionObject): a `lastError`; `observedGeneration` behind `generation`; an operation annotation still
    present; no `lastOperation`; `lastOperation.state` not Succeeded; `lastOperation.lastUpdateTime` before the
    `gardener.cloud/timestamp` annotation (cut to whole seconds)."""
    metadata = extension.get("metadata") or {}
    status = extension.get("status") or {}
    annotations = metadata.get("annotations") or {}
    last_error = status.get("lastError")
    if last_error is not None:
        return f"error during reconciliation: {last_error.get('description', '')}"
    generation, observed = metadata.get("generation", 0), status.get("observedGeneration", 0)
    if observed != generation:
        return f"observed generation outdated ({observed}/{generation})"
    if OPERATION_ANNOTATION in annotations:
        return f"gardener operation {annotations[OPERATION_ANNOTATION]!r} is not yet picked up by controller"
    last_operation = status.get("lastOperation")
    if last_operation is None:
        return "extension did not record a last operation yet"
    if last_operation.get("state") != "Succeeded":
        return f"extension state is not succeeded but {last_operation.get('state')}"
    if TIMESTAMP_ANNOTATION in annotations:
        try:
            requested = _parse_time(annotations[TIMESTAMP_ANNOTATION]).replace(microsecond=0)
        except ValueError as error:
            return f"cannot parse {TIMESTAMP_ANNOTATION} annotation: {error}"
        updated_text = last_operation.get("lastUpdateTime")
        updated = _parse_time(updated_text) if updated_text else dt.datetime.min.replace(tzinfo=dt.UTC)
        if requested > updated:
            return (
                f"extension is not reconciled yet - reconciliation requested at {_rfc3339(requested)}, "
                f"last update time is: {_rfc3339(updated)}"
            )
    return None


# --- writing them (the seed's kubernetes.aio ApiClient) -------------------------------------------------------------


async def create_shoot_namespace(
    api: client.ApiClient, namespace: str, *, extension_types: Sequence[str] = (EXTENSION_TYPE,)
) -> None:
    """Create the shoot namespace, or set its labels if it exists (disabling = `extension_types=()`; labels of
    extension types no longer enabled are removed)."""
    core = client.CoreV1Api(api)
    body = shoot_namespace_manifest(namespace, extension_types=extension_types)
    try:
        await core.create_namespace(client.V1Namespace.model_validate(body))
    except ApiException as error:
        if error.status != 409:
            raise
        current = await core.read_namespace(namespace)
        labels = {
            k: v
            for k, v in (current.metadata.labels or {}).items()  # type: ignore[union-attr]
            if not k.startswith("extensions.gardener.cloud/")
        }
        labels.update(body["metadata"]["labels"])
        await core.patch_namespace(
            namespace, [{"op": "replace", "path": "/metadata/labels", "value": labels}], _content_type=JSON_PATCH
        )


async def apply_cluster(api: client.ApiClient, cluster: Mapping[str, Any]) -> dict[str, Any]:
    """Create the `Cluster`, or replace its spec (and merge its annotations) if it exists."""
    objects = client.CustomObjectsApi(api)
    name = cluster["metadata"]["name"]
    try:
        return _as_dict(
            await objects.create_cluster_custom_object(EXTENSIONS_GROUP, EXTENSIONS_VERSION, "clusters", dict(cluster))
        )
    except ApiException as error:
        if error.status != 409:
            raise
    patch = {"metadata": {"annotations": cluster["metadata"].get("annotations") or {}}, "spec": cluster["spec"]}
    return _as_dict(
        await objects.patch_cluster_custom_object(
            EXTENSIONS_GROUP, EXTENSIONS_VERSION, "clusters", name, patch, _content_type=MERGE_PATCH
        )
    )


async def update_cluster_shoot(api: client.ApiClient, namespace: str, shoot: Mapping[str, Any]) -> dict[str, Any]:
    """Replace `Cluster.spec.shoot` (gardenlet does this on every Shoot change: hibernation, workers, failure)."""
    return _as_dict(
        await client.CustomObjectsApi(api).patch_cluster_custom_object(
            EXTENSIONS_GROUP,
            EXTENSIONS_VERSION,
            "clusters",
            namespace,
            [{"op": "replace", "path": "/spec/shoot", "value": dict(shoot)}],
            _content_type=JSON_PATCH,
        )
    )


async def publish_generic_token_kubeconfig(api: client.ApiClient, namespace: str, shoot: ControlPlane) -> str:
    """Create the generic token kubeconfig Secret for `shoot` in its namespace, as gardenlet v1.150 writes it with
    `IstioTLSTermination` on, and name it on the `Cluster` (which must exist); returns the Secret's name."""
    server = out_of_cluster_api_server(namespace)
    secret = generic_token_kubeconfig_secret(namespace, server=server, ca_pem=shoot.ca.cert_pem)
    try:
        await client.CoreV1Api(api).create_namespaced_secret(namespace, client.V1Secret.model_validate(secret))
    except ApiException as error:
        if error.status != 409:  # same content, same name
            raise
    name: str = secret["metadata"]["name"]
    await client.CustomObjectsApi(api).patch_cluster_custom_object(
        EXTENSIONS_GROUP,
        EXTENSIONS_VERSION,
        "clusters",
        namespace,
        {"metadata": {"annotations": {GENERIC_KUBECONFIG_ANNOTATION: name}}},
        _content_type=MERGE_PATCH,
    )
    return name


async def apply_extension(
    api: client.ApiClient,
    namespace: str,
    *,
    extension_type: str = EXTENSION_TYPE,
    provider_config: Mapping[str, Any] | None = None,
    operation: str | None = "reconcile",
) -> dict[str, Any]:
    """Create the `Extension`, or (if it exists) set its `providerConfig` and request `operation` with a fresh
    timestamp, as gardenlet does on each shoot reconcile."""
    objects = client.CustomObjectsApi(api)
    body = extension_manifest(
        namespace, extension_type=extension_type, provider_config=provider_config, operation=operation
    )
    try:
        return _as_dict(
            await objects.create_namespaced_custom_object(
                EXTENSIONS_GROUP, EXTENSIONS_VERSION, namespace, "extensions", body
            )
        )
    except ApiException as error:
        if error.status != 409:
            raise
    patch = {
        "metadata": {"annotations": body["metadata"]["annotations"]},
        "spec": {"type": extension_type, "providerConfig": body["spec"].get("providerConfig")},
    }
    return _as_dict(
        await objects.patch_namespaced_custom_object(
            EXTENSIONS_GROUP,
            EXTENSIONS_VERSION,
            namespace,
            "extensions",
            extension_type,
            patch,
            _content_type=MERGE_PATCH,
        )
    )


async def request_operation(
    api: client.ApiClient, namespace: str, operation: str, *, extension_type: str = EXTENSION_TYPE
) -> dict[str, Any]:
    """Set `gardener.cloud/operation` (reconcile, migrate, restore, wait-for-state) and a fresh timestamp."""
    annotations = {OPERATION_ANNOTATION: operation, TIMESTAMP_ANNOTATION: _rfc3339_nano(dt.datetime.now(dt.UTC))}
    return _as_dict(
        await client.CustomObjectsApi(api).patch_namespaced_custom_object(
            EXTENSIONS_GROUP,
            EXTENSIONS_VERSION,
            namespace,
            "extensions",
            extension_type,
            {"metadata": {"annotations": annotations}},
            _content_type=MERGE_PATCH,
        )
    )


async def delete_extension(api: client.ApiClient, namespace: str, *, extension_type: str = EXTENSION_TYPE) -> None:
    """Delete the `Extension` as gardenlet does: confirm the deletion by annotation first, then delete."""
    objects = client.CustomObjectsApi(api)
    await objects.patch_namespaced_custom_object(
        EXTENSIONS_GROUP,
        EXTENSIONS_VERSION,
        namespace,
        "extensions",
        extension_type,
        {"metadata": {"annotations": {"confirmation.gardener.cloud/deletion": "true"}}},
        _content_type=MERGE_PATCH,
    )
    await objects.delete_namespaced_custom_object(
        EXTENSIONS_GROUP, EXTENSIONS_VERSION, namespace, "extensions", extension_type
    )


async def force_delete_shoot(
    api: client.ApiClient, namespace: str, *, workers: Sequence[Mapping[str, Any]] = ()
) -> None:
    """What gardenlet does when a Shoot's owner confirms its force deletion (Gardener ≥ v1.81) after its deletion
    failed: the Shoot in the `Cluster` is being deleted, annotated `confirmation.gardener.cloud/force-deletion`,
    its last operation a failed Delete; then the extension objects are deleted."""
    shoot = shoot_manifest(
        namespace,
        workers=workers,
        deletion_timestamp=_rfc3339(dt.datetime.now(dt.UTC)),
        last_operation_type="Delete",
        last_operation_state="Error",
        annotations={FORCE_DELETION_ANNOTATION: "true"},
    )
    await update_cluster_shoot(api, namespace, shoot)
    await delete_extension(api, namespace)


async def read_extension(
    api: client.ApiClient, namespace: str, *, extension_type: str = EXTENSION_TYPE
) -> dict[str, Any]:
    return _as_dict(
        await client.CustomObjectsApi(api).get_namespaced_custom_object(
            EXTENSIONS_GROUP, EXTENSIONS_VERSION, namespace, "extensions", extension_type
        )
    )


# --- internals -------------------------------------------------------------------------------------------------


def _seed() -> dict[str, Any]:
    return {
        "apiVersion": "core.gardener.cloud/v1beta1",
        "kind": "Seed",
        "metadata": {"name": "local"},
        "spec": {"provider": {"type": "local", "region": "local"}, "ingress": {"domain": "ingress.local"}},
    }


def _cloud_profile() -> dict[str, Any]:
    return {
        "apiVersion": "core.gardener.cloud/v1beta1",
        "kind": "CloudProfile",
        "metadata": {"name": "local"},
        "spec": {
            "type": "local",
            "kubernetes": {"versions": [{"version": "1.36.0"}]},
            "machineTypes": [{"name": "fake-small", "cpu": "2", "memory": "4Gi", "usable": True}],
            "machineImages": [{"name": "fake", "versions": [{"version": "1.0.0"}]}],
            "regions": [{"name": "local"}],
        },
    }


def _as_dict(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _rfc3339(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rfc3339_nano(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _parse_time(text: str) -> dt.datetime:
    # RFC 3339 with up to nanoseconds (Go's RFC3339Nano); Python keeps microseconds.
    match = re.fullmatch(r"([^.]+)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not an RFC 3339 time")
    whole, fraction, zone = match.groups()
    fraction = f".{fraction[:6]}" if fraction else ""
    parsed = dt.datetime.fromisoformat(whole + fraction + ("+00:00" if zone == "Z" else zone))
    if parsed.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return parsed.astimezone(dt.UTC)


# --- control-plane migration: the Worker's machine state, as Gardener keeps and restores it ----------------------

MACHINE_GROUP, MACHINE_VERSION = "machine.sapcloud.io", "v1alpha1"
# The provider extension's identity in a seed: a ServiceAccount in the `extension-<installation>` namespace gardenlet
# deploys it to. It re-creates the Machines on a Worker restore.
PROVIDER_EXTENSION_USER = "system:serviceaccount:extension-provider-local:provider"  # a certificate CN: ≤ 64
MCM_FINALIZER = "machine.sapcloud.io/machine-controller-manager"


def restorable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object of the Worker's state as Gardener keeps it through a migration (pkg/utils/gardener/shootstate/
    machines.go): name, namespace, annotations and labels, its spec; no status, no owner references, no uid."""
    metadata = obj.get("metadata") or {}
    kept = {key: metadata[key] for key in ("name", "namespace", "annotations", "labels") if metadata.get(key)}
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": kept, "spec": obj.get("spec") or {}}


async def worker_state(api: client.ApiClient, namespace: str) -> dict[str, list[dict[str, Any]]]:
    """The namespace's MachineDeployments, MachineSets and Machines as the shoot state keeps them."""
    objects = client.CustomObjectsApi(api)
    state: dict[str, list[dict[str, Any]]] = {}
    for plural in ("machinedeployments", "machinesets", "machines"):
        listed = await objects.list_namespaced_custom_object(MACHINE_GROUP, MACHINE_VERSION, namespace, plural)
        state[plural] = [restorable(item) for item in _as_dict(listed)["items"]]
    return state


async def remove_worker_objects(api: client.ApiClient, namespace: str) -> None:
    """What the source seed loses once the shoot has moved: the Worker's objects go (their finalizers taken off,
    MCM being gone there), without touching the VMs."""
    objects = client.CustomObjectsApi(api)
    for plural in ("machines", "machinesets", "machinedeployments"):
        listed = await objects.list_namespaced_custom_object(MACHINE_GROUP, MACHINE_VERSION, namespace, plural)
        for item in _as_dict(listed)["items"]:
            name = item["metadata"]["name"]
            await objects.patch_namespaced_custom_object(
                MACHINE_GROUP,
                MACHINE_VERSION,
                namespace,
                plural,
                name,
                {"metadata": {"finalizers": None}},
                _content_type=MERGE_PATCH,
            )
            with contextlib.suppress(ApiException):
                await objects.delete_namespaced_custom_object(MACHINE_GROUP, MACHINE_VERSION, namespace, plural, name)


async def restore_worker_state(provider: client.ApiClient, state: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    """What the provider extension's Worker actuator does on Restore (extensions/pkg/controller/worker/
    genericactuator/actuator_restore.go): create the MachineSets and Machines from the state, then the
    MachineDeployments (its reconcile), each as the provider extension (`provider`'s identity)."""
    objects = client.CustomObjectsApi(provider)
    for plural in ("machinesets", "machines", "machinedeployments"):
        for item in state.get(plural, ()):
            namespace = item["metadata"]["namespace"]
            await objects.create_namespaced_custom_object(MACHINE_GROUP, MACHINE_VERSION, namespace, plural, dict(item))

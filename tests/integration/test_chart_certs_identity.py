"""Least privilege of the certificate management, decided by the real API server's authorizer on the chart's
own RBAC (`helm install`): the ServiceAccount serving admission requests can neither read the Secret holding
the CA key nor change webhook configurations; the certs manager's ServiceAccount can do exactly its work."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.toolchain import Toolchain
from tests.integration import kube
from tests.integration.chart import CHART, helm, set_args


@dataclass(frozen=True)
class Install:
    namespace: str
    fullname: str

    @property
    def webhook_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}-webhook"

    @property
    def certs_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.fullname}-certs"

    @property
    def ca_secret(self) -> str:
        return f"{self.fullname}-webhook-certs"

    @property
    def serving_secret(self) -> str:
        return f"{self.fullname}-webhook-tls"

    @property
    def configuration(self) -> str:
        return f"{self.fullname}.{self.namespace}"


@pytest.fixture
def install(toolchain: Toolchain, control_plane: ControlPlane, namespace: str) -> Iterator[Install]:
    # Short names: the client certificates below carry the ServiceAccount user name as their CN (<= 64).
    fullname = f"mp{namespace[-6:]}"
    values = {"fullnameOverride": json.dumps(fullname), "webhooks.shoots.register": "true"}
    where = ["--namespace", namespace, "--kubeconfig", str(control_plane.kubeconfig)]
    helm(toolchain.helm, "install", namespace, str(CHART), *where, *set_args(values))
    try:
        yield Install(namespace=namespace, fullname=fullname)
    finally:
        helm(toolchain.helm, "uninstall", namespace, *where, check=False)


def allowed(
    kube_client: client.ApiClient,
    user: str,
    *,
    verb: str,
    resource: str,
    group: str = "",
    namespace: str = "",
    name: str = "",
) -> bool:
    """The authorizer's decision for a ServiceAccount (with the groups every ServiceAccount has)."""
    service_account_namespace = user.split(":")[2]
    review = client.AuthorizationV1Api(kube_client).create_subject_access_review(
        {
            "spec": {
                "user": user,
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{service_account_namespace}",
                    "system:authenticated",
                ],
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "namespace": namespace,
                    "name": name,
                },
            }
        }
    )
    return bool(review.status.allowed)


REGISTRATION = "admissionregistration.k8s.io"
CONFIGURATIONS = ("validatingwebhookconfigurations", "mutatingwebhookconfigurations")


def test_the_webhook_identity_holds_no_key_material_and_cannot_change_webhook_configurations(
    kube_client: client.ApiClient, install: Install
) -> None:
    user, namespace = install.webhook_user, install.namespace
    for secret in (install.ca_secret, install.serving_secret, ""):
        for verb in ("get", "list", "watch", "patch", "update", "delete"):
            if verb in ("list", "watch") and secret:
                continue
            assert not allowed(kube_client, user, verb=verb, resource="secrets", namespace=namespace, name=secret), (
                f"webhook may {verb} secret {secret or '*'}"
            )
    assert not allowed(kube_client, user, verb="create", resource="secrets", namespace=namespace)
    for resource in CONFIGURATIONS:
        for verb in ("get", "patch", "update", "delete"):
            assert not allowed(
                kube_client, user, verb=verb, resource=resource, group=REGISTRATION, name=install.configuration
            ), f"webhook may {verb} {resource}"
        assert not allowed(kube_client, user, verb="create", resource=resource, group=REGISTRATION)


def test_the_certs_identity_may_do_exactly_its_work(kube_client: client.ApiClient, install: Install) -> None:
    user, namespace = install.certs_user, install.namespace
    for secret in (install.ca_secret, install.serving_secret):
        for verb in ("get", "patch"):
            assert allowed(kube_client, user, verb=verb, resource="secrets", namespace=namespace, name=secret)
        assert not allowed(kube_client, user, verb="delete", resource="secrets", namespace=namespace, name=secret)
    for verb in ("list", "watch", "create"):
        assert not allowed(kube_client, user, verb=verb, resource="secrets", namespace=namespace)
    assert not allowed(kube_client, user, verb="get", resource="secrets", namespace=namespace, name="other")
    assert not allowed(kube_client, user, verb="get", resource="secrets", namespace="default", name=install.ca_secret)
    for resource in CONFIGURATIONS:
        for verb in ("get", "patch"):
            assert allowed(
                kube_client, user, verb=verb, resource=resource, group=REGISTRATION, name=install.configuration
            ), f"certs may not {verb} {resource}"
        assert not allowed(kube_client, user, verb="patch", resource=resource, group=REGISTRATION, name="other")
        assert not allowed(kube_client, user, verb="list", resource=resource, group=REGISTRATION)
    # Nothing of the webhook's or the controller's work.
    assert not allowed(
        kube_client, user, verb="list", resource="machines", group="machine.sapcloud.io", namespace=namespace
    )
    assert not allowed(kube_client, user, verb="patch", resource="nodes")


def test_requests_as_each_identity_get_what_the_authorizer_decided(
    kube_client: client.ApiClient, install: Install, kubeconfig_for: Callable[..., Path]
) -> None:
    """The same, by doing it: real requests authenticated as each ServiceAccount's user name."""
    patch = [{"op": "test", "path": "/metadata/name", "value": install.configuration}]

    def identity(user: str) -> client.ApiClient:
        api_client: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig_for(user)))
        return api_client

    with identity(install.webhook_user) as webhook, identity(install.certs_user) as certs:
        for api_client, expected in ((webhook, 403), (certs, 200)):
            core = client.CoreV1Api(api_client)
            registration = client.AdmissionregistrationV1Api(api_client)
            assert (
                kube.status_of(lambda c=core: c.read_namespaced_secret(install.ca_secret, install.namespace))
                == expected
            )
            assert (
                kube.status_of(
                    lambda r=registration: r.patch_validating_webhook_configuration(
                        install.configuration, patch, dry_run="All"
                    )
                )
                == expected
            )

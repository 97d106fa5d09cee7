"""A seed chart component's identity for tests that run the product's code against a real API server: the chart
rendered with gardenlet's values for an extension namespace of its own, its ServiceAccounts, RBAC and admission
policy created as rendered, and a kubeconfig with a token of the component's ServiceAccount. The code under test
gets exactly what an installation grants it, never an administrator's rights."""

from __future__ import annotations

import uuid
from pathlib import Path

from kubernetes.aio import client

from machine_preservation.kube.clients import new_api_client
from machine_preservation.localcluster import product as processes
from machine_preservation.localcluster import seed_install
from machine_preservation.localcluster.controlplane import ControlPlane
from machine_preservation.localcluster.toolchain import ensure_toolchain


async def seed_chart_identity(control_plane: ControlPlane, directory: Path, *, deployment: str) -> Path:
    """A kubeconfig of the ServiceAccount the seed chart's `deployment` (seed_install.WEBHOOK_DEPLOYMENT, …) runs
    as, in a new installation; the cluster-wide objects stay (named after the installation's release)."""
    tag = uuid.uuid4().hex[:6]
    namespace = f"extension-mp-{tag}"
    documents = seed_install.render(
        ensure_toolchain().helm,
        namespace=namespace,
        values=seed_install.gardenlet_values(),
        directory=directory / "chart",
        release=f"mp-{tag}",
    )
    async with await new_api_client(kubeconfig=control_plane.kubeconfig) as admin:
        await client.CoreV1Api(admin).create_namespace({"metadata": {"name": namespace}})  # type: ignore[arg-type]
        await processes.apply_manifests(admin, seed_install.identities(documents))
        return await seed_install.service_account_kubeconfig(
            admin,
            control_plane,
            namespace=namespace,
            name=seed_install.service_account_of(documents, deployment),
            path=directory / f"{deployment}.kubeconfig",
        )

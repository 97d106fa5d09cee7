"""`machine-preservation certs run`: the self-managed certificate loop. The chart runs it as a Deployment of its
own, under its own ServiceAccount, publishing the serving pair to a Secret the webhook pods mount
(`--serving-secret`); `--cert-dir` serves a webhook that shares a directory with it instead."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kubernetes.aio import client

from machine_preservation.certs.authority import service_dns_names
from machine_preservation.certs.manager import CertificateManager, ManagerSettings, WebhookConfigurationRef
from machine_preservation.certs.rotation import RotationPolicy, split_names
from machine_preservation.core.duration_arguments import go_duration_argument
from machine_preservation.kube.clients import new_api_client

DEFAULTS = RotationPolicy()


def _secret(text: str) -> tuple[str, str]:
    namespace, _, name = text.partition("/")
    if not namespace or not name:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/NAME, got {text!r}")
    return namespace, name


def _configuration(text: str) -> WebhookConfigurationRef:
    try:
        return WebhookConfigurationRef.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def _owned_configuration(text: str) -> WebhookConfigurationRef:
    try:
        return WebhookConfigurationRef.parse_managed(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


@contextlib.asynccontextmanager
async def _clients(
    kubeconfig: Path | None, refs: tuple[WebhookConfigurationRef, ...]
) -> AsyncIterator[tuple[client.ApiClient, dict[Path, client.ApiClient]]]:
    async with contextlib.AsyncExitStack() as stack:
        local = await stack.enter_async_context(await new_api_client(kubeconfig=kubeconfig))
        remote = {}
        for path in sorted({ref.kubeconfig for ref in refs if ref.kubeconfig is not None}):
            remote[path] = await stack.enter_async_context(await new_api_client(kubeconfig=path))
        yield local, remote


def settings_from(args: argparse.Namespace) -> ManagerSettings:
    service_names = service_dns_names(
        service=args.service, namespace=args.namespace, cluster_domain=args.cluster_domain
    )
    names = tuple(dict.fromkeys((*service_names, *args.extra_name)))
    policy = RotationPolicy(
        ca_validity=args.ca_validity,
        ca_rotate_before=args.ca_rotate_before,
        ca_overlap=args.ca_overlap,
        propagation_delay=args.propagation_delay,
        serving_validity=args.serving_validity,
        serving_renew_fraction=args.serving_renew_fraction,
        shoot_wait_limit=args.shoot_wait_limit,
    )
    namespace, name = args.secret
    return ManagerSettings(
        secret_namespace=namespace,
        secret_name=name,
        cert_dir=args.cert_dir,
        identity=split_names(names),
        policy=policy,
        configurations=(*args.webhook_configuration, *args.own_webhook_configuration),
        ca_common_name=args.ca_common_name or f"{args.service}.{args.namespace}-ca",
        resync=dt.timedelta(seconds=args.resync),
        serving_secret=args.serving_secret,
        shoot_resource=args.shoot_managed_resource,
    )


async def _run(args: argparse.Namespace, settings: ManagerSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with _clients(args.kubeconfig, settings.configurations) as (local, remote):
        manager = CertificateManager(settings=settings, api_client=local, remote_clients=remote)
        await manager.run(stop=stop, once=args.once)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    asyncio.run(_run(args, settings))
    return 0


def register(subcommands: argparse._SubParsersAction[Any]) -> None:
    certs = subcommands.add_parser("certs", help="self-managed webhook certificates (CA, serving cert, caBundle)")
    actions = certs.add_subparsers(dest="action", required=True, metavar="ACTION")
    loop = actions.add_parser(
        "run",
        help="keep the CA and serving certificate in a Secret, the cert dir current and the caBundle injected",
    )
    _add_state_arguments(loop)
    _add_injection_arguments(loop)
    _add_policy_arguments(loop)
    loop.set_defaults(handler=run)


def _add_state_arguments(loop: argparse.ArgumentParser) -> None:
    """Where the certificates are kept and served from, and the names the serving certificate carries."""
    loop.add_argument("--kubeconfig", type=Path, help="cluster holding the Secret (default: in-cluster)")
    loop.add_argument(
        "--secret", type=_secret, required=True, metavar="NAMESPACE/NAME", help="the state: CA (with its key) and more"
    )
    loop.add_argument(
        "--serving-secret",
        type=_secret,
        metavar="NAMESPACE/NAME",
        help="a Secret kept holding only the serving tls.crt and tls.key, for the webhook pods to mount",
    )
    loop.add_argument("--cert-dir", type=Path, help="a directory kept holding tls.crt, tls.key, ca.crt")
    loop.add_argument("--service", required=True, help="the webhook Service's name (for the certificate's names)")
    loop.add_argument("--namespace", required=True, help="the webhook Service's namespace")
    loop.add_argument("--cluster-domain", default="cluster.local")
    loop.add_argument(
        "--extra-name",
        action="append",
        default=["127.0.0.1"],
        help="another DNS name or IP address for the certificate (repeatable; 127.0.0.1 is always included)",
    )


def _add_injection_arguments(loop: argparse.ArgumentParser) -> None:
    """Where the trust bundle goes: the webhook configurations, and the shoots in a Gardener seed."""
    loop.add_argument(
        "--webhook-configuration",
        type=_configuration,
        action="append",
        default=[],
        metavar="KIND/NAME[@KUBECONFIG]",
        help="inject the caBundle into this validating/NAME or mutating/NAME (repeatable); "
        "@KUBECONFIG for a configuration in another cluster",
    )
    loop.add_argument(
        "--own-webhook-configuration",
        type=_owned_configuration,
        action="append",
        default=[],
        metavar="KIND/NAME[@KUBECONFIG]=FILE",
        help="keep validating/NAME or mutating/NAME (created by the chart) exactly as the manifest FILE describes it "
        "(without caBundle; re-read every pass), with the caBundle (repeatable); @KUBECONFIG for a configuration "
        "in another cluster",
    )
    loop.add_argument(
        "--shoot-managed-resource",
        metavar="NAME",
        help="in a Gardener seed: the ManagedResource (in every shoot namespace) that carries the CA to the "
        "shoot; a new CA signs the serving certificate only once each shoot has applied it",
    )


def _add_policy_arguments(loop: argparse.ArgumentParser) -> None:
    """The CA's name, the rotation's timing, and how often a pass runs."""
    loop.add_argument("--ca-common-name", default="", help="default: <service>.<namespace>-ca")
    # RotationPolicy checks these durations against each other, with messages that name both.
    duration = go_duration_argument(accept="any")
    loop.add_argument("--ca-validity", type=duration, default=DEFAULTS.ca_validity, metavar="DURATION")
    loop.add_argument("--ca-rotate-before", type=duration, default=DEFAULTS.ca_rotate_before, metavar="DURATION")
    loop.add_argument("--ca-overlap", type=duration, default=DEFAULTS.ca_overlap, metavar="DURATION")
    loop.add_argument("--propagation-delay", type=duration, default=DEFAULTS.propagation_delay, metavar="DURATION")
    loop.add_argument("--serving-validity", type=duration, default=DEFAULTS.serving_validity, metavar="DURATION")
    loop.add_argument(
        "--shoot-wait-limit", type=duration, metavar="DURATION", help="default: a quarter of --ca-rotate-before"
    )
    loop.add_argument("--serving-renew-fraction", type=float, default=DEFAULTS.serving_renew_fraction)
    loop.add_argument("--resync", type=float, default=60.0, help="seconds between passes at most")
    loop.add_argument("--once", action="store_true", help="exit after the first successful pass")

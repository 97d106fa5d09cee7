"""`machine-preservation webhook`: run the admission webhook server until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import logging
import re
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from machine_preservation.certs.authority import generate_ca, issue_serving_cert
from machine_preservation.certs.rotation import split_names
from machine_preservation.core.admission.settings import (
    DEFAULT_CONTROLLER_USERNAME,
    DEFAULT_MCM_USERNAMES,
    AdmissionSettings,
)
from machine_preservation.core.clock import system_clock
from machine_preservation.core.duration_arguments import go_duration_argument
from machine_preservation.core.mcm_generation import NativePreservationMode
from machine_preservation.webhook.app import DEFAULT_MAX_BODY_BYTES
from machine_preservation.webhook.certificates import CA_FILE, CERT_FILE, KEY_FILE
from machine_preservation.webhook.connections import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_PEER,
    ConnectionLimits,
)
from machine_preservation.webhook.machine_sets import KubernetesMachineSets
from machine_preservation.webhook.mcm_detection import NAMESPACE_TTL_SECONDS, ExtensionNamespaces, NativeByNamespace
from machine_preservation.webhook.mcm_detection import decide as decide_native
from machine_preservation.webhook.server import DEFAULT_CERT_POLL_INTERVAL, WebhookServer

logger = logging.getLogger(__name__)

SELF_SIGNED_VALIDITY = dt.timedelta(days=365)
_WILDCARD_HOSTS = ("", "0.0.0.0", "::")
# A ServiceAccount's name is a DNS-1123 subdomain.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _service_account_name(text: str) -> str:
    if len(text) > 253 or not _SUBDOMAIN.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a ServiceAccount name (a DNS-1123 subdomain): {text!r}")
    return text


class _AppendUsername(argparse.Action):
    """`--controller-username`, repeatable: every value goes to `controller_usernames`; the first is also
    `controller_username`, the identity denials name (so one value behaves as the flag always did)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        given = [*getattr(namespace, "controller_usernames", ()), str(values)]
        namespace.controller_usernames = tuple(given)
        namespace.controller_username = given[0]


def write_self_signed(*, cert_dir: Path, names: tuple[str, ...], now: dt.datetime) -> bool:
    """Generate a CA (ca.crt) and a serving cert it signs (tls.crt, tls.key) into an empty `cert_dir`.

    Returns False, touching nothing, when the directory already holds files. The CA key is not kept:
    a self-signed setup is re-generated, not rotated.
    """
    cert_dir.mkdir(parents=True, exist_ok=True)
    if any(cert_dir.iterdir()):
        return False
    identity = split_names(tuple(dict.fromkeys(names)))
    ca = generate_ca(common_name="machine-preservation-webhook-ca", now=now, valid_for=SELF_SIGNED_VALIDITY)
    serving = issue_serving_cert(
        ca=ca,
        dns_names=identity.dns_names,
        ip_addresses=identity.ip_addresses,
        now=now,
        valid_for=SELF_SIGNED_VALIDITY,
    )
    (cert_dir / CA_FILE).write_bytes(ca.cert_pem)
    (cert_dir / CERT_FILE).write_bytes(serving.cert_pem)
    key = cert_dir / KEY_FILE
    key.touch(mode=0o600)
    key.write_bytes(serving.key_pem)
    return True


def settings_from(args: argparse.Namespace, *, native: bool) -> AdmissionSettings:
    controllers = tuple(args.controller_usernames) or (args.controller_username,)
    return AdmissionSettings(
        controller_username=controllers[0],
        more_controller_usernames=frozenset(controllers[1:]),
        mcm_usernames=frozenset(args.mcm_username or DEFAULT_MCM_USERNAMES),
        mcm_service_accounts=frozenset(args.mcm_service_account),
        max_preserve_timeout=args.max_preserve_timeout,
        mcm_native_preservation=native,
    )


async def serve(args: argparse.Namespace) -> None:
    settings = settings_from(
        args,
        native=(
            await decide_native(
                mode=NativePreservationMode(args.mcm_native_preservation),
                kubeconfig=args.kubeconfig,
                namespace=args.control_namespace,
            )
        ).native,
    )
    native = None
    if args.mcm_native_preservation_per_namespace:
        # As Gardener's extension, only the shoot namespaces with our Extension get decisions of their own.
        only = ExtensionNamespaces.from_kubeconfig(args.kubeconfig) if args.gardener_extension else None
        native = NativeByNamespace.from_kubeconfig(
            args.kubeconfig, ttl=args.native_preservation_ttl, only=only, default=settings.mcm_native_preservation
        )
    server = WebhookServer(
        host=args.host,
        port=args.port,
        cert_dir=args.cert_dir,
        settings=settings,
        machine_sets=KubernetesMachineSets(
            kubeconfig=args.kubeconfig,
            gardener_extension=args.gardener_extension,
            # Standalone, the guard watches the control namespace from the start (as Gardener's extension: the seed).
            namespaces=(args.control_namespace,) if args.control_namespace else (),
        ),
        native=native,
        max_body_bytes=args.max_body_bytes,
        cert_poll_interval=args.cert_poll_interval,
        limits=ConnectionLimits(
            header_timeout=args.header_timeout,
            idle_timeout=args.idle_timeout,
            max_connections=args.max_connections,
            max_connections_per_peer=args.max_connections_per_peer,
        ),
        routes=args.routes,
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    async with server:
        # Everything imported and built so far lives as long as the process (the kubernetes client alone is
        # ~70k objects): take it out of the collector's view, so that the collections which per-request
        # garbage triggers do not walk it every time.
        gc.freeze()
        logger.info(
            "webhook serving on https://%s:%d (ready: %s), routes: %s",
            args.host,
            server.port,
            server.certificates.ready(),
            args.routes,
        )
        await stopping.wait()
    logger.info("webhook stopped")


def run(args: argparse.Namespace) -> int:
    if args.mcm_native_preservation_per_namespace and args.mcm_native_preservation != NativePreservationMode.AUTO:
        logger.error(
            "--mcm-native-preservation-per-namespace decides each namespace from what it shows: it needs "
            "--mcm-native-preservation=auto, not %s",
            args.mcm_native_preservation,
        )
        return 2
    if args.self_signed:
        names = tuple(n for n in (args.host, *args.san) if n not in _WILDCARD_HOSTS) or ("localhost", "127.0.0.1")
        if write_self_signed(cert_dir=args.cert_dir, names=names, now=system_clock()):
            logger.info("self-signed CA and serving certificate for %s written to %s", ", ".join(names), args.cert_dir)
    asyncio.run(serve(args))
    return 0


def _add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    """Where it listens, which routes, and its serving certificate."""
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: all interfaces)")
    parser.add_argument("--port", type=int, default=9443, help="port to listen on; 0 picks a free one")
    parser.add_argument(
        "--routes",
        choices=["all", "seed", "shoots"],
        default="all",
        help="the admission routes served: seed, the plain paths (the seed's Machine webhooks; a standalone "
        "installation's node webhooks); shoots, only /shoots/<namespace>/ (every shoot's node webhooks); all, both "
        "(default). A seed runs one process of each, so that no shoot's traffic takes the connections or the CPU "
        "time of the seed's fail-closed Machine webhooks",
    )
    parser.add_argument("--cert-dir", type=Path, required=True, help="directory with tls.crt and tls.key")
    parser.add_argument(
        "--self-signed", action="store_true", help="write a CA (ca.crt) and serving cert into --cert-dir if it is empty"
    )
    parser.add_argument(
        "--san", action="append", default=[], help="extra DNS name or IP for the self-signed cert (repeatable)"
    )
    parser.add_argument(
        "--cert-poll-interval",
        type=float,
        default=DEFAULT_CERT_POLL_INTERVAL,
        help="seconds between checks of the certificate files for changes",
    )


def _add_identity_arguments(parser: argparse.ArgumentParser) -> None:
    """Whose requests are special: the controller's and MCM's identities."""
    parser.add_argument(
        "--controller-username",
        action=_AppendUsername,
        default=DEFAULT_CONTROLLER_USERNAME,
        help="the controller's identity: the only one that may set the auto value and the controller's markers "
        "(repeatable: one controller with several identities, e.g. Gardener's seed and shoot ServiceAccounts; "
        "the first is the one denials name)",
    )
    parser.set_defaults(controller_usernames=())
    parser.add_argument(
        "--mcm-username",
        action="append",
        help=f"an MCM identity whose machine deletes are guarded (repeatable; default {DEFAULT_MCM_USERNAMES[0]})",
    )
    parser.add_argument(
        "--mcm-service-account",
        action="append",
        default=[],
        type=_service_account_name,
        metavar="NAME",
        help="MCM's ServiceAccount in the namespace of the Machines it manages (repeatable): a Machine request by "
        "system:serviceaccount:<the Machine's namespace>:NAME is MCM's, as well as the --mcm-username ones "
        "(Gardener: machine-controller-manager, one MCM per shoot namespace)",
    )


def _add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """What one client may cost: body size, connection timeouts and counts."""
    parser.add_argument(
        "--max-body-bytes", type=_positive_int, default=DEFAULT_MAX_BODY_BYTES, help="larger bodies get HTTP 413"
    )
    parser.add_argument(
        "--header-timeout",
        type=_positive_seconds,
        default=DEFAULT_HEADER_TIMEOUT,
        help="seconds a new connection may take for its TLS handshake and its first request's headers together; "
        f"closed after that (default {DEFAULT_HEADER_TIMEOUT:g})",
    )
    parser.add_argument(
        "--idle-timeout",
        type=_positive_seconds,
        default=DEFAULT_IDLE_TIMEOUT,
        help="seconds a kept-alive connection may take to send its next request after a response; closed after "
        f"that (default {DEFAULT_IDLE_TIMEOUT:g}, above the 90 s after which the API server's client closes it)",
    )
    parser.add_argument(
        "--max-connections",
        type=_positive_int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="open client connections at most (default "
        f"{DEFAULT_MAX_CONNECTIONS}; each costs up to ~0.12 MiB); at the limit a new one replaces the oldest that "
        "has not sent a request yet, else the least recently used idle one, or is refused before TLS when all "
        "are busy with a request",
    )
    parser.add_argument(
        "--max-connections-per-peer",
        type=_positive_int,
        default=DEFAULT_MAX_CONNECTIONS_PER_PEER,
        help="open connections at most from one client address, on each listener (default "
        f"{DEFAULT_MAX_CONNECTIONS_PER_PEER}); at the limit a new one replaces that client's own oldest connection "
        "as above",
    )


def _add_control_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The control cluster: what the deletion guard reads and how MCM is judged."""
    parser.add_argument(
        "--max-preserve-timeout",
        type=go_duration_argument(accept="not negative"),
        default=dt.timedelta(hours=720),
        help="upper bound for machinePreserveTimeout in Shoots (Go duration, default 720h)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="the control cluster, for the deletion guard's reads (default: in-cluster, else the default kubeconfig)",
    )
    parser.add_argument(
        "--mcm-native-preservation",
        choices=[mode.value for mode in NativePreservationMode],
        default=NativePreservationMode.AUTO.value,
        help="whether MCM preserves machines itself (v0.62+): then it may write its own auto value and the "
        "deletion guard covers only preservations our controller still holds; auto: decided at start from MCM's "
        "Deployment (--control-namespace) and CRDs, and logged (default auto)",
    )
    parser.add_argument(
        "--mcm-native-preservation-per-namespace",
        action="store_true",
        help="decide --mcm-native-preservation=auto per namespace instead (Gardener: one MCM per shoot namespace): "
        "for Machine requests by their namespace, for node requests by the namespace their URL names "
        "(/shoots/<namespace>/<path>), from MCM's Deployment in that namespace and the CRDs, read when first "
        "needed and again after --native-preservation-ttl; plain node paths keep the process-wide decision",
    )
    parser.add_argument(
        "--native-preservation-ttl",
        type=_positive_seconds,
        default=NAMESPACE_TTL_SECONDS,
        help="seconds a namespace's native-preservation decision is kept before it is read again "
        f"(default {NAMESPACE_TTL_SECONDS:g})",
    )
    parser.add_argument(
        "--gardener-extension",
        action="store_true",
        help="serving as Gardener's extension (the seed chart): MCM's deletes in a shoot namespace whose Extension "
        "of type machine-preservation is gone, being deleted or migrated away all pass (the extension is disabled "
        "there, its preservations released); off, the guard never reads Extensions",
    )
    parser.add_argument(
        "--control-namespace",
        default=None,
        help="the namespace MCM's Deployment runs in, for --mcm-native-preservation=auto (default: CRDs only); "
        "standalone, the deletion guard watches it from the start (ready once read)",
    )


def register(subcommands: argparse._SubParsersAction[Any]) -> None:
    parser = subcommands.add_parser("webhook", help="the admission webhook server (HTTPS, AdmissionReview v1)")
    _add_serving_arguments(parser)
    _add_identity_arguments(parser)
    _add_limit_arguments(parser)
    _add_control_cluster_arguments(parser)
    parser.set_defaults(handler=run)

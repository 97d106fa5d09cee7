"""`kubectl preservation`: the command line and the requests behind each subcommand. What is shown is decided in
`view` and `evidence_view`, what an answer means in `outcomes`; this module only asks the API server.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import FrameType
from typing import Any, Final

import yaml

from machine_preservation.cli.kubectl import view
from machine_preservation.cli.kubectl.api import Api, kubeconfig_namespace
from machine_preservation.cli.kubectl.evidence_view import EvidenceState, read_evidence, show_structure, show_text
from machine_preservation.cli.kubectl.outcomes import (
    EXIT_CODES_HELP,
    ExitCode,
    PluginError,
    answer_error,
    denial,
)
from machine_preservation.core import vocabulary as v
from machine_preservation.core import webhook_configurations as wc
from machine_preservation.core.evidence import evidence_name
from machine_preservation.core.gardener.cluster import ClusterView, read_cluster

NODES: Final = "/api/v1/nodes"
CONFIGURATIONS: Final = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
MACHINES_API: Final = f"/apis/{v.MACHINE_API_GROUP}/{v.MACHINE_API_VERSION}"
CLUSTERS: Final = "/apis/extensions.gardener.cloud/v1alpha1/clusters"
ACCESS_REVIEWS: Final = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
MERGE_PATCH: Final = "application/merge-patch+json"
# What each setting subcommand writes into the preserve annotation.
SET_VALUES: Final = {
    "now": v.PreserveValue.NOW,
    "when-failed": v.PreserveValue.WHEN_FAILED,
    "release": v.PreserveValue.FALSE,
}

INSTALLED_HELP: Final = (
    "machine-preservation counts as installed when a ValidatingWebhookConfiguration registers its node webhook "
    f"({wc.NODE_PRESERVE_WEBHOOK}; with --seed its Machine webhooks); where you may not list "
    "ValidatingWebhookConfigurations, this is not checked."
)


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _dump(document: Any, output: str) -> str:
    if output == "json":
        return json.dumps(document, indent=2, ensure_ascii=False)
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True).rstrip("\n")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --- Checks every subcommand makes -------------------------------------------------------------------------


def ensure_installed(api: Api, webhooks: Iterable[str]) -> None:
    """Raise NOT_INSTALLED unless a ValidatingWebhookConfiguration registers one of `webhooks` (see INSTALLED_HELP)."""
    names = frozenset(webhooks)
    try:
        for page, _ in api.pages(
            CONFIGURATIONS, resource="validatingwebhookconfigurations.admissionregistration.k8s.io"
        ):
            if view.registers_webhook(page, names):
                return
    except PluginError as error:
        if error.code == ExitCode.FORBIDDEN:
            return  # not the user's to read: the requests themselves will tell
        raise
    raise PluginError(
        f"machine-preservation is not installed in this cluster: no ValidatingWebhookConfiguration registers "
        f"{' or '.join(sorted(names))}",
        ExitCode.NOT_INSTALLED,
    )


def read_node(api: Api, name: str) -> dict[str, Any]:
    node = api.get(f"{NODES}/{name}", resource="nodes", name=name)
    assert node is not None  # absent raises NOT_FOUND
    return node


def ensure_mcm_managed(node: Mapping[str, Any], name: str) -> None:
    if view.machine_of(node) is None:
        raise PluginError(
            f'node "{name}" is not a node of an MCM-managed pool (no label {view.MACHINE_NAME_LABEL}): '
            "machine-preservation does not act on it",
            ExitCode.NOT_MCM_MANAGED,
        )


# --- list --------------------------------------------------------------------------------------------------


def list_nodes(api: Api, args: argparse.Namespace) -> int:
    ensure_installed(api, [wc.NODE_PRESERVE_WEBHOOK])
    now, rows, version = _now(), [], ""
    for page, listed in api.pages(NODES, resource="nodes"):
        rows += view.marked_rows(page, now)
        version = listed
    rows = view.sorted_rows(rows, args.sort_by)
    output = args.output or ""
    if output in ("json", "yaml"):
        _out(_dump(view.list_structure(rows), output))
    elif rows or args.watch:
        _out(view.list_table(rows, wide=output == "wide"))
    else:
        _out("No preserved or marked nodes.")
    if args.watch:
        watch_nodes(api, {row.node: row for row in rows}, version, output)
    return ExitCode.OK


def watch_nodes(api: Api, shown: dict[str, view.NodeRow], version: str, output: str) -> None:
    """Print each marked node's row again when the node changes (and once more when it stops being marked or is
    deleted), until interrupted. Only the marked nodes' rows are kept."""
    while True:
        if not version:  # the watch's version is too old: list again, print what changed meanwhile
            now, listed = _now(), []
            for page, listed_version in api.pages(NODES, resource="nodes"):
                listed += view.marked_rows(page, now)
                version = listed_version
            for change in view.relisted(shown, listed):
                _print_change(change, output)
        for event in api.watch(NODES, version):
            version, followed = view.follow(event, shown, version, _now())
            if followed is not None:
                _print_change(followed, output)
            if not version:
                break


def _print_change(change: view.Change, output: str) -> None:
    if output in ("json", "yaml"):
        document = {"event": change.kind, "item": change.row.structure()}
        _out(_dump(document, output) + ("" if output == "json" else "\n---"))
    else:
        _out(view.change_line(change.row, wide=output == "wide", deleted=change.kind == "DELETED"))


# --- list --seed -------------------------------------------------------------------------------------------


def list_seed(api: Api, args: argparse.Namespace) -> int:
    namespace = args.namespace or kubeconfig_namespace(args.kubeconfig, args.context)
    if not namespace:
        raise PluginError(
            "--seed needs --namespace (the shoot's namespace in the seed, shoot--<project>--<name>)", ExitCode.USAGE
        )
    ensure_installed(api, [wc.MACHINE_PRESERVE_WEBHOOK, wc.MACHINE_DELETION_WEBHOOK])
    api.get(f"/api/v1/namespaces/{namespace}", resource="namespaces", name=namespace)
    base = f"{MACHINES_API}/namespaces/{namespace}"

    def everything(kind: str) -> list[Mapping[str, Any]]:
        found: list[Mapping[str, Any]] = []
        try:
            for page, _ in api.pages(f"{base}/{kind}", resource=f"{kind}.{v.MACHINE_API_GROUP}", namespace=namespace):
                found += page
        except PluginError as error:
            if error.code == ExitCode.NOT_FOUND:
                raise PluginError(
                    f"the server has no {kind}.{v.MACHINE_API_GROUP}: is this the seed of MCM's Machines?",
                    ExitCode.NOT_FOUND,
                ) from error
            raise
        return found

    now = _now()
    machines = sorted(
        (row for row in (view.machine_row(m, now) for m in everything("machines")) if row is not None),
        key=lambda row: row.machine,
    )
    budgets = view.budget_rows(
        machine_sets=everything("machinesets"),
        machine_deployments=everything("machinedeployments"),
        machines=machines,
        cluster=_cluster(api, namespace),
    )
    if args.output in ("json", "yaml"):
        _out(_dump(view.seed_structure(namespace, machines, budgets), args.output))
        return ExitCode.OK
    if machines:
        _out(view.table(view.MACHINE_COLUMNS, [m.cells() for m in machines]))
    else:
        _out(f"No preserved or marked Machines in namespace {namespace}.")
    _out("")
    if budgets:
        _out(view.table(view.BUDGET_COLUMNS, [b.cells() for b in budgets]))
    else:
        _out("No MachineSet with an auto-preservation budget.")
    return ExitCode.OK


def _cluster(api: Api, namespace: str) -> ClusterView | None:
    """Gardener's Cluster of the shoot, where the pools' budgets may be set; None without Gardener or access."""
    try:
        raw = api.get(f"{CLUSTERS}/{namespace}", resource="clusters", name=namespace, absent_ok=True)
    except PluginError as error:
        if error.code in (ExitCode.FORBIDDEN, ExitCode.NOT_FOUND):
            return None
        raise
    return None if raw is None else read_cluster(raw)


# --- show --------------------------------------------------------------------------------------------------


def show(api: Api, args: argparse.Namespace) -> int:
    node = read_node(api, args.node)
    ensure_mcm_managed(node, args.node)
    ensure_installed(api, [wc.NODE_PRESERVE_WEBHOOK])
    name = evidence_name(args.node)
    where = f"{v.EVIDENCE_NAMESPACE}/{name}"
    path = f"/api/v1/namespaces/{v.EVIDENCE_NAMESPACE}/configmaps/{name}"
    forbidden: PluginError | None = None
    try:
        state = read_evidence(
            where, api.get(path, resource="configmaps", name=name, namespace=v.EVIDENCE_NAMESPACE, absent_ok=True)
        )
    except PluginError as error:
        if error.code != ExitCode.FORBIDDEN:
            raise
        forbidden, state = error, EvidenceState(where=where, problem=f"cannot be read: {error.message}")
    now = _now()
    row = view.node_row(node, now)
    if args.output in ("json", "yaml"):
        _out(_dump(show_structure(row, node, state), args.output))
    else:
        _out(show_text(row, node, state, now))
    if forbidden is not None:
        raise forbidden
    return ExitCode.OK


# --- now, when-failed, release -----------------------------------------------------------------------------


def set_value(api: Api, args: argparse.Namespace) -> int:
    value = SET_VALUES[args.command]
    node = read_node(api, args.node)
    ensure_mcm_managed(node, args.node)
    ensure_installed(api, [wc.NODE_PRESERVE_WEBHOOK])
    review = api.call(
        "POST",
        ACCESS_REVIEWS,
        body={"spec": {"resourceAttributes": {"verb": "patch", "resource": "nodes", "name": args.node}}},
    )
    if review.status == 201 and not review.json().get("status", {}).get("allowed"):
        raise PluginError(f'you may not patch nodes "{args.node}"', ExitCode.FORBIDDEN)
    patch = {"metadata": {"annotations": {v.PRESERVE_ANNOTATION: value.value}}}
    path = f"{NODES}/{args.node}"
    dry = api.call("PATCH", path, query=[("dryRun", "All")], body=patch, content_type=MERGE_PATCH)
    _answered(dry, args.node)
    _out("admission (server-side dry run): allowed")
    if args.dry_run == "server":
        _out(f"node/{args.node} annotated (server dry run): {v.PRESERVE_ANNOTATION}={value.value}")
        return ExitCode.OK
    _answered(api.call("PATCH", path, body=patch, content_type=MERGE_PATCH), args.node)
    _out(f"node/{args.node} annotated: {v.PRESERVE_ANNOTATION}={value.value}")
    return ExitCode.OK


def _answered(answer: Any, node: str) -> None:
    for warning in answer.warnings:
        _err(f"Warning: {warning}")
    if answer.status == 200:
        return
    if answer.status in (400, 403, 422):
        raise denial(answer.body)
    raise answer_error(answer.status, answer.body, verb="patch", resource="nodes", name=node)


# --- The command line --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--kubeconfig", help="the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")
    common.add_argument("--context", help="the kubeconfig context (default: its current context)")
    epilog = f"{EXIT_CODES_HELP}\n\n{INSTALLED_HELP}"
    parser = argparse.ArgumentParser(
        prog="kubectl preservation",
        description="See and set machine preservation on a shoot's nodes (and, with seed access, its Machines).",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    listing = commands.add_parser(
        "list",
        parents=[common],
        help="the preserved and marked nodes",
        description="The preserved and marked nodes: preserve value (now, when-failed, false; auto when the pool's "
        "budget preserved it), since, until, time left, Ready, the drain, scale-down protection.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.add_argument("-o", "--output", choices=("wide", "json", "yaml"))
    listing.add_argument("-w", "--watch", action="store_true", help="print a node's row again when it changes")
    listing.add_argument("--sort-by", choices=view.SORT_KEYS, default="name", help="left: the soonest to end first")
    listing.add_argument("--seed", action="store_true", help="list the Machines of a shoot's namespace in the seed")
    listing.add_argument("-n", "--namespace", help="with --seed: the shoot's namespace (shoot--<project>--<name>)")
    listing.set_defaults(run=list_nodes)
    showing = commands.add_parser(
        "show",
        parents=[common],
        help="a node's preservation and the evidence of its failure",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    showing.add_argument("node", metavar="NODE")
    showing.add_argument("-o", "--output", choices=("json", "yaml"))
    showing.set_defaults(run=show)
    for command, what in (
        ("now", "preserve the node now, until the pool's timeout runs out"),
        ("when-failed", "preserve the node when its machine fails"),
        ("release", "end the node's preservation and opt it out of auto-preservation (writes false)"),
    ):
        setting = commands.add_parser(
            command,
            parents=[common],
            help=what,
            description=f"{what[0].upper()}{what[1:]}: a server-side dry run first shows the admission's verdict, "
            "then the annotation is written.",
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        setting.add_argument("node", metavar="NODE")
        setting.add_argument("--dry-run", choices=("server",), help="server: stop after the server-side dry run")
        setting.set_defaults(run=set_value)
    return parser


Command = Callable[[Api, argparse.Namespace], int]


def run(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Command = args.run
    for what, name in (("node", getattr(args, "node", None)), ("namespace", getattr(args, "namespace", None))):
        if name is not None and not view.is_object_name(name):
            parser.error(f"{name!r} is not a valid {what} name")
    if command is list_nodes and args.seed:
        if args.watch or args.sort_by != "name" or args.output == "wide":
            parser.error("--seed takes none of --watch, --sort-by, -o wide")
        command = list_seed
    elif command is list_nodes and args.namespace:
        parser.error("--namespace needs --seed (Nodes have no namespace)")
    try:
        return command(Api(kubeconfig=args.kubeconfig, context=args.context), args)
    except PluginError as error:
        _err(f"error: {error.message}")
        return error.code
    except KeyboardInterrupt:
        return ExitCode.OK


def _exit_on_signal(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> None:
    # The kubernetes client copies the kubeconfig's client key and certificates to temporary files and removes them
    # at a normal exit only: a closed terminal or a `timeout` must not leave the SRE's key behind. A signal the
    # caller ignores (`nohup`) stays ignored.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _exit_on_signal)
    sys.exit(run(argv))

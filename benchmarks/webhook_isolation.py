"""MCM's deletes on the seed webhook while the shoot-facing port is flooded.

Starts a seed control plane on 127.0.0.1 (etcd, kube-apiserver, kube-controller-manager; MCM's CRDs) with one
shoot namespace holding a MachineSet and its Machines, and the real `machine-preservation webhook` command as the
seed chart runs it: one process with `--routes=seed`, one with `--routes=shoots` (each
`--mcm-service-account=machine-controller-manager`, per-namespace native preservation, the default connection
limits but for `--max-connections=1000`). MCM's side sends DELETE reviews of a
Failed Machine by MCM's ServiceAccount to `/validate-machine-deletion` on the seed port, open-loop at `--rate`
over a kept-alive pool as the seed's kube-apiserver does; the guard reads the MachineSet, its Machines and
MachineDeployments and the Cluster from the API server to decide. Latency is measured from each request's
scheduled send time.

Phases: unloaded, then loaded. The load is a separate process that floods the shoot-facing port: `--flood`
connections (spread over 10 loopback source addresses, as 10 API server replicas would be) each sending Node
UPDATE reviews to `/shoots/<namespace>/validate-preserve-annotation` back to back as fast as the webhook answers,
reconnecting when closed. Printed: p50/p99/max and errors (anything but an answered review) of MCM's deletes in
each phase, the ratio of the p99s, and what the flood got (connections it held, requests answered, connections
refused or closed). `--shared` runs the layout before the seed had its own process (one port for all) for
comparison. About a minute.

    .venv/bin/python benchmarks/webhook_isolation.py
    .venv/bin/python benchmarks/webhook_isolation.py --shared
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from local_webhook import HOST, announced_port, webhook_command, write_certificates
from machine_preservation.core import vocabulary as v

NAMESPACE = "shoot--bench--iso"
MCM = f"system:serviceaccount:{NAMESPACE}:machine-controller-manager"
SOURCES = [f"127.0.0.{i}" for i in range(2, 12)]
P99_RATIO_LIMIT = 2.0
MACHINE_KIND = {"group": v.MACHINE_API_GROUP, "version": v.MACHINE_API_VERSION, "kind": "Machine"}


def machine(name: str, phase: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{v.MACHINE_API_GROUP}/{v.MACHINE_API_VERSION}",
        "kind": "Machine",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"name": "pool"},
            "ownerReferences": [
                {
                    "apiVersion": f"{v.MACHINE_API_GROUP}/{v.MACHINE_API_VERSION}",
                    "kind": "MachineSet",
                    "name": "pool",
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                }
            ],
        },
        "spec": {"class": {"kind": "AWSMachineClass", "name": "c"}, "nodeTemplate": {}},
        "status": {"currentStatus": {"phase": phase}},
    }


def review(kind: dict[str, str], operation: str, username: str, *, obj: Any = None, old: Any = None) -> bytes:
    source = obj or old
    request = {
        "uid": str(uuid.uuid4()),
        "kind": kind,
        "resource": {"group": kind["group"], "version": kind["version"], "resource": kind["kind"].lower() + "s"},
        "name": source["metadata"]["name"],
        "namespace": source["metadata"].get("namespace", ""),
        "operation": operation,
        "userInfo": {"username": username, "groups": ["system:serviceaccounts"]},
        "object": obj,
        "oldObject": old,
    }
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def node_review() -> bytes:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "annotations": {"a": "b"}}}
    changed = {**node, "metadata": {"name": "n1", "annotations": {"a": "c"}}}
    return review({"group": "", "version": "v1", "kind": "Node"}, "UPDATE", "kubelet", obj=changed, old=node)


# --- the seed ------------------------------------------------------------------------------------------------------


def populate(kubeconfig: Path) -> None:
    """The shoot namespace with a MachineSet of three Machines (one Failed), and MCM's Deployment."""
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    client.CoreV1Api(api).create_namespace(
        {"metadata": {"name": NAMESPACE, "labels": {"gardener.cloud/role": "shoot"}}}
    )
    custom = client.CustomObjectsApi(api)
    group, version = v.MACHINE_API_GROUP, v.MACHINE_API_VERSION
    machine_set = {
        "apiVersion": f"{group}/{version}",
        "kind": "MachineSet",
        "metadata": {"name": "pool", "namespace": NAMESPACE},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"name": "pool"}}, "template": {"spec": {}}},
    }
    custom.create_namespaced_custom_object(group, version, NAMESPACE, "machinesets", machine_set)
    for i, phase in enumerate(("Running", "Running", "Failed")):
        document = machine(f"m{i}", phase)
        status = document.pop("status")
        created = custom.create_namespaced_custom_object(group, version, NAMESPACE, "machines", document)
        created["status"] = status
        custom.replace_namespaced_custom_object_status(group, version, NAMESPACE, "machines", f"m{i}", created)
    api.close()  # type: ignore[no-untyped-call]


def start_webhook(cert_dir: Path, kubeconfig: Path, routes: str) -> tuple[subprocess.Popen[str], int]:
    """A webhook process serving `routes` as the seed chart runs it; returns it and its port."""
    flags = [
        f"--routes={routes}",
        f"--kubeconfig={kubeconfig}",
        "--mcm-service-account=machine-controller-manager",
        "--mcm-native-preservation-per-namespace",
        "--max-connections=1000",
    ]
    process = subprocess.Popen(webhook_command(cert_dir, *flags), stderr=subprocess.PIPE, text=True)
    return process, announced_port(process, f"the webhook ({routes})")


# --- MCM's deletes ---------------------------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    latencies: list[float]
    errors: int

    def line(self) -> str:
        ordered = sorted(self.latencies) or [float("nan")]
        p50 = statistics.median(ordered)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return (
            f"{self.name:>9}: {len(self.latencies)} deletes, p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
            f"max {ordered[-1] * 1000:.1f} ms, errors {self.errors}"
        )

    @property
    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def deletes(port: int, context: ssl.SSLContext, *, rate: float, seconds: float, name: str) -> Phase:
    """MCM's DELETE reviews of the Failed machine, open-loop at `rate`, over a pool of kept-alive connections."""
    url = f"https://{HOST}:{port}/validate-machine-deletion"
    failed = machine("m2", "Failed")
    phase = Phase(name, [], 0)
    connector = aiohttp.TCPConnector(ssl=context, limit=20, keepalive_timeout=90)
    timeout = aiohttp.ClientTimeout(total=10)  # the Machine webhook's timeoutSeconds
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(scheduled: float) -> None:
            body = review(MACHINE_KIND, "DELETE", MCM, old=failed)
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                    answer = await response.json()
                    if response.status != 200 or "response" not in answer:
                        phase.errors += 1
                        return
                    status = answer["response"].get("status") or {}
                    if status.get("code") == 503:  # the guard could not read the seed
                        phase.errors += 1
                        return
            except (aiohttp.ClientError, TimeoutError, ValueError):
                phase.errors += 1
                return
            phase.latencies.append(time.perf_counter() - scheduled)

        start = time.perf_counter()
        tasks = []
        for i in range(int(rate * seconds)):
            scheduled = start + i / rate
            await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
            tasks.append(asyncio.create_task(one(scheduled)))
        await asyncio.gather(*tasks)
    return phase


# --- the flood (its own process) -------------------------------------------------------------------------------------


def flood(port: int, ca_pem: str, connections: int, stop: Any, report: Any) -> None:
    asyncio.run(_flood(port, ca_pem, connections, stop, report))


async def _flood(port: int, ca_pem: str, connections: int, stop: Any, report: Any) -> None:
    context = ssl.create_default_context(cadata=ca_pem)
    body = node_review()
    request = (
        f"POST /shoots/{NAMESPACE}/validate-preserve-annotation HTTP/1.1\r\nHost: webhook\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    counts = {"answered": 0, "refused_or_closed": 0, "open": 0, "most_open": 0}

    async def worker(source: str) -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(HOST, port, ssl=context, local_addr=(source, 0))
            except (OSError, ssl.SSLError):
                counts["refused_or_closed"] += 1
                await asyncio.sleep(0.05)
                continue
            counts["open"] += 1
            counts["most_open"] = max(counts["most_open"], counts["open"])
            try:
                while not stop.is_set():
                    writer.write(request)
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(re.search(rb"Content-Length: (\d+)", head, re.IGNORECASE).group(1))  # type: ignore[union-attr]
                    await reader.readexactly(length)
                    counts["answered"] += 1
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError, AttributeError):
                counts["refused_or_closed"] += 1
            finally:
                counts["open"] -= 1
                writer.close()

    tasks = [asyncio.create_task(worker(SOURCES[i % len(SOURCES)])) for i in range(connections)]
    await asyncio.to_thread(stop.wait)
    await asyncio.wait(tasks, timeout=5)
    report.put(counts)


# --- main --------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood", type=int, default=1000, help="flood connections to the shoot-facing port")
    parser.add_argument("--rate", type=float, default=20.0, help="MCM's deletes per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument(
        "--shared", action="store_true", help="one process and port for all (before the seed had its own)"
    )
    args = parser.parse_args()

    from machine_preservation.localcluster.gardener_landscape import seed_plane
    from machine_preservation.localcluster.toolchain import ensure_toolchain

    toolchain = ensure_toolchain()
    with tempfile.TemporaryDirectory(prefix="webhook-isolation-") as temporary:
        directory = Path(temporary)
        cert_dir = directory / "certs"
        cert_dir.mkdir()
        context = write_certificates(cert_dir)
        ca_pem = ssl.DER_cert_to_PEM_cert(context.get_ca_certs(binary_form=True)[0])  # for the flood's process
        with seed_plane(directory=directory / "seed", bin_dir=toolchain.bin_dir) as plane:
            populate(plane.kubeconfig)
            # As the seed chart runs them: one process for the seed's webhooks, one for the shoots'.
            layouts = ["all"] if args.shared else ["seed", "shoots"]
            webhooks = [start_webhook(cert_dir, plane.kubeconfig, routes) for routes in layouts]
            seed_port, port = webhooks[0][1], webhooks[-1][1]
            try:
                layout = "one process, one port for all" if args.shared else "a process and a port each"
                print(f"webhook: {layout}; MCM's deletes at {args.rate:g}/s for {args.seconds:g} s per phase")
                asyncio.run(deletes(seed_port, context, rate=args.rate, seconds=3, name="warm-up"))
                unloaded = asyncio.run(
                    deletes(seed_port, context, rate=args.rate, seconds=args.seconds, name="unloaded")
                )
                print(unloaded.line(), flush=True)

                spawn = multiprocessing.get_context("spawn")
                stop, report = spawn.Event(), spawn.Queue()
                flooder = spawn.Process(target=flood, args=(port, ca_pem, args.flood, stop, report))
                flooder.start()
                time.sleep(5)  # the flood's connections open
                loaded = asyncio.run(deletes(seed_port, context, rate=args.rate, seconds=args.seconds, name="loaded"))
                stop.set()
                counts = report.get(timeout=30)
                flooder.join(timeout=10)
                print(loaded.line())
                print(
                    f"    flood: {args.flood} connections offered to the shoots' port, at most {counts['most_open']} "
                    f"open at once, {counts['answered']} requests answered "
                    f"({counts['answered'] / (args.seconds + 5):.0f}/s), {counts['refused_or_closed']} connections "
                    "refused or closed"
                )
                ratio = loaded.p99 / unloaded.p99 if unloaded.latencies and loaded.latencies else float("inf")
                held = ratio <= P99_RATIO_LIMIT and loaded.errors == 0
                print(
                    f"loaded p99 / unloaded p99 = {ratio:.2f} (limit {P99_RATIO_LIMIT:g}, 0 errors): "
                    f"{'held' if held else 'NOT held'}"
                )
            finally:
                for process, _ in webhooks:
                    process.terminate()
                    process.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Seed scale benchmark: ONE `machine-preservation extension` process serving many shoots (loopback only).

The seed-wide sibling of controller_scale.py. It plays gardenlet, MCM, the kubelets and each shoot's
gardener-resource-manager (GRM), and runs the product as gardenlet installs it (the seed chart rendered with
gardenlet's values, its webhook and extension processes under the chart's ServiceAccounts:
`gardener_landscape.installation`), with `--mcm-native-preservation=false` added.

Setup:
- a seed (etcd, kube-apiserver, kube-controller-manager) with MCM v0.61.3's and Gardener's seed CRDs;
- `--shoot-apiservers` shoot kube-apiservers on the seed's etcd (`--etcd-prefix` each). 200 API servers do not fit
  a small machine, so the shoots are spread over them round-robin. Each shoot stays a shoot of its own for the
  product: its own seed namespace (labelled as gardenlet does), `Cluster` (Shoot with pool `worker1` and
  `machinePreserveTimeout`), `Extension`, generic token kubeconfig Secret and shoot-access Secret with a token of
  its own (TokenRequest for kube-system/machine-preservation on its API server), and its own MachineDeployment,
  MachineSet and Machines (phase Running, `node` label, providerID) in its namespace. Its Nodes (Ready; names
  unique per shoot) and ~`--pods-per-node` pods per node (bound by `spec.nodeName`, a third DaemonSet-owned, the
  rest ReplicaSet-owned; terminationGracePeriodSeconds 0 so an eviction removes a pod at once: no kubelet) are in
  its API server. Skew: Nodes are cluster-scoped and pods are listed cluster-wide, so a shoot sharing an API server
  with k-1 others sees k times its own Nodes (and pods, if the product watches them all); printed as
  "objects each shoot's watches see".
- GRM's part: the extension's ServiceAccount in every shoot API server is bound to cluster-admin up front (GRM
  would apply the RBAC from our ManagedResource; the node webhooks are not applied, no webhook runs for the
  shoots) and each ManagedResource gets `ResourcesApplied`/`ResourcesHealthy` True as soon as it appears.
- the shoots named by `--unreachable` reach their API server through a TCP proxy of this script (127.0.0.1),
  transparent until the unreachable phase.

Figures (on this script's clock):
1. cold start: extension process start (from /proc) -> /readyz 200; -> every Extension ready as gardenlet
   judges it; -> every Extension `ControlPlaneHealthy` True (each shoot's caches synced); -> first full reconcile:
   `machine_preservation_reconcile_duration_seconds_count{controller="machines"}` >= all Machines with the Machine
   and MachineSet queues empty (the process exports every shoot's metrics since 3eb56d4; without those counters,
   the first second after that with the extension using < 5 % of a core);
2. Failed -> preserved, one sample every `--fail-interval` s, spread over the shoots (Node Ready Unknown, then the
   Machine's phase Failed): "protected" = record on the Machine, CA annotation and taint on the Node (the
   condition says "being drained", False, while the drain runs); "fully preserved" = that and the condition True
   with "Preserved node drained successfully." (the sample node's non-DaemonSet pods evicted);
3. expiry lag: stop complete (record removed or Machine deleted, Node condition False, taint and CA annotation
   gone) minus the record's expiry;
4. steady state: API writes (the process's machine_preservation_api_requests_total, verbs create/update/patch/
   delete) and CPU (/proc/PID/stat, per 5 s) over `--steady-seconds`. The extension has no resync flag (600 s
   informer resync), so the window is placed to end 60 s after the shoots' first resync (unless --no-resync-window)
   and the resync's CPU is read from the 5 s timeline;
5. RSS: VmHWM and VmRSS of the extension process;
8. with --floor: after the healthy samples, at their pace, the requests a preservation must make before a sample
   counts as fully preserved (Machine write, Node write, the node's evictions at once, the condition), sent by
   this script on warm connections and timed on its clock: what the API servers alone take under the same load;
7. with --hostile-nodes N: the last shoot, on an API server of its own, also has N Nodes of `--hostile-node-bytes`
   each (labels, annotations, True conditions with long messages, images), as a hostile shoot owner would make
   them. It is left out of the cold start's wait and the samples; reported: how it is reported (its condition,
   its Warning Event, machine_preservation_shoot_nodes_over_budget) and whether the extension process lived
   through the run (same pid, never restarted).
6. with --unreachable N: N shoots' proxies refuse connections and cut the open ones (`--unreachable-mode down`)
   or answer every read `--slow-seconds` late (`slow`); then: how long until each of their Extensions reports it
   (ControlPlaneHealthy not True when down; a Warning Event on the Extension when slow), Failed -> preserved and
   expiry for samples on the other shoots, writes and CPU in a
   `--unreachable-steady-seconds` window, and the reachable shoots' conditions.

    .venv/bin/python benchmarks/seed_scale.py --quick
    .venv/bin/python benchmarks/seed_scale.py --shoots 20 --shoot-apiservers 2
    .venv/bin/python benchmarks/seed_scale.py --shoots 200 --shoot-apiservers 20 --unreachable 10
    .venv/bin/python benchmarks/seed_scale.py --shoots 200 --shoot-apiservers 20 --hostile-nodes 200

Everything binds to 127.0.0.1, is stopped at the end and dies with this process. Bounded by --time-limit.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

from scale_common import (
    GROUP,
    MERGE_PATCH,
    PRESERVE,
    SAMPLE_LABEL,
    VERSION,
    LoopLagProbe,
    MetricsReader,
    Sample,
    SampleRecorder,
    cpu_by_process,
    cpu_used_by_name,
    delta,
    gather_limited,
    log,
    loop_lag,
    percentile,
    proc_cpu_seconds,
    proc_memory,
    proc_started_monotonic,
    ready_condition,
    requests_by,
    rfc3339,
    summary,
    total,
    watch_raw,
    writes,
)

POOL = "worker1"
POOL_LABEL = "worker.gardener.cloud/pool"
# What the floor (--floor) writes instead of the product's record, taint and condition.
FLOOR_KEY = "benchmark.machine-preservation/floor"
FLOOR_TAINT = {"key": FLOOR_KEY, "effect": "NoSchedule"}
FLOOR_CONDITION = {"type": "BenchmarkFloor", "status": "True", "reason": "Floor", "message": "drained"}
EXTENSION_TYPE = "machine-preservation"
CONTROL_PLANE_HEALTHY = "ControlPlaneHealthy"
SHOOT_ACCESS_SECRET = "shoot-access-machine-preservation"  # the name gardenlet's contract gives it
SHOOT_SERVICE_ACCOUNT = ("kube-system", "machine-preservation")
SHOOT_AUDIENCE = "gardener"
PRODUCT_RESYNC_SECONDS = 600.0  # the extension's informer resync (no flag)
TARGETS = {"rss_mib": 400.0, "cold_s": 60.0, "p99_s": 0.3, "steady_writes": 0, "resync_core_share": 0.10}
DS_SHARE = 3  # every third pod of a node is DaemonSet-owned (stays on a drained node)
APP_NAMESPACES = 4


# --- a raw JSON client for the bulk of the setup (the generated client's models cost too much CPU) -------------


class RawKube:
    """POST/PATCH/GET of JSON to one API server as its administrator (client certificate), bounded in-flight."""

    def __init__(self, server: str, pki: Path, limit: int) -> None:
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        self.server = server
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=limit),
            timeout=aiohttp.ClientTimeout(total=120),
        )

    async def close(self) -> None:
        await self.session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (),
    ) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(5):
            async with self.session.request(
                method, self.server + path, data=data, headers={"Content-Type": content_type}
            ) as response:
                text = await response.read()
                if response.status < 300 or response.status in ok:
                    return json.loads(text) if text else {}
                if response.status in (429, 500, 503, 504) and attempt < 4:
                    await asyncio.sleep(0.5 * (attempt + 1))
                    continue
                raise RuntimeError(f"{method} {path}: HTTP {response.status} {text[:300]!r}")
        raise AssertionError("unreachable")

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        return await self.request("POST", path, body, ok=(409,))

    async def patch(self, path: str, body: Any) -> dict[str, Any]:
        return await self.request("PATCH", path, body, content_type=MERGE_PATCH)


# --- a TCP proxy in front of a shoot's API server (for the unreachable phase) ----------------------------------------


class ShootProxy:
    """A loopback address of its own, port 443 -> the API server, TLS passed through; the shoot's Service name
    resolves to it. Modes: pass, down (connections refused, open ones cut), slow (every chunk from the API server
    forwarded `delay` s late)."""

    def __init__(self, upstream: str, upstream_port: int) -> None:
        from machine_preservation.localcluster import hosts

        self.upstream, self.upstream_port = upstream, upstream_port
        self.address = hosts.free_loopback_address()
        self.port = hosts.SHOOT_API_SERVER_PORT
        self.mode = "pass"
        self.delay = 5.0
        self.server: asyncio.Server | None = None
        self.connections: set[asyncio.StreamWriter] = set()

    async def start(self, port: int = 0) -> None:
        self.server = await asyncio.start_server(self._serve, self.address, port or self.port, reuse_address=True)

    async def set_mode(self, mode: str, delay: float = 5.0) -> None:
        self.mode, self.delay = mode, delay
        if mode == "down":
            if self.server is not None:
                self.server.close()
                self.server = None
            for writer in list(self.connections):
                writer.transport.abort()
        elif self.server is None:
            await self.start(self.port)

    async def close(self) -> None:
        await self.set_mode("down")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "down":
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream, self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections.update((writer, up_writer))
        try:
            await asyncio.gather(self._pump(reader, up_writer, slow=False), self._pump(up_reader, writer, slow=True))
        finally:
            for end in (writer, up_writer):
                self.connections.discard(end)
                end.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, slow: bool) -> None:
        with contextlib.suppress(OSError, ConnectionError, asyncio.IncompleteReadError):
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                if slow and self.mode == "slow":
                    await asyncio.sleep(self.delay)  # in order: the next chunk waits behind this one
                writer.write(chunk)
                await writer.drain()
        writer.transport.abort()


# --- the shoots -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ShootSetup:
    index: int
    namespace: str
    apiserver: int  # index into the shoot API servers
    node_prefix: str
    proxy: ShootProxy | None = None
    token: str = ""

    def machine(self, j: int) -> str:
        return f"{self.node_prefix}-{j:03d}"


def shoot_name(index: int) -> str:
    return f"s{index:03d}"


def pods_of_node(node: str, count: int) -> list[tuple[str, dict[str, Any]]]:
    """(namespace, Pod) bound to `node`: every DS_SHARE-th DaemonSet-owned in kube-system, the rest of ReplicaSets."""
    pods = []
    for k in range(count):
        daemon = k % DS_SHARE == 0
        namespace = "kube-system" if daemon else f"app-{k % APP_NAMESPACES}"
        app = f"ds-{k}" if daemon else f"web-{k}"
        owner = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet" if daemon else "ReplicaSet",
            "name": app if daemon else f"{app}-6d4cf56db6",
            "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, f"{namespace}/{app}")),
            "controller": True,
            "blockOwnerDeletion": True,
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{app}-{node}",
                "namespace": namespace,
                "labels": {"app": app, "pod-template-hash": "6d4cf56db6", "tier": "bench"},
                "annotations": {"kubectl.kubernetes.io/default-container": "main"},
                "ownerReferences": [owner],
            },
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "main",
                        "image": f"registry.example.com/bench/{app}:1.2.3",
                        "args": ["--port=8080", "--log-level=info"],
                        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                        "env": [{"name": "MODE", "value": "bench"}],
                    }
                ],
            },
        }
        pods.append((namespace, pod))
    return pods


# Every kube-apiserver lists each resource from etcd every 5 minutes to check its watch cache (the beta gate
# DetectCacheInconsistency). Here the 21 API servers, standing in for a seed's and 200 shoots' on machines of their
# own, start together and so check together, for about a minute every 5 minutes, on the 2 cores the extension
# runs on: every slow sample of runs N to Q fell in such a minute.
APISERVER_GATES = {"DetectCacheInconsistency": False}

# What every real Node carries from its kubelet and kube-controller-manager's TTL controller (neither runs here).
NODE_ANNOTATIONS = {
    "volumes.kubernetes.io/controller-managed-attach-detach": "true",
    "node.alpha.kubernetes.io/ttl": "0",
}


def node_status(machine: str) -> dict[str, Any]:
    """What a kubelet reports, roughly its size (conditions, capacity, addresses, info, images)."""
    conditions = [ready_condition("True")]
    for kind, reason in (
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
    ):
        conditions.append({**ready_condition("False"), "type": kind, "reason": reason, "message": reason})
    resources = {"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "status": {
            "conditions": conditions,
            "capacity": resources,
            "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": "10.250.0.1"}, {"type": "Hostname", "address": machine}],
            "nodeInfo": {
                "machineID": machine,
                "systemUUID": machine,
                "bootID": machine,
                "kernelVersion": "6.1.0",
                "osImage": "Garden Linux",
                "containerRuntimeVersion": "containerd://1.7.0",
                "kubeletVersion": "v1.36.3",
                "kubeProxyVersion": "v1.36.3",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [
                {"names": [f"registry.example.com/bench/image-{k}@sha256:{'0' * 64}"], "sizeBytes": 10_000_000 + k}
                for k in range(20)
            ],
        }
    }


@dataclasses.dataclass
class Figures:
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)


class Bench:
    def __init__(self, args: argparse.Namespace, figures: Figures) -> None:
        self.args = args
        self.f = figures.values
        self.notes = figures.notes
        self.directory = Path(args.workdir or tempfile.mkdtemp(prefix="mp-seed-bench-"))
        self.stack = contextlib.AsyncExitStack()
        self.shoots: list[ShootSetup] = []
        self.apiservers: list[Any] = []  # ControlPlane
        self.raw_shoots: list[RawKube] = []
        self.shoot_clients: list[Any] = []  # kubernetes.aio ApiClient per shoot API server
        self.samples_a: list[Sample] = []
        self.samples_b: list[Sample] = []
        self.pid = 0
        self.install: Any = None  # gardener_landscape.Installation, once installed
        self.reader: MetricsReader | None = None
        self.stop_watch = asyncio.Event()

    # --- setup ---------------------------------------------------------------------------------------------------

    async def setup(self) -> None:
        from machine_preservation.kube.clients import new_api_client
        from machine_preservation.localcluster import gardener, hosts
        from machine_preservation.localcluster.gardener_landscape import seed_client, seed_plane
        from machine_preservation.localcluster.toolchain import ensure_toolchain

        args = self.args
        started = time.monotonic()
        self.toolchain = await asyncio.to_thread(ensure_toolchain)
        sync_stack = contextlib.ExitStack()
        self.stack.push_async_callback(asyncio.to_thread, sync_stack.close)
        self.plane = await asyncio.to_thread(
            sync_stack.enter_context,
            seed_plane(
                directory=self.directory / "seed", bin_dir=self.toolchain.bin_dir, feature_gates=APISERVER_GATES
            ),
        )
        self.seed = await self.stack.enter_async_context(seed_client(self.plane))
        self.raw_seed = RawKube(self.plane.server, self.plane.pki_dir, args.concurrency)
        self.stack.push_async_callback(self.raw_seed.close)

        async def start_apiserver(k: int) -> Any:
            served = [
                gardener.shoot_namespace_name("b", shoot_name(i))
                for i in range(args.shoots)
                if self.apiserver_of(i) == k
            ]
            plane = await asyncio.to_thread(
                gardener.start_shoot_control_plane,
                self.plane,
                self.directory / f"api{k:02d}",
                name=f"api{k:02d}",
                namespaces=served,
                feature_gates=APISERVER_GATES,
            )
            self.stack.push_async_callback(asyncio.to_thread, plane.stop)
            return plane

        semaphore = asyncio.Semaphore(4)

        async def limited(k: int) -> Any:
            async with semaphore:
                return await start_apiserver(k)

        servers = args.shoot_apiservers + (1 if args.hostile_nodes else 0)
        self.apiservers = list(await asyncio.gather(*(limited(k) for k in range(servers))))
        for plane in self.apiservers:
            raw = RawKube(plane.server, plane.pki_dir, args.concurrency)
            self.stack.push_async_callback(raw.close)
            self.raw_shoots.append(raw)
            api = await new_api_client(kubeconfig=plane.kubeconfig)
            api.configuration.connection_pool_maxsize = 8
            self.stack.push_async_callback(api.close)
            self.shoot_clients.append(api)
        self.f["setup_planes_s"] = round(time.monotonic() - started, 1)
        log(f"seed and {args.shoot_apiservers} shoot API servers up in {self.f['setup_planes_s']} s")

        # Which shoots: round-robin over the API servers; the unreachable ones evenly spread.
        unreachable: set[int] = set()
        if args.unreachable:
            stride = args.shoots / args.unreachable
            unreachable = {int(stride * n + stride / 2) for n in range(args.unreachable)}
        self.unreachable = sorted(unreachable)
        for i in range(args.shoots):
            shoot = ShootSetup(
                index=i,
                namespace=gardener.shoot_namespace_name("b", shoot_name(i)),
                apiserver=self.apiserver_of(i),
                node_prefix=shoot_name(i),
            )
            if i in unreachable:
                plane = self.apiservers[shoot.apiserver]
                shoot.proxy = ShootProxy(plane.address, plane.apiserver_port)
                await shoot.proxy.start()
                hosts.set_host(hosts.api_server_service(shoot.namespace), shoot.proxy.address)
                self.stack.push_async_callback(shoot.proxy.close)
            self.shoots.append(shoot)
        self._choose_samples()

        started = time.monotonic()
        await self._shoot_api_basics()
        await gather_limited(8, [lambda s=s: self._seed_objects(s) for s in self.shoots])  # type: ignore[misc]
        self.f["setup_seed_objects_s"] = round(time.monotonic() - started, 1)
        log(f"seed objects of {args.shoots} shoots in {self.f['setup_seed_objects_s']} s")
        started = time.monotonic()
        await self._nodes_and_pods()
        self.f["setup_nodes_pods_s"] = round(time.monotonic() - started, 1)
        nodes = args.shoots * args.machines_per_shoot
        log(
            f"{nodes} Nodes and {nodes * args.pods_per_node} pods in {self.f['setup_nodes_pods_s']} s "
            f"({nodes * args.pods_per_node / max(self.f['setup_nodes_pods_s'], 0.1):.0f} pods/s)"
        )
        if args.hostile_nodes:
            started = time.monotonic()
            await self._hostile_nodes()
            self.f["setup_hostile_nodes_s"] = round(time.monotonic() - started, 1)
            log(
                f"{args.hostile_nodes} Nodes of {self.f['hostile_node_bytes']} bytes in the hostile shoot in "
                f"{self.f['setup_hostile_nodes_s']} s"
            )
        await self._compact_etcd()

    async def _compact_etcd(self) -> None:
        """Compact etcd to its current revision now. The setup writes ~130,000 revisions at 200 shoots, and the API
        servers' own compaction (every 5 minutes, up to the revision they noted 5 minutes before) would remove
        them in the middle of a sample phase: in run M 10,880 keys took 1.7 s, 184 ms of it with etcd answering
        nothing, and the next one holds ten times as many. A real shoot's etcd compacts what 5 minutes wrote."""
        started = time.monotonic()
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{self.plane.etcd_url}/v3/kv/range", json={"key": "AA=="}) as response:
                response.raise_for_status()
                revision = (await response.json())["header"]["revision"]
            body = {"revision": revision, "physical": True}  # physical: answered once the keys are gone
            async with session.post(f"{self.plane.etcd_url}/v3/kv/compaction", json=body) as response:
                response.raise_for_status()
        self.f["setup_compaction_s"] = round(time.monotonic() - started, 1)
        log(f"etcd compacted to revision {revision} in {self.f['setup_compaction_s']} s")

    def apiserver_of(self, index: int) -> int:
        """The API server of shoot `index`: round-robin, but the hostile shoot has one of its own (its Nodes are
        cluster-scoped: every shoot of a shared server would see them)."""
        if self.args.hostile_nodes and index == self.hostile_index:
            return self.args.shoot_apiservers
        return index % self.args.shoot_apiservers

    @property
    def hostile_index(self) -> int:
        return self.args.shoots - 1 if self.args.hostile_nodes else -1

    def normal_shoots(self) -> list[ShootSetup]:
        return [s for s in self.shoots if s.index != self.hostile_index]

    def _choose_samples(self) -> None:
        """Set A (healthy phase) spread over all shoots but the hostile one; set B (unreachable phase) over the
        reachable ones."""
        args = self.args
        normal = self.normal_shoots()
        reachable = [s for s in normal if s.index not in self.unreachable]
        for target, count, pool, offset in (
            (self.samples_a, args.samples, normal, 0),
            (self.samples_b, args.unreachable_samples if args.unreachable else 0, reachable, 1),
        ):
            for n in range(count):
                shoot = pool[(n * len(pool)) // count] if count <= len(pool) else pool[n % len(pool)]
                rank = 0 if count <= len(pool) else n // len(pool)
                j = rank if offset == 0 else args.machines_per_shoot - 1 - rank
                target.append(
                    Sample(
                        index=len(target), machine=shoot.machine(j), node=shoot.machine(j), namespace=shoot.namespace
                    )
                )

    async def _shoot_api_basics(self) -> None:
        """Per shoot API server: the extension's ServiceAccount (cluster-admin: GRM's RBAC, see the docstring), the
        pods' namespaces; per shoot a token of that ServiceAccount (as GRM's token requestor gets it)."""
        namespace, name = SHOOT_SERVICE_ACCOUNT
        for raw in self.raw_shoots:
            await raw.create(
                f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name, "namespace": namespace}}
            )
            await raw.create(
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                {
                    "metadata": {"name": "bench:machine-preservation"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "cluster-admin",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
                },
            )
            for n in range(APP_NAMESPACES):
                await raw.create("/api/v1/namespaces", {"metadata": {"name": f"app-{n}"}})

        async def token(shoot: ShootSetup) -> None:
            answer = await self.raw_shoots[shoot.apiserver].request(
                "POST",
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                {"spec": {"audiences": [SHOOT_AUDIENCE], "expirationSeconds": 24 * 3600}},
            )
            shoot.token = answer["status"]["token"]

        await gather_limited(16, [lambda s=s: token(s) for s in self.shoots])  # type: ignore[misc]

    async def _seed_objects(self, shoot: ShootSetup) -> None:
        from machine_preservation.localcluster import gardener

        args, raw, ns = self.args, self.raw_seed, shoot.namespace
        await gardener.create_shoot_namespace(self.seed, ns)
        plane = self.apiservers[shoot.apiserver]
        server = gardener.out_of_cluster_api_server(ns)  # as gardenlet writes it: the extension uses only its CA
        kubeconfig = gardener.generic_token_kubeconfig_secret(ns, server=server, ca_pem=plane.ca.cert_pem)
        await raw.create(f"/api/v1/namespaces/{ns}/secrets", kubeconfig)
        workers = [
            gardener.worker(POOL, maximum=args.machines_per_shoot, machine_preserve_timeout=args.preserve_timeout)
        ]
        cluster = gardener.cluster_manifest(
            ns,
            shoot=gardener.shoot_manifest(ns, workers=workers),
            generic_kubeconfig_secret=kubeconfig["metadata"]["name"],
        )
        await raw.create(f"/apis/{gardener.EXTENSIONS_GROUP}/{gardener.EXTENSIONS_VERSION}/clusters", cluster)
        # What GRM's token requestor keeps in the shoot-access Secret: the token for the shoot.
        await raw.create(
            f"/api/v1/namespaces/{ns}/secrets",
            {
                "metadata": {"name": SHOOT_ACCESS_SECRET, "namespace": ns},
                "data": {"token": base64.b64encode(shoot.token.encode()).decode()},
            },
        )
        base = f"/apis/{GROUP}/{VERSION}/namespaces/{ns}"
        labels = {"name": POOL}
        deployment = await raw.create(
            f"{base}/machinedeployments",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "MachineDeployment",
                "metadata": {"name": POOL, "labels": {POOL_LABEL: POOL}},
                "spec": {
                    "replicas": args.machines_per_shoot,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"class": {"kind": "MachineClass", "name": POOL}},
                    },
                },
            },
        )
        machine_set = await raw.create(
            f"{base}/machinesets",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "MachineSet",
                "metadata": {
                    "name": f"{POOL}-z1",
                    "labels": {**labels, POOL_LABEL: POOL},
                    "ownerReferences": [_owner("MachineDeployment", deployment)],
                },
                "spec": {
                    "replicas": args.machines_per_shoot,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"class": {"kind": "MachineClass", "name": POOL}},
                    },
                },
            },
        )
        samples = {s.machine: tag for tag, group in (("a", self.samples_a), ("b", self.samples_b)) for s in group}
        for j in range(args.machines_per_shoot):
            name = shoot.machine(j)
            metadata: dict[str, Any] = {
                "name": name,
                "labels": {**labels, "node": name},
                "ownerReferences": [_owner("MachineSet", machine_set)],
            }
            if name in samples:
                metadata["labels"][SAMPLE_LABEL] = samples[name]
                metadata["annotations"] = {PRESERVE: "when-failed"}
            await raw.create(
                f"{base}/machines",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "Machine",
                    "metadata": metadata,
                    "spec": {"class": {"kind": "MachineClass", "name": POOL}, "providerID": f"fake:///{name}"},
                },
            )
            await raw.patch(
                f"{base}/machines/{name}/status",
                {"status": {"currentStatus": {"phase": "Running", "lastUpdateTime": rfc3339(dt.datetime.now(dt.UTC))}}},
            )
        await gardener.apply_extension(self.seed, ns)

    async def _nodes_and_pods(self) -> None:
        args = self.args
        samples = {s.node: tag for tag, group in (("a", self.samples_a), ("b", self.samples_b)) for s in group}
        jobs: list[Callable[[], Awaitable[None]]] = []
        for shoot in self.shoots:
            raw = self.raw_shoots[shoot.apiserver]
            for j in range(args.machines_per_shoot):
                node = shoot.machine(j)

                async def create_node(raw: RawKube = raw, node: str = node) -> None:
                    labels = {POOL_LABEL: POOL, "kubernetes.io/hostname": node, "kubernetes.io/os": "linux"}
                    if node in samples:
                        labels[SAMPLE_LABEL] = samples[node]
                    metadata = {"name": node, "labels": labels, "annotations": NODE_ANNOTATIONS}
                    await raw.create("/api/v1/nodes", {"metadata": metadata, "spec": {"providerID": f"fake:///{node}"}})
                    await raw.patch(f"/api/v1/nodes/{node}/status", node_status(node))

                jobs.append(create_node)
        await gather_limited(args.concurrency, jobs)
        jobs = []
        for shoot in self.shoots:
            raw = self.raw_shoots[shoot.apiserver]
            for j in range(args.machines_per_shoot):
                for namespace, pod in pods_of_node(shoot.machine(j), args.pods_per_node):

                    async def create_pod(raw: RawKube = raw, namespace: str = namespace, pod: Any = pod) -> None:
                        await raw.create(f"/api/v1/namespaces/{namespace}/pods", pod)

                    jobs.append(create_pod)
        await gather_limited(args.concurrency, jobs)

    async def _hostile_nodes(self) -> None:
        """The hostile shoot's big Nodes: ~`--hostile-node-bytes` of JSON each, in labels (500), annotations
        (200 kB, under the API server's 256 KiB), 8 True conditions with long messages and images."""
        args = self.args
        shoot = self.shoots[self.hostile_index]
        raw = self.raw_shoots[shoot.apiserver]
        labels = {f"owner.example.com/label-{k:03d}": "v" * 60 for k in range(500)}
        annotations = {f"owner.example.com/annotation-{k:02d}": "a" * 9_900 for k in range(20)}
        rest = max(args.hostile_node_bytes - 250_000, 0)
        message = "m" * (rest // 2 // 8)
        conditions = [
            {**ready_condition("True"), "type": f"OwnerCondition{k}", "reason": "Owner", "message": message}
            for k in range(8)
        ]
        image = {"names": [f"registry.example.com/owner/{'i' * 180}@sha256:{'0' * 64}"], "sizeBytes": 1}
        images = [image] * max(rest // 2 // 290, 1)
        sizes: list[int] = []

        async def create(k: int) -> None:
            name = f"{shoot.node_prefix}-hostile-{k:03d}"
            body = {"metadata": {"name": name, "labels": labels, "annotations": annotations}}
            await raw.create("/api/v1/nodes", body)
            status = {"status": {"conditions": [ready_condition("True"), *conditions], "images": images}}
            node = await raw.patch(f"/api/v1/nodes/{name}/status", status)
            sizes.append(len(json.dumps(node)))

        await gather_limited(4, [lambda k=k: create(k) for k in range(args.hostile_nodes)])  # type: ignore[misc]
        self.f["hostile_node_bytes"] = round(sum(sizes) / len(sizes))

    async def _hostile_report(self) -> None:
        """How the hostile shoot is reported: its condition, the extension's Warning Event, the gauge."""
        if not self.args.hostile_nodes:
            return
        assert self.reader is not None
        namespace = self.shoots[self.hostile_index].namespace
        condition = self.healthy((await self.extensions()).get(namespace, {}))
        flat = await self.reader.scrape()
        gauge = next(
            (
                value
                for key, value in flat.items()
                if key.startswith("machine_preservation_shoot_nodes_over_budget") and namespace in key
            ),
            None,
        )
        self.f["hostile"] = {
            "condition": f"{condition.get('status')} {condition.get('reason')}: {condition.get('message')}",
            "event": (await self.extension_warnings()).get(namespace),
            "over_budget_gauge": gauge,
        }
        log(f"HOSTILE SHOOT: {self.f['hostile']}")

    # --- GRM's part: ManagedResources applied ---------------------------------------------------------------------

    async def play_grm(self) -> None:
        done: set[str] = set()
        path = "/apis/resources.gardener.cloud/v1alpha1/managedresources"
        while True:
            listed = await self.raw_seed.request("GET", path)
            for item in listed.get("items") or []:
                metadata = item["metadata"]
                key = f"{metadata['namespace']}/{metadata['name']}"
                if key in done:
                    continue
                now = rfc3339(dt.datetime.now(dt.UTC))
                conditions = [
                    {
                        "type": kind,
                        "status": "True",
                        "reason": reason,
                        "message": "All resources are applied." if kind == "ResourcesApplied" else "All healthy.",
                        "lastTransitionTime": now,
                        "lastUpdateTime": now,
                    }
                    for kind, reason in (
                        ("ResourcesApplied", "ApplySucceeded"),
                        ("ResourcesHealthy", "ResourcesHealthy"),
                    )
                ]
                await self.raw_seed.patch(
                    f"/apis/resources.gardener.cloud/v1alpha1/namespaces/{metadata['namespace']}/managedresources/"
                    f"{metadata['name']}/status",
                    {"status": {"conditions": conditions, "observedGeneration": metadata.get("generation", 1)}},
                )
                done.add(key)
            await asyncio.sleep(1.0)

    # --- the Extensions ---------------------------------------------------------------------------------------------

    async def extensions(self) -> dict[str, dict[str, Any]]:
        listed = await self.raw_seed.request("GET", "/apis/extensions.gardener.cloud/v1alpha1/extensions")
        return {item["metadata"]["namespace"]: item for item in listed.get("items") or []}

    async def extension_warnings(self) -> dict[str, str]:
        """Per shoot namespace, the extension's latest Warning Event on its Extension (reason: message)."""
        listed = await self.raw_seed.request("GET", "/api/v1/events?fieldSelector=involvedObject.kind%3DExtension")
        return {
            item["metadata"]["namespace"]: f"{item.get('reason')}: {item.get('message')}"
            for item in listed.get("items") or []
            if item.get("type") == "Warning"
        }

    @staticmethod
    def healthy(extension: dict[str, Any]) -> dict[str, Any]:
        conditions = (extension.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == CONTROL_PLANE_HEALTHY), {})

    # --- the run ------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        from machine_preservation.localcluster import gardener
        from machine_preservation.localcluster.gardener_landscape import installation

        args, f = self.args, self.f
        await self.setup()
        grm = asyncio.create_task(self.play_grm())
        self.stack.push_async_callback(_cancel, grm)
        await asyncio.sleep(2)
        load_before = os.getloadavg()
        f["load_before_cold_start"] = load_before
        # The extension imports the product when it starts: that is the version measured (the tree may change).
        f["product_version"] = product_version()
        install = await self.stack.enter_async_context(
            installation(
                self.plane,
                self.seed,
                self.toolchain,
                self.directory / "installation",
                extra_extension_args=["--mcm-native-preservation=false"],
            )
        )
        self.install = install
        self.pid = install.extension.pid
        t0 = proc_started_monotonic(self.pid)
        self.t0 = t0
        reader = self.reader = MetricsReader(install.metrics_port)
        self.stack.push_async_callback(reader.close)
        while True:
            if await reader.ready():
                break
            await asyncio.sleep(0.05)
        f["cold_readyz_s"] = round(time.monotonic() - t0, 2)

        # 1. cold start
        ready_at: float | None = None
        served_at: float | None = None
        deadline = time.monotonic() + args.cold_start_limit
        wanted = {s.namespace for s in self.normal_shoots()}
        while served_at is None:
            found = await self.extensions()
            if ready_at is None and all(ns in found and gardener.extension_ready(found[ns]) is None for ns in wanted):
                ready_at = time.monotonic()
            if ready_at is not None and all(self.healthy(found[ns]).get("status") == "True" for ns in wanted):
                served_at = time.monotonic()
            if time.monotonic() > deadline:
                not_served = sorted(ns for ns in wanted if self.healthy(found.get(ns, {})).get("status") != "True")
                reason = {ns: self.healthy(found.get(ns, {})).get("message") for ns in not_served[:3]}
                raise RuntimeError(f"{len(not_served)} shoots not served in time, e.g. {reason}")
            await asyncio.sleep(0.25)
        assert ready_at is not None
        f["cold_extensions_ready_s"] = round(ready_at - t0, 2)
        f["cold_served_s"] = round(served_at - t0, 2)
        full_at, how = await self._first_full_reconcile(deadline)
        f["cold_full_s"] = round(full_at - t0, 2)
        f["cold_full_by"] = how
        f["cold_cpu_s"] = round(proc_cpu_seconds(self.pid), 2)
        f["rss_after_cold_start"] = proc_memory(self.pid)
        flat = await reader.scrape()
        f["cold_writes"], f["cold_writes_by"] = writes(flat)
        f["cold_requests_by"] = requests_by(flat)
        log(
            f"COLD START: /readyz {f['cold_readyz_s']} s; every Extension ready {f['cold_extensions_ready_s']} s; "
            f"every shoot served (ControlPlaneHealthy True) {f['cold_served_s']} s; first full reconcile "
            f"{f['cold_full_s']} s ({how}); CPU {f['cold_cpu_s']} s; RSS {f['rss_after_cold_start']}; "
            f"writes {f['cold_writes']:.0f}; load before {load_before}"
        )

        # 2./3. samples
        watcher = asyncio.create_task(self._watch_samples(self.samples_a + self.samples_b))
        self.stack.push_async_callback(_cancel, watcher)
        await asyncio.sleep(2)
        await self._run_samples(self.samples_a, "healthy")
        if args.floor:
            await self._floor(self.samples_a)

        # 4. steady state (ending after the shoots' first resync)
        window_start = time.monotonic()
        if not args.no_resync_window:
            end_target = served_at + PRODUCT_RESYNC_SECONDS + 60
            window_start = max(window_start, end_target - args.steady_seconds)
            if window_start > time.monotonic():
                log(f"waiting {window_start - time.monotonic():.0f} s so that the window holds the first resync")
                await asyncio.sleep(window_start - time.monotonic())
        await self._steady("steady", args.steady_seconds, resync_at=served_at + PRODUCT_RESYNC_SECONDS)
        f["rss_end_healthy"] = proc_memory(self.pid)
        log(f"RSS after the healthy phases: {f['rss_end_healthy']} MiB")

        # 6. unreachable shoots
        if self.unreachable:
            await self._unreachable_phase()
        await self._hostile_report()
        try:  # the process the run started still runs (a local process: nothing would restart it)
            f["extension_lived_through"] = abs(proc_started_monotonic(self.pid) - self.t0) < 1.0
        except FileNotFoundError:
            f["extension_lived_through"] = False
        f["rss_end"] = proc_memory(self.pid)
        f["apiserver_rss_mib"] = self.plane_memory()
        f["extension_log"] = _log_summary(install.logs / "extension.log")

    async def _first_full_reconcile(self, deadline: float) -> tuple[float, str]:
        """The first moment after every shoot is served with the queues empty: by the reconcile counters when the
        process reports them, else by its CPU (< 5 % of a core over 1 s).

        An over-budget hostile shoot is never served: its Machines and its MachineSet stay in its queues (the
        queue gauges sum every shoot's), and its Nodes are listed again every so often, so the process is never
        quiet for long. Its keys are allowed for, and its Machines are not counted."""
        assert self.reader is not None
        machines = len(self.normal_shoots()) * self.args.machines_per_shoot
        unserved_keys = self.args.machines_per_shoot + 1 if self.args.hostile_nodes else 0
        previous_cpu, previous_at = proc_cpu_seconds(self.pid), time.monotonic()
        done = depth = 0.0
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            flat = await self.reader.scrape()
            done = total(flat, "machine_preservation_reconcile_duration_seconds_count", controller="machines")
            # As controller_scale.py: the Machine and MachineSet queues (the MachineDeployment queue may hold
            # delayed keys; its depth is recorded).
            depth = total(flat, "machine_preservation_queue_depth", queue="machines") + total(
                flat, "machine_preservation_queue_depth", queue="machinesets"
            )
            self.f["cold_queue_depths"] = {
                key: value for key, value in flat.items() if key.startswith("machine_preservation_queue_depth")
            }
            cpu, now = proc_cpu_seconds(self.pid), time.monotonic()
            if done >= machines and depth <= unserved_keys:
                held = f" but the hostile shoot's {depth:.0f} keys" if depth else ""
                return now - 1.0, f"{done:.0f} Machine reconciles counted, queues empty{held}"
            if done == 0 and (cpu - previous_cpu) / (now - previous_at) < 0.05:
                return previous_at, "CPU < 5 % of a core for 1 s"
            previous_cpu, previous_at = cpu, now
        raise RuntimeError(
            f"no quiet second after the cold start in time ({done:.0f} of {machines} Machine reconciles counted, "
            f"{depth:.0f} keys queued)"
        )

    async def _watch_samples(self, samples: list[Sample]) -> None:
        from kubernetes.aio import client

        recorder = SampleRecorder(samples)
        custom = client.CustomObjectsApi(self.seed)
        loops = [
            watch_raw(
                custom.list_cluster_custom_object, (GROUP, VERSION, "machines"), recorder.on_machine, self.stop_watch
            )
        ]
        loops += [
            watch_raw(client.CoreV1Api(api).list_node, (), recorder.on_node, self.stop_watch)
            for api in self.shoot_clients
        ]
        await asyncio.gather(*loops)

    async def _run_samples(self, samples: list[Sample], phase: str) -> None:
        assert self.reader is not None
        args, f = self.args, self.f
        if not samples:
            return
        before = await self.reader.scrape()
        cpu_before = proc_cpu_seconds(self.pid)
        machine_before = cpu_by_process(self.process_names())
        machine_started = time.monotonic()
        loads: list[float] = []
        with LoopLagProbe() as probe:
            for sample in samples:
                shoot = next(s for s in self.shoots if s.namespace == sample.namespace)
                raw = self.raw_shoots[shoot.apiserver]
                await raw.patch(
                    f"/api/v1/nodes/{sample.node}/status", {"status": {"conditions": [ready_condition("Unknown")]}}
                )
                sample.failed_at = time.time()
                await self.raw_seed.patch(
                    f"/apis/{GROUP}/{VERSION}/namespaces/{sample.namespace}/machines/{sample.machine}/status",
                    {
                        "status": {
                            "currentStatus": {"phase": "Failed", "lastUpdateTime": rfc3339(dt.datetime.now(dt.UTC))}
                        }
                    },
                )
                loads.append(os.getloadavg()[0])
                await asyncio.sleep(args.fail_interval)
            deadline = time.monotonic() + args.sample_limit
            while time.monotonic() < deadline:
                if all(s.stopped_at is not None for s in samples):
                    break
                await asyncio.sleep(0.5)
        protected = [s.protected_at - s.failed_at for s in samples if s.protected_at is not None]
        preserved = [s.preserved_at - s.failed_at for s in samples if s.preserved_at is not None]
        lags = [s.stopped_at - s.expiry for s in samples if s.stopped_at is not None and s.expiry is not None]
        after = await self.reader.scrape()
        sample_writes = writes(after)[0] - writes(before)[0]
        f[f"{phase}_protected"] = protected
        f[f"{phase}_preserved"] = preserved
        f[f"{phase}_expiry_lag"] = lags
        f[f"{phase}_sample_load"] = (min(loads), max(loads))
        f[f"{phase}_writes_per_sample"] = round(sample_writes / len(samples), 1)
        f[f"{phase}_sample_cpu_s"] = round(proc_cpu_seconds(self.pid) - cpu_before, 2)
        f[f"{phase}_loop_lag"] = loop_lag(after, before)
        f[f"{phase}_script_loop_lag"] = probe.summary()
        f[f"{phase}_cpu_states"] = probe.states
        f[f"{phase}_script_late"] = probe.late
        f[f"{phase}_failed_at"] = [round(s.failed_at, 1) for s in samples]  # to place slow samples in the above
        busiest = sorted(probe.states, key=lambda i: -(i[1]["steal"] + i[1]["iowait"]))[:3]
        # Who else used the 2 cores meanwhile: the tail of the samples is the API servers' latency under load.
        machine_after, elapsed = cpu_by_process(self.process_names()), time.monotonic() - machine_started
        used = cpu_used_by_name(machine_before, machine_after)
        f[f"{phase}_machine_cores"] = {
            name: round(cpu / elapsed, 3)
            for name, cpu in sorted(used.items(), key=lambda i: -i[1])
            if cpu >= 0.01 * elapsed
        }
        f[f"{phase}_not_preserved"] = [s.key for s in samples if s.preserved_at is None]
        f[f"{phase}_not_stopped"] = [s.key for s in samples if s.stopped_at is None]
        log(f"[{phase}] FAILED -> PROTECTED (record, CA annotation, taint): {summary(protected)}")
        log(
            f"[{phase}] FAILED -> FULLY PRESERVED (drained): {summary(preserved)}; missing "
            f"{f[f'{phase}_not_preserved']}"
        )
        log(f"[{phase}] EXPIRY LAG: {summary(lags)}; not stopped {f[f'{phase}_not_stopped']}")
        log(
            f"[{phase}] writes per sample {f[f'{phase}_writes_per_sample']}, CPU in the sample phase "
            f"{f[f'{phase}_sample_cpu_s']} s; the extension's event loop late (samples every 0.1 s): "
            f"{f[f'{phase}_loop_lag']}"
        )
        log(
            f"[{phase}] cores used in the sample phase, by process: {f[f'{phase}_machine_cores']}; this script's "
            f"event loop late: {f[f'{phase}_script_loop_lag']}; the seconds with the most steal + iowait: {busiest}"
        )
        f[f"rss_after_{phase}_samples"] = proc_memory(self.pid)
        log(f"[{phase}] RSS after the samples: {f[f'rss_after_{phase}_samples']} MiB")

    def process_names(self) -> dict[int, str]:
        names = {os.getpid(): "benchmark script", self.pid: "extension"}
        if self.install is not None:
            names[self.install.webhook.pid] = "webhook"
            names[self.install.seed_webhook.pid] = "seed webhook"
        return names

    async def _floor(self, samples: list[Sample]) -> None:
        """The requests of a preservation in its fastest order, sent by this script on warm connections and timed on
        its clock, for another machine of each sample's shoot at the samples' pace: what the API servers alone take,
        under the same load, for what the product must write before a sample counts as fully preserved. The writes
        touch nothing the product acts on (an annotation, a taint and a condition of this script's own)."""

        async def preserve(shoot: ShootSetup) -> float:
            raw, node = self.raw_shoots[shoot.apiserver], shoot.machine(1)
            started = time.time()
            await self.raw_seed.patch(
                f"/apis/{GROUP}/{VERSION}/namespaces/{shoot.namespace}/machines/{node}",
                {"metadata": {"annotations": {FLOOR_KEY: str(started)}}},
            )
            await raw.patch(
                f"/api/v1/nodes/{node}",
                {"metadata": {"annotations": {FLOOR_KEY: str(started)}}, "spec": {"taints": [FLOOR_TAINT]}},
            )
            await asyncio.gather(
                *(
                    raw.create(
                        f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/eviction",
                        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod["metadata"]["name"]}},
                    )
                    for ns, pod in pods_of_node(node, self.args.pods_per_node)
                    if ns != "kube-system"  # DaemonSet pods stay
                )
            )
            await raw.request(
                "PATCH",
                f"/api/v1/nodes/{node}/status",
                {"status": {"conditions": [FLOOR_CONDITION]}},
                content_type="application/strategic-merge-patch+json",
            )
            return time.time() - started

        tasks = []
        for sample in samples:
            shoot = next(s for s in self.shoots if s.namespace == sample.namespace)
            tasks.append(asyncio.create_task(preserve(shoot)))
            await asyncio.sleep(self.args.fail_interval)
        times = list(await asyncio.gather(*tasks))
        self.f["healthy_floor"] = times
        log(f"[healthy] FLOOR (the same requests from this script, warm connections): {summary(times)}")

    async def _steady(self, phase: str, seconds: float, *, resync_at: float | None) -> None:
        assert self.reader is not None
        f = self.f
        # Settle: a 5 s stretch without writes.
        previous = -1.0
        settle_deadline = time.monotonic() + 60
        while time.monotonic() < settle_deadline:
            await asyncio.sleep(5)
            now_writes = object_writes(await self.reader.scrape())[0]
            if now_writes == previous:
                break
            previous = now_writes
        first = await self.reader.scrape()
        started = time.monotonic()
        cpu_start = proc_cpu_seconds(self.pid)
        timeline: list[tuple[float, float]] = []  # (seconds into the window, CPU seconds in the last 5 s)
        probes: list[float] = []
        loads: list[float] = []
        log(
            f"[{phase}] {seconds:.0f} s window starts"
            + (f" (resync due in {resync_at - started:.0f} s)" if resync_at else "")
        )
        last_cpu, last_at = cpu_start, started
        while time.monotonic() - started < seconds:
            await asyncio.sleep(max(0.0, 5.0 - (time.monotonic() - last_at)))
            with contextlib.suppress(Exception):
                probes.append(await self.reader.healthz_seconds())
            now, cpu = time.monotonic(), proc_cpu_seconds(self.pid)
            timeline.append((round(now - started, 1), round(cpu - last_cpu, 3)))
            last_cpu, last_at = cpu, now
            loads.append(os.getloadavg()[0])
        last = await self.reader.scrape()
        elapsed = time.monotonic() - started
        total_cpu = proc_cpu_seconds(self.pid) - cpu_start
        window_writes = object_writes(last)[0] - object_writes(first)[0]
        by = delta(writes(last)[1], writes(first)[1])
        f[f"{phase}_seconds"] = round(elapsed, 1)
        f[f"{phase}_writes"] = window_writes  # without Lease renewals
        f[f"{phase}_writes_by"] = by  # with them
        f[f"{phase}_requests_by"] = delta(requests_by(last), requests_by(first))
        f[f"{phase}_cpu_s"] = round(total_cpu, 2)
        f[f"{phase}_cpu_share"] = round(total_cpu / elapsed, 4)
        f[f"{phase}_healthz_max_s"] = round(max(probes), 3) if probes else None
        f[f"{phase}_load"] = (min(loads), max(loads)) if loads else None
        f[f"{phase}_cpu_timeline"] = timeline
        resync_note = ""
        if resync_at is not None:
            offset = resync_at - started
            values = sorted(c for _, c in timeline)
            baseline = values[len(values) // 4] if values else 0.0  # lower quartile of 5 s buckets
            near = [c for t, c in timeline if offset - 10 <= t <= offset + 120]
            burst = sum(max(c - baseline, 0.0) for c in near)
            f[f"{phase}_resync_in_window"] = 0 <= offset <= elapsed
            f[f"{phase}_resync_cpu_s"] = round(burst, 2)
            f[f"{phase}_resync_peak_share"] = round(max(near, default=0.0) / 5.0, 3)
            f[f"{phase}_resync_core_share"] = round(burst / PRODUCT_RESYNC_SECONDS, 4)
            resync_note = (
                f"; resync (due at +{offset:.0f} s, in window: {f[f'{phase}_resync_in_window']}): "
                f"{burst:.2f} CPU-s above the baseline of {baseline / 5:.3f} cores, peak 5 s bucket "
                f"{f[f'{phase}_resync_peak_share']:.3f} cores, {f[f'{phase}_resync_core_share']:.4f}"
                f" of a core over the {PRODUCT_RESYNC_SECONDS:.0f} s period"
            )
        log(
            f"[{phase}] {window_writes:.0f} API writes other than Leases in {elapsed:.0f} s (all: {by or ''}); CPU "
            f"{total_cpu:.2f} s "
            f"({f[f'{phase}_cpu_share']:.4f} cores), /healthz max {f[f'{phase}_healthz_max_s']} s{resync_note}"
        )

    async def _unreachable_phase(self) -> None:
        args, f = self.args, self.f
        lost = [s for s in self.shoots if s.proxy is not None]
        mode = args.unreachable_mode
        f["unreachable_shoots"] = [s.namespace for s in lost]
        switched = time.monotonic()
        for shoot in lost:
            assert shoot.proxy is not None
            await shoot.proxy.set_mode(mode, args.slow_seconds)
        log(f"[unreachable] {len(lost)} shoots {mode} ({', '.join(s.namespace for s in lost)})")
        reported: dict[str, float] = {}
        messages: dict[str, str] = {}
        deadline = switched + args.report_limit
        while len(reported) < len(lost) and time.monotonic() < deadline:
            found = await self.extensions()
            told = await self.extension_warnings()
            for shoot in lost:
                # Down: ControlPlaneHealthy leaves True (Progressing, gardenlet's APIServerAvailable tells the rest);
                # slow: it stays True, the extension says it with a Warning Event on the Extension (and a gauge).
                condition = self.healthy(found.get(shoot.namespace, {}))
                event = told.get(shoot.namespace)
                if shoot.namespace in reported:
                    continue
                if condition.get("status") not in (None, "True"):
                    reported[shoot.namespace] = time.monotonic() - switched
                    messages[shoot.namespace] = f"{condition.get('status')}: {condition.get('message')}"
                elif event is not None:
                    reported[shoot.namespace] = time.monotonic() - switched
                    messages[shoot.namespace] = event
            await asyncio.sleep(1.0)
        f["unreachable_reported_s"] = sorted(round(v, 1) for v in reported.values())
        f["unreachable_not_reported"] = [s.namespace for s in lost if s.namespace not in reported]
        f["unreachable_messages"] = sorted(set(messages.values()))
        log(
            f"[unreachable] reported (condition not True, or a Warning Event) on {len(reported)}/{len(lost)} after "
            f"{f['unreachable_reported_s']} s; messages {f['unreachable_messages']}; "
            f"not reported: {f['unreachable_not_reported']}"
        )
        await self._run_samples(self.samples_b, "unreachable")
        await self._steady("unreachable_steady", args.unreachable_steady_seconds, resync_at=None)
        found = await self.extensions()
        others = [s for s in self.shoots if s.proxy is None]
        f["unreachable_others_served"] = sum(
            1 for s in others if self.healthy(found.get(s.namespace, {})).get("status") == "True"
        )
        f["unreachable_others"] = len(others)
        log(f"[unreachable] reachable shoots still served: {f['unreachable_others_served']}/{len(others)}")
        # Back: how long until they are served again.
        back = time.monotonic()
        for shoot in lost:
            assert shoot.proxy is not None
            await shoot.proxy.set_mode("pass")
        recovered: list[float] = []
        pending = {s.namespace for s in lost}
        while pending and time.monotonic() < back + args.report_limit:
            found = await self.extensions()
            for ns in list(pending):
                if self.healthy(found.get(ns, {})).get("status") == "True":
                    pending.discard(ns)
                    recovered.append(round(time.monotonic() - back, 1))
            await asyncio.sleep(1.0)
        f["unreachable_recovered_s"] = sorted(recovered)
        f["unreachable_not_recovered"] = sorted(pending)
        log(f"[unreachable] served again after {sorted(recovered)} s; not yet: {sorted(pending)}")

    def plane_memory(self) -> dict[str, float]:
        """RSS of etcd, the seed's and the shoots' kube-apiservers (MiB), from the planes' state files."""
        result: dict[str, float] = {}
        for name, plane in (("seed", self.plane), *((f"api{k:02d}", p) for k, p in enumerate(self.apiservers))):
            with contextlib.suppress(OSError, ValueError, KeyError):
                state = json.loads((plane.directory / "state.json").read_text())
                for process, entry in state["processes"].items():
                    rss = proc_memory(int(entry["pid"])).get("VmRSS")
                    if rss is not None:
                        key = "etcd" if process == "etcd" else ("seed" if name == "seed" else "shoot_apiservers")
                        if process == "kube-apiserver" or process == "etcd":
                            result[key] = round(result.get(key, 0.0) + rss, 1)
        return result

    def skew(self) -> dict[str, Any]:
        """What each shoot's watches see versus its own objects: API servers are shared."""
        args = self.args
        per_server = [sum(1 for s in self.shoots if s.apiserver == k) for k in range(args.shoot_apiservers)]
        nodes_seen = sum(k * k * args.machines_per_shoot for k in per_server)
        real = args.shoots * args.machines_per_shoot
        return {
            "shoots_per_apiserver": sorted(set(per_server)),
            "nodes_seen_by_all_node_watches": nodes_seen,
            "nodes_real": real,
            "pods_seen_if_all_pods_watched": nodes_seen * args.pods_per_node,
            "pods_real": real * args.pods_per_node,
        }

    async def close(self) -> None:
        self.stop_watch.set()
        await self.stack.aclose()
        if not self.args.keep and not self.args.workdir:
            shutil.rmtree(self.directory, ignore_errors=True)
        else:
            log(f"kept {self.directory}")


def object_writes(flat: dict[str, float]) -> tuple[float, dict[str, float]]:
    """Writes other than to Leases: leader election renews its Lease every 2 s and the heartbeat Lease gardenlet
    reads is renewed every 30 s; both are the contract, not work on objects."""
    by = {k: v for k, v in writes(flat)[1].items() if " leases " not in k}
    return sum(by.values()), by


def _owner(kind: str, created: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "name": created["metadata"]["name"],
        "uid": created["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


def _log_summary(path: Path) -> dict[str, Any]:
    """Counts of the extension log's levels and the most frequent WARNING/ERROR messages (shoot names cut)."""
    import collections
    import re

    counts: collections.Counter[str] = collections.Counter()
    messages: collections.Counter[str] = collections.Counter()
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            for level in ("WARNING", "ERROR", "Traceback"):
                if level in line:
                    counts[level] += 1
                    text = re.sub(r"shoot--b--s\d+", "<shoot>", line.split(level, 1)[1])
                    text = re.sub(r"s\d{3}-\d{3}|\d+(\.\d+)?", "#", text)
                    messages[text.strip()[:160]] += 1
            if "INFO" in line:
                counts["INFO"] += 1
    return {"counts": dict(counts), "top": messages.most_common(8)}


def machine_load() -> dict[str, Any]:
    """The machine while it runs: CPUs, memory, load, and the heaviest processes (other tests?)."""
    result = subprocess.run(
        ["ps", "-eo", "pid,pcpu,rss,etimes,args", "--sort=-pcpu"], capture_output=True, text=True, check=False
    )
    top = [line[:160] for line in result.stdout.splitlines()[1:8]]
    others = [line for line in result.stdout.splitlines() if "pytest" in line and "seed_scale" not in line]
    return {"cpus": os.cpu_count(), "load": os.getloadavg(), "top": top, "pytest_processes": len(others)}


def report(args: argparse.Namespace, bench: Bench | None, figures: Figures) -> None:
    f = figures.values
    print("\n=== seed scale benchmark ===", flush=True)
    print(
        f"{args.shoots} shoots x {args.machines_per_shoot} machines ({args.shoots * args.machines_per_shoot} Machines "
        f"and Nodes), {args.pods_per_node} pods per node, {args.shoot_apiservers} shoot API servers, product "
        f"{f.get('product_version')}, {os.cpu_count()} CPUs"
    )
    if bench is not None:
        f["skew"] = bench.skew()
        print(f"skew (shared API servers): {f['skew']}")
    print(
        f"setup: planes {f.get('setup_planes_s')} s, seed objects {f.get('setup_seed_objects_s')} s, Nodes and pods "
        f"{f.get('setup_nodes_pods_s')} s"
    )

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    if "cold_full_s" in f:
        print(
            f"1. cold start: /readyz {f['cold_readyz_s']} s, Extensions ready {f['cold_extensions_ready_s']} s, all "
            f"served {f['cold_served_s']} s, first full reconcile {f['cold_full_s']} s ({f['cold_full_by']}); CPU "
            f"{f['cold_cpu_s']} s; target <= {TARGETS['cold_s']:.0f} s: "
            f"{verdict(f['cold_full_s'] <= TARGETS['cold_s'])}"
        )
    for phase in ("healthy", "unreachable"):
        if f"{phase}_preserved" not in f:
            continue
        protected, preserved, lags = f[f"{phase}_protected"], f[f"{phase}_preserved"], f[f"{phase}_expiry_lag"]
        p99 = percentile(preserved, 99) if preserved else math.inf
        lag99 = percentile(lags, 99) if lags else math.inf
        print(f"2. [{phase}] Failed -> protected (before the drain): {summary(protected)}")
        print(
            f"   [{phase}] Failed -> fully preserved (drained): {summary(preserved)}; p99 <= 0.3 s: "
            f"{verdict(p99 <= 0.3)}"
        )
        print(f"3. [{phase}] expiry lag: {summary(lags)}; p99 <= 0.3 s: {verdict(lag99 <= 0.3)}")
    if "steady_writes" in f:
        print(
            f"4. steady state: {f['steady_writes']:.0f} writes other than Leases in {f['steady_seconds']} s "
            f"(all writes: {f['steady_writes_by'] or ''}); "
            f"target 0: {verdict(f['steady_writes'] == 0)}; CPU {f['steady_cpu_s']} s ({f['steady_cpu_share']} cores); "
            f"resync: {f.get('steady_resync_cpu_s')} CPU-s (in window: {f.get('steady_resync_in_window')}), peak "
            f"{f.get('steady_resync_peak_share')} cores per 5 s, {f.get('steady_resync_core_share')} of a core over "
            f"600 s; /healthz max {f.get('steady_healthz_max_s')} s"
        )
    rss = f.get("rss_end") or {}
    if rss:
        peak = rss.get("VmHWM", 0.0)
        print(
            f"5. extension memory: VmHWM {peak:.1f} MiB, VmRSS {rss.get('VmRSS', 0.0):.1f} MiB (after cold start "
            f"{f.get('rss_after_cold_start')}); target <= 400 MiB: {verdict(peak <= TARGETS['rss_mib'])}"
        )
    if "unreachable_reported_s" in f:
        print(
            f"6. unreachable ({args.unreachable_mode}): reported on "
            f"{len(f['unreachable_reported_s'])}/{args.unreachable} after {f['unreachable_reported_s']} s "
            f"{f['unreachable_messages']}; others served "
            f"{f.get('unreachable_others_served')}/{f.get('unreachable_others')}; "
            f"writes in the window {f.get('unreachable_steady_writes_by')}; CPU "
            f"{f.get('unreachable_steady_cpu_share')} cores; served again after {f.get('unreachable_recovered_s')} s"
        )
    if "hostile" in f:
        print(
            f"7. hostile shoot ({args.hostile_nodes} Nodes of {f.get('hostile_node_bytes')} bytes): "
            f"{f['hostile']}; the extension process lived through the run: {f.get('extension_lived_through')}"
        )
    print(f"extension log: {f.get('extension_log')}")
    print(f"machine: {f.get('machine_before')} / during {f.get('machine_during')}")
    for note in figures.notes:
        print(f"note: {note}")
    print("json: " + json.dumps(f, default=str), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shoots", type=int, default=200)
    parser.add_argument("--machines-per-shoot", type=int, default=20)
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--shoot-apiservers", type=int, default=0, help="default: one per 10 shoots")
    parser.add_argument("--samples", type=int, default=60, help="failures in the healthy phase, spread over shoots")
    parser.add_argument(
        "--floor", action="store_true", help="after the healthy samples, time their requests sent by this script"
    )
    parser.add_argument("--unreachable-samples", type=int, default=30, help="failures on reachable shoots meanwhile")
    parser.add_argument("--fail-interval", type=float, default=0.5, help="seconds between two failures")
    parser.add_argument("--preserve-timeout", default="15s", help="the pool's machinePreserveTimeout (in the Shoot)")
    parser.add_argument("--steady-seconds", type=float, default=300.0)
    parser.add_argument("--no-resync-window", action="store_true", help="start the steady window at once")
    parser.add_argument("--unreachable", type=int, default=0, help="shoots made unreachable after the healthy phases")
    parser.add_argument("--unreachable-mode", choices=("down", "slow"), default="down")
    parser.add_argument("--slow-seconds", type=float, default=5.0, help="delay of the slow mode")
    parser.add_argument("--unreachable-steady-seconds", type=float, default=120.0)
    parser.add_argument("--report-limit", type=float, default=180.0, help="wait for the conditions to turn")
    parser.add_argument("--hostile-nodes", type=int, default=0, help="big Nodes in the last shoot (own API server)")
    parser.add_argument("--hostile-node-bytes", type=int, default=1_300_000, help="JSON bytes of each of them")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight while creating objects")
    parser.add_argument("--cold-start-limit", type=float, default=600.0)
    parser.add_argument("--sample-limit", type=float, default=120.0, help="wait for the samples after the last fail")
    parser.add_argument("--time-limit", type=float, default=3600.0, help="the whole run, in seconds")
    parser.add_argument("--workdir", type=Path, help="keep everything in this directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    parser.add_argument(
        "--quick", action="store_true", help="a small smoke run (4 shoots, 1 unreachable, short windows)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.shoots, args.machines_per_shoot, args.pods_per_node = 4, 5, 3
        args.shoot_apiservers = args.shoot_apiservers or 2
        args.samples, args.unreachable_samples, args.unreachable = 4, 2, 1
        args.steady_seconds, args.unreachable_steady_seconds, args.no_resync_window = 20.0, 15.0, True
    args.shoot_apiservers = args.shoot_apiservers or max(1, math.ceil(args.shoots / 10))
    if args.machines_per_shoot < 2:
        parser.error("--machines-per-shoot must be at least 2")
    return args


def product_version() -> str:
    repository = Path(__file__).resolve().parents[1]
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=repository, capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "controller", "core"],
        cwd=repository,
        capture_output=True,
        text=True,
        check=False,
    )
    if not dirty.stdout.strip():
        return head.stdout.strip()
    # Another engineer may be changing the product meanwhile: name the uncommitted state by its diff's hash.
    diff = subprocess.run(
        ["git", "diff", "HEAD", "--", "controller", "core"], cwd=repository, capture_output=True, check=False
    )
    untracked = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard", "controller", "core"],
        cwd=repository,
        capture_output=True,
        check=False,
    )
    content = diff.stdout + b"".join(
        (repository / name).read_bytes() for name in untracked.stdout.decode().split() if (repository / name).is_file()
    )
    digest = hashlib.sha256(content).hexdigest()[:10]
    return f"{head.stdout.strip()} + uncommitted controller/core changes (diff sha256 {digest})"


# --- how cost grows: a least-squares fit over several runs ------------------------------------------------------

FIT_FIGURES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "peak RSS (MiB)": lambda f: (f.get("rss_end_healthy") or f.get("rss_end") or {}).get("VmHWM"),
    "RSS after cold start (MiB)": lambda f: (f.get("rss_after_cold_start") or {}).get("VmRSS"),
    "cold start to first full reconcile (s)": lambda f: f.get("cold_full_s"),
    "CPU up to the first full reconcile (s)": lambda f: f.get("cold_cpu_s"),
    "steady CPU (cores)": lambda f: f.get("steady_cpu_share"),
    "resync CPU above baseline (CPU-s)": lambda f: f.get("steady_resync_cpu_s"),
}


def run_terms(f: dict[str, Any]) -> dict[str, float]:
    """A run's sizes: shoots, Machines, and the Nodes all shoots' node watches see (shared API servers)."""
    args = f["args"]
    shoots, per_shoot, servers = args["shoots"], args["machines_per_shoot"], args["shoot_apiservers"]
    per_server = [len(range(k, shoots, servers)) for k in range(servers)]
    return {
        "shoots": float(shoots),
        "machines": float(shoots * per_shoot),
        "nodes_seen": float(sum(n * n * per_shoot for n in per_server)),
    }


def least_squares(rows: list[list[float]], ys: list[float]) -> list[float] | None:
    """Solve the normal equations (tiny systems; no numpy here); None if the columns are not independent."""
    n = len(rows[0])
    a = [
        [sum(r[i] * r[j] for r in rows) for j in range(n)] + [sum(r[i] * y for r, y in zip(rows, ys, strict=True))]
        for i in range(n)
    ]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-9 * max(1.0, max(abs(x) for x in a[col][:n])):
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def fit(paths: list[Path], terms: list[str]) -> int:
    runs = []
    for path in paths:
        lines = [line for line in path.read_text().splitlines() if line.startswith("json: ")]
        if not lines:
            print(f"{path}: no json line (the run did not finish)")
            continue
        figures = json.loads(lines[-1][len("json: ") :])
        if "args" not in figures:  # runs before the arguments were recorded: read them from the report's header
            import re

            match = re.search(r"(\d+) shoots x (\d+) machines .*?(\d+) shoot API servers", path.read_text())
            if match is None:
                print(f"{path}: sizes unknown")
                continue
            shoots, per_shoot, servers = (int(g) for g in match.groups())
            figures["args"] = {"shoots": shoots, "machines_per_shoot": per_shoot, "shoot_apiservers": servers}
        runs.append((path.name, figures))
    print(f"runs: {', '.join(f'{name} {run_terms(f)}' for name, f in runs)}")
    print(f"model: figure = constant + {' + '.join(f'k_{t} * {t}' for t in terms)}")
    for figure, read in FIT_FIGURES.items():
        points = [(run_terms(f), read(f)) for _, f in runs]
        points = [(t, y) for t, y in points if y is not None]
        if len(points) < len(terms) + 1:
            print(f"{figure}: too few runs ({len(points)})")
            continue
        rows = [[1.0, *(t[name] for name in terms)] for t, _ in points]
        ys = [float(y) for _, y in points]
        solution = least_squares(rows, ys)
        if solution is None:
            print(f"{figure}: the runs do not separate {terms} (vary them independently)")
            continue
        residual = max(
            abs(sum(c * x for c, x in zip(solution, row, strict=True)) - y) for row, y in zip(rows, ys, strict=True)
        )
        parts = ", ".join(f"{value:.5g} per {name}" for name, value in zip(terms, solution[1:], strict=True))
        print(f"{figure}: constant {solution[0]:.4g}, {parts} (largest residual {residual:.3g}; points {ys})")
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--fit":
        parser = argparse.ArgumentParser(prog="seed_scale.py --fit", description="fit cost over runs' outputs")
        parser.add_argument("--fit", nargs="+", type=Path, required=True, help="outputs of runs of this script")
        parser.add_argument("--terms", default="shoots,machines", help="comma-separated: shoots, machines, nodes_seen")
        fit_args = parser.parse_args()
        return fit(fit_args.fit, fit_args.terms.split(","))
    args = parse_args()
    from machine_preservation.localcluster import hosts

    hosts.make_private()  # the shoots' Service names (before any thread starts)
    figures = Figures()
    figures.values["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    figures.values["product_version"] = product_version()
    figures.values["machine_before"] = machine_load()
    log(
        f"start: {args.shoots} shoots on {args.shoot_apiservers} API servers; machine "
        f"{figures.values['machine_before']}"
    )
    holder: dict[str, Bench] = {}

    async def bounded() -> None:
        bench = holder["bench"] = Bench(args, figures)
        # SIGTERM/SIGHUP end the run as Ctrl-C does: cancelled, then everything stopped (the product's processes
        # have no parent-death signal; stopping 200 shoots' lifecycles can take the extension a minute).
        main_task = asyncio.current_task()
        assert main_task is not None
        for number in (signal.SIGTERM, signal.SIGHUP):
            asyncio.get_running_loop().add_signal_handler(number, main_task.cancel)
        sampler = asyncio.create_task(_sample_machine(figures))
        try:
            await asyncio.wait_for(bench.run(), timeout=args.time_limit)
        finally:
            await _cancel(sampler)
            with contextlib.suppress(Exception):
                figures.values.setdefault("rss_end", proc_memory(bench.pid) if bench.pid else {})
            log("stopping everything (the extension stops every shoot's lifecycle first)")
            await bench.close()

    status = 0
    try:
        asyncio.run(bounded())
    except TimeoutError:
        figures.notes.append(f"stopped by --time-limit {args.time_limit}s; figures above are partial")
    except (asyncio.CancelledError, KeyboardInterrupt):
        figures.notes.append("interrupted; figures above are partial")
        status = 130
    except Exception as error:
        figures.notes.append(f"failed: {error!r}")
        status = 1
    report(args, holder.get("bench"), figures)
    return status


async def _sample_machine(figures: Figures) -> None:
    """The machine's load and other test processes every 30 s (the figures' context)."""
    seen: list[dict[str, Any]] = []
    while True:
        await asyncio.sleep(30)
        sample = machine_load()
        seen.append({"load1": sample["load"][0], "pytest": sample["pytest_processes"]})
        loads = [s["load1"] for s in seen]
        figures.values["machine_during"] = {
            "load1_min_max": (min(loads), max(loads)),
            "samples_with_pytest": sum(1 for s in seen if s["pytest"]),
            "samples": len(seen),
        }


if __name__ == "__main__":
    sys.exit(main())

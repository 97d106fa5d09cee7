"""Memory of the controller's pod cache: bytes per cached Pod, and what a large cluster's pods take.

The controller caches the pods of failed machines' nodes (a drain must see them), as many as fail at once, so
the size of one cached Pod decides what a wave of failures costs. Parses N realistic
served Pods (labels, annotations, owner reference, managedFields, containers, status) into the cached model
and prints the bytes per pod (tracemalloc, after parsing) and the total for 60,000 pods.

    .venv/bin/python benchmarks/pod_cache_memory.py            # 20,000 pods
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
import uuid
from typing import Any

from machine_preservation.core.models import Pod


def served_pod(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"web-5d8f7c9b6-{index:05d}",
            "namespace": f"team-{index % 40}",
            "uid": str(uuid.uuid4()),
            "resourceVersion": str(100000 + index),
            "creationTimestamp": "2026-11-01T10:00:00Z",
            "labels": {"app": "web", "pod-template-hash": "5d8f7c9b6", "team": f"team-{index % 40}"},
            "annotations": {
                "kubectl.kubernetes.io/restartedAt": "2026-11-01T10:00:00Z",
                "prometheus.io/scrape": "true",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-5d8f7c9b6",
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                }
            ],
        },
        "spec": {
            "nodeName": f"node-{index % 2000:04d}",
            "serviceAccountName": "web",
            "containers": [
                {"name": "web", "image": "registry.example/web:1.2.3", "resources": {"requests": {"cpu": "100m"}}}
            ],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=20_000)
    args = parser.parse_args()
    raw = [served_pod(i) for i in range(args.pods)]
    served_bytes = sum(len(json.dumps(p)) for p in raw) / args.pods
    tracemalloc.start()
    cache = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": Pod.model_validate(p) for p in raw}
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per_pod = used / len(cache)
    print(f"served Pod JSON: {served_bytes:.0f} bytes; cached (model + store key): {per_pod:.0f} bytes per pod")
    print(f"60,000 pods: {per_pod * 60_000 / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()

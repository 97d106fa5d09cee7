"""Rendering the Helm chart in tests (helm v4 from the toolchain)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "machine-preservation"
NAMESPACE = "mp-system"
RELEASE = "mp"


def set_args(values: dict[str, str]) -> list[str]:
    """`--set-json` for each dotted key, so values keep their JSON types."""
    args: list[str] = []
    for key, value in values.items():
        args += ["--set-json", f"{key}={value}"]
    return args


def helm(helm_binary: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm_binary), *args], capture_output=True, text=True, timeout=120, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def template(
    helm_binary: Path, values: dict[str, str] | None = None, *, namespace: str = NAMESPACE, release: str = RELEASE
) -> list[dict[str, Any]]:
    result = helm(helm_binary, "template", release, str(CHART), "--namespace", namespace, *set_args(values or {}))
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(documents: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in documents if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in matches]}"
    return matches[0]


def kinds(documents: Iterable[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in documents)


def webhooks_by_name(documents: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        webhook["name"]: webhook
        for document in documents
        if document["kind"] in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
        for webhook in document["webhooks"]
    }


def kubectl(kubectl_binary: Path, kubeconfig: Path, *args: str, documents: list[dict[str, Any]]) -> None:
    """`kubectl <args> -f -` with `documents` on its standard input; asserts it succeeded."""
    result = subprocess.run(
        [str(kubectl_binary), f"--kubeconfig={kubeconfig}", *args, "-f", "-"],
        input=yaml.safe_dump_all(documents),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr

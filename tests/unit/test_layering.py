"""The architecture as an import contract (what import-linter would enforce, without the dependency).

- the core decides and does no I/O: it imports no network, process or client library, and nothing
  of ours outside the core;
- webhook and controller never import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "src" / "machine_preservation"

CORE_FORBIDDEN = (
    "aiohttp",
    "kubernetes",
    "ssl",
    "socket",
    "subprocess",
    "asyncio",
    "http",
    "urllib",
    "requests",
    "machine_preservation.webhook",
    "machine_preservation.controller",
    "machine_preservation.cluster",
    "machine_preservation.certs",
    "machine_preservation.cli",
)
FORBIDDEN_BY_PACKAGE = {
    "core": CORE_FORBIDDEN,
    "webhook": ("machine_preservation.controller",),
    "controller": ("machine_preservation.webhook",),
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def violations(package: str) -> list[str]:
    forbidden = FORBIDDEN_BY_PACKAGE[package]
    found = []
    for path in sorted((PACKAGE_ROOT / package).rglob("*.py")):
        for module in sorted(imported_modules(path)):
            if any(module == f or module.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(PACKAGE_ROOT)} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN_BY_PACKAGE))
def test_package_respects_layering(package: str) -> None:
    assert (PACKAGE_ROOT / package).is_dir()
    assert violations(package) == []


def test_contract_detects_a_violation(tmp_path: Path) -> None:
    module = tmp_path / "bad.py"
    module.write_text("import aiohttp.web\nfrom kubernetes import client\nfrom . import sibling\n")
    assert imported_modules(module) == {"aiohttp.web", "kubernetes"}

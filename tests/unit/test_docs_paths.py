"""Every file, folder, Python module and `make` target the docs name in code spans exists, so a move or rename
cannot leave a stale pointer behind.

Checked, in the `code spans` of README.md and docs/*.md:
- paths whose first folder is one at the repository's root (`localcluster/grm.py`, `tests/e2e/`); a component's
  short form (`webhook/app.py` for webhook/machine_preservation/webhook/app.py) counts, and `…` stands for any
  folders;
- bare file names of our kinds (`mcm.py`, `versions.env`): some file in the repository has that name;
- dotted Python names that start with `machine_preservation.` or with one of our modules (`kube.informer`,
  `lifecycle.plan_machine`, `localcluster.mcm.mcm_crds`): a module ending in those segments, the rest attributes;
- `make <target>`: a target of the Makefile.
Left alone: URLs, label and annotation keys, chart values and object fields (none of them starts with a root folder
or names one of our modules; a dotted name that is a key path of a chart's values is a chart value), and
`<placeholders>`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
COMPONENTS = ("cli", "core", "kube", "certs", "webhook", "controller", "localcluster", "playground")
SKIPPED_FOLDERS = {".git", ".venv", "build", "node_modules", "__pycache__", "machine_preservation.egg-info"}
BARE_FILE = re.compile(r"[\w-]+\.(?:py|sh|env|md)")
PATH = re.compile(r"\.?[\w-]+(?:/[\w.…-]*)+")
DOTTED = re.compile(r"[a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def spans(text: str) -> Iterator[tuple[int, str]]:
    """The code spans with their first line; fenced blocks (commands, examples) are left out."""
    text = re.sub(r"^```.*?^```", lambda block: "\n" * block.group().count("\n"), text, flags=re.MULTILINE | re.DOTALL)
    for match in re.finditer(r"`([^`]+)`", text):
        yield text.count("\n", 0, match.start()) + 1, match.group(1)


def _files() -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        if not SKIPPED_FOLDERS.intersection(path.relative_to(ROOT).parts):
            found.append(path)
    return found


@cache
def file_names() -> frozenset[str]:
    return frozenset(path.name for path in _files() if path.is_file())


@cache
def module_files() -> dict[str, Path]:
    files = {}
    for component in COMPONENTS:
        for path in (ROOT / component / "machine_preservation" / component).rglob("*.py"):
            parts = path.relative_to(ROOT / component).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


@cache
def module_segments() -> frozenset[str]:
    return frozenset(segment for name in module_files() for segment in name.split(".")[1:])


def path_exists(token: str) -> bool:
    token = token.rstrip("/")
    first, _, rest = token.partition("/")
    bases = [ROOT / first]
    if first in COMPONENTS:
        bases.append(ROOT / first / "machine_preservation" / first)
    for base in bases:
        if "…" in rest or "..." in rest:
            pattern = re.sub(r"/?(?:…|\.\.\.)/?", "/**/", rest).strip("/").replace("//", "/")
            if any(base.glob(pattern)):
                return True
        elif (base / rest).exists():
            return True
    return False


@cache
def top_level_names(module: str) -> frozenset[str]:
    """What a module defines or imports at its top level, read from its source (importing it would run it)."""
    names = set()
    for node in ast.parse(module_files()[module].read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return frozenset(names)


def python_name_exists(name: str) -> bool:
    """`name` is a module, or a module followed by one of its top-level names (and what follows that), where the
    module's dotted name ends in the segments given (so `kube.informer` is machine_preservation.kube.informer)."""
    segments = name.split(".")
    for cut in range(len(segments), 0, -1):
        suffix = ".".join(segments[:cut])
        for module in module_files():
            if (module == suffix or module.endswith("." + suffix)) and (
                cut == len(segments) or segments[cut] in top_level_names(module)
            ):
                return True
    return False


def names_a_python_name(token: str) -> bool:
    segments = token.split(".")
    if any(re.fullmatch(r"[a-z]+[A-Z]\w*", segment) for segment in segments):
        return False  # lowerCamel: a chart value or an object field, never one of our Python names
    # `machine_preservation.…`, or one of our modules' names followed by more: `lifecycle.plan_machine`.
    return segments[0] == "machine_preservation" or any(segment in module_segments() for segment in segments[:-1])


def _schema_paths(schema: object, prefix: str = "") -> Iterator[str]:
    if isinstance(schema, dict):
        for key, child in schema.get("properties", {}).items():
            yield prefix + key
            yield from _schema_paths(child, f"{prefix}{key}.")


@cache
def chart_values() -> frozenset[str]:
    """The key paths of the charts' values: those their schemas declare (Gardener's injected ones among them) and
    those their templates read (`.Values.global.webhook.url`)."""
    paths: set[str] = set()
    for path in ROOT.glob("charts/**/values.schema.json"):
        paths.update(_schema_paths(json.loads(path.read_text())))
    for path in ROOT.glob("charts/**/templates/**/*"):
        if path.is_file():
            paths.update(re.findall(r"\.Values\.([\w.]+)", path.read_text()))
    return frozenset(paths)


def names_a_chart_value(token: str) -> bool:
    return any(value == token or value.startswith(token + ".") for value in chart_values())


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text()
    return frozenset(re.findall(r"^([\w.-]+):", text, flags=re.MULTILINE))


def stale_pointers(text: str) -> list[str]:
    roots = {path.name for path in ROOT.iterdir()} - SKIPPED_FOLDERS
    stale = []
    for number, span in spans(text):
        if "://" in span or "<" in span:
            continue
        for target in re.findall(r"\bmake ([\w-]+)", span):
            if target not in make_targets():
                stale.append(f"line {number}: make target {target!r}")
        for token in re.findall(r"[\w.…/-]+", span):
            token = token.rstrip(".")
            if "/" in token:
                if PATH.fullmatch(token) and token.split("/")[0] in roots and not path_exists(token):
                    stale.append(f"line {number}: path {token!r}")
            elif BARE_FILE.fullmatch(token):
                if token not in file_names():
                    stale.append(f"line {number}: file {token!r}")
            elif (
                DOTTED.fullmatch(token)
                and names_a_python_name(token)
                and not python_name_exists(token)
                and not names_a_chart_value(token)
            ):
                stale.append(f"line {number}: Python name {token!r}")
    return stale


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_every_pointer_in_the_docs_exists(doc: Path) -> None:
    assert stale_pointers(doc.read_text()) == []


@pytest.mark.parametrize(
    "text",
    [
        "`localcluster/nowhere.py`",
        "`webhook/gone.py`",
        "`controller/…/gone.py`",
        "`tests/e2e/test_nowhere.py`",
        "`gone_module.py`",
        "`machine_preservation.core.gone`",
        "`machine_preservation.core.lifecycle.gone`",
        "`cluster.mcm.mcm_crds`",
        "`kube.gone`",
        "`make gone`",
    ],
)
def test_a_stale_pointer_is_found(text: str) -> None:
    assert stale_pointers(text) != []


@pytest.mark.parametrize(
    "text",
    [
        "`localcluster/mcm.py`",
        "`controller/…/heap.py`",
        "`machine_preservation.core.lifecycle.plan_machine`",
        "`lifecycle.plan_machine`",
        "`https://github.com/gardener/gardener/pkg/apis`",
        "`node.machine.sapcloud.io/preserve`",
        "`webhook.timeoutSeconds`",
        "`spec.provider.workers`",
        "`charts/<name>/values.yaml`",
        "`make test`",
    ],
)
def test_other_code_spans_are_left_alone(text: str) -> None:
    assert stale_pointers(text) == []

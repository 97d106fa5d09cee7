"""The image's supply chain, checked from the files (no container engine needed): the lock files pin every
runtime and build requirement with hashes, the Dockerfile installs from them only, pins its base image by
digest and leaves the development packages out, and the console script starts without those packages."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from machine_preservation import cli

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "machine_preservation"
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
RUNTIME_LOCK = "requirements.lock"
BUILD_LOCK = "requirements-build.lock"
DIGEST = re.compile(r"^[\w./-]+(:[\w.-]+)?@sha256:[0-9a-f]{64}$")


def lock_entries(name: str) -> dict[str, tuple[str, list[str]]]:
    """Package name -> (exact version, hashes) of a pip requirements file written with hashes."""
    logical = re.sub(r"\\\n\s*", " ", (ROOT / name).read_text())
    entries: dict[str, tuple[str, list[str]]] = {}
    for line in logical.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement_text, *options = line.split(" --")
        requirement = Requirement(requirement_text.strip())
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{name}: {requirement_text} is not an exact version"
        hashes = [option.removeprefix("hash=") for option in options if option.startswith("hash=sha256:")]
        entries[canonicalize_name(requirement.name)] = (specifier.version, hashes)
    return entries


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    instructions = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, arguments = line.strip().partition(" ")
            instructions.append((instruction.upper(), " ".join(arguments.split())))
    return instructions


def run_commands() -> list[str]:
    return [
        command.strip()
        for instruction, arguments in dockerfile_instructions()
        if instruction == "RUN"
        for command in arguments.split("&&")
    ]


@pytest.mark.parametrize(
    ("lock", "requirements"),
    [
        (RUNTIME_LOCK, PYPROJECT["project"]["dependencies"]),
        (BUILD_LOCK, PYPROJECT["build-system"]["requires"]),
    ],
)
def test_every_requirement_is_pinned_with_hashes(lock: str, requirements: list[str]) -> None:
    entries = lock_entries(lock)
    assert entries, lock
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in entries, f"{requirement.name} is not in {lock}"
        version, _ = entries[name]
        assert requirement.specifier.contains(version), f"{lock}: {name}=={version} does not satisfy {text}"
    for locked, (version, hashes) in entries.items():
        assert hashes, f"{lock}: {locked}=={version} has no sha256 hash"


def test_the_runtime_lock_holds_no_development_tool() -> None:
    """The image installs the runtime lock: test and lint tools must not be in it."""
    development = {
        canonicalize_name(Requirement(text).name)
        for extra in PYPROJECT["project"]["optional-dependencies"].values()
        for text in extra
    }
    assert development, "the test and lint extras exist"
    assert not development & set(lock_entries(RUNTIME_LOCK)), "development tools in the runtime lock"


def test_the_locks_are_regenerated_by_make_lock() -> None:
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^lock:\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target is not None, "a `lock` target in the Makefile"
    for lock in (RUNTIME_LOCK, BUILD_LOCK):
        assert f"-o {lock}" in target.group(1)
        assert "make lock" in (ROOT / lock).read_text().split("\n\n", 1)[0], f"{lock} says how it is made"


def test_the_base_image_is_pinned_by_digest() -> None:
    stages: set[str] = set()
    images = []
    for instruction, arguments in dockerfile_instructions():
        if instruction != "FROM":
            continue
        image, *alias = arguments.split(" AS ", 1) if " AS " in arguments else arguments.split(" as ", 1)
        if image in stages:
            continue
        assert DIGEST.match(image), f"FROM {image} is not pinned by digest"
        images.append(image)
        stages.update(alias)
    assert len(images) == 2, "a build stage and the shipped stage"
    assert len(set(images)) == 1, "both stages start from the same base image"


def test_every_package_comes_from_a_lock_with_hashes_or_is_the_project_without_dependencies() -> None:
    copied = " ".join(arguments for instruction, arguments in dockerfile_instructions() if instruction == "COPY")
    pip_commands = [c for c in run_commands() if re.search(r"/pip (install|wheel)\b", c)]
    assert pip_commands
    locks_installed = set()
    for command in pip_commands:
        words = command.split()
        if "-r" in words:
            lock = words[words.index("-r") + 1]
            assert lock in (RUNTIME_LOCK, BUILD_LOCK), command
            assert {"--require-hashes", "--only-binary=:all:"} <= set(words), command
            assert lock in copied, f"{lock} is copied into the build"
            locks_installed.add(lock)
        else:
            # The project itself: its dependencies are already installed from the lock.
            assert "--no-deps" in words, command
            assert "--no-index" in words or "--no-build-isolation" in words, command
            assert not {"--upgrade", "-U"} & set(words), command
    assert locks_installed == {RUNTIME_LOCK, BUILD_LOCK}
    assert "/opt/venv/bin/pip check" in run_commands(), "the installed set is consistent"


def test_the_image_leaves_the_development_packages_out() -> None:
    removals = [c.split()[2:] for c in run_commands() if c.startswith("rm -r ")]
    assert len(removals) == 1
    removed = {path.removeprefix("src/").replace("/", ".") for path in removals[0]}
    assert removed == set(cli.DEVELOPMENT_PACKAGES)
    for package in cli.DEVELOPMENT_PACKAGES:
        assert (PACKAGE.parent / package.replace(".", "/")).is_dir(), package
    # Only the virtualenv built from the locks reaches the shipped stage.
    shipped = [a for i, a in dockerfile_instructions() if i == "COPY" and a.startswith("--from=")]
    assert shipped == ["--from=build /opt/venv /opt/venv"]


def _imports(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def test_production_code_never_imports_the_development_packages() -> None:
    development_dirs = [PACKAGE.parent / p.replace(".", "/") for p in cli.DEVELOPMENT_PACKAGES]
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if any(path.is_relative_to(d) for d in development_dirs):
            continue
        for module in _imports(path):
            if any(module == p or module.startswith(p + ".") for p in cli.DEVELOPMENT_PACKAGES):
                found.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert found == []


def test_a_missing_dependency_inside_a_development_package_is_not_mistaken_for_its_absence() -> None:
    assert cli._is_left_out(ModuleNotFoundError(name="machine_preservation.cluster"))
    assert cli._is_left_out(ModuleNotFoundError(name="machine_preservation.playground.stack"))
    assert not cli._is_left_out(ModuleNotFoundError(name="kubernetes"))
    assert not cli._is_left_out(ModuleNotFoundError(name="machine_preservation.clusters"))


def test_the_console_script_starts_without_the_development_packages(tmp_path: Path) -> None:
    """The package as the image installs it: a copy without the development packages, found first on the path."""
    copy = tmp_path / "site"
    shutil.copytree(PACKAGE, copy / "machine_preservation", ignore=shutil.ignore_patterns("__pycache__"))
    for package in cli.DEVELOPMENT_PACKAGES:
        shutil.rmtree(copy / package.replace(".", "/"))
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    script = Path(sys.executable).parent / "machine-preservation"

    def run(*args: str) -> str:
        result = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        return result.stdout

    located = run(sys.executable, "-c", "import machine_preservation; print(machine_preservation.__file__)")
    assert Path(located.strip()).is_relative_to(copy), "the copy is the one imported"
    listed = run(str(script), "--help")
    commands = set(re.findall(r"^    (\w+) ", listed, re.MULTILINE))
    assert commands == {"certs", "webhook", "controller"}
    for command in (["webhook"], ["controller"], ["certs", "run"]):
        assert "usage:" in run(str(script), *command, "--help")

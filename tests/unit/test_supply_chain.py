"""The image's supply chain, checked from the files (no container engine needed): the lock files pin every
runtime and build requirement with hashes, the Dockerfile installs from them only, pins its base image by
digest and copies only the production components, and the wheel holds only those and starts without the
development tools."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
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


SETUPTOOLS: dict[str, Any] = PYPROJECT["tool"]["setuptools"]
DEVELOPMENT_FOLDERS = ("localcluster", "playground")


def production_folders() -> set[str]:
    """The top-level folders the distribution is built from (pyproject.toml's package-dir)."""
    return {path.split("/")[0] for path in SETUPTOOLS["package-dir"].values()}


def test_the_package_list_names_every_package_of_the_production_folders() -> None:
    found = set()
    for package, directory in SETUPTOOLS["package-dir"].items():
        for init in (ROOT / directory).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / directory)
            found.add(".".join([package, *relative.parts]))
    assert found == set(SETUPTOOLS["packages"])
    assert not production_folders() & set(DEVELOPMENT_FOLDERS)
    for folder in DEVELOPMENT_FOLDERS:
        assert (ROOT / folder / "machine_preservation" / folder / "__init__.py").is_file(), folder


def test_the_image_copies_exactly_the_production_folders() -> None:
    sources = set()
    for instruction, arguments in dockerfile_instructions():
        if instruction == "COPY" and not arguments.startswith("--from="):
            sources.update(arguments.split()[:-1])
    assert sources - {"pyproject.toml", "README.md", RUNTIME_LOCK, BUILD_LOCK} == production_folders()
    # Only the virtualenv built from the locks reaches the shipped stage.
    shipped = [a for i, a in dockerfile_instructions() if i == "COPY" and a.startswith("--from=")]
    assert shipped == ["--from=build /opt/venv /opt/venv"]


def test_the_wheel_holds_the_production_packages_and_its_console_script_starts(tmp_path: Path) -> None:
    """The project as the image installs it: its wheel alone on the path, without the developer tools."""
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(ROOT)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "site")
    packages = {name.rsplit("/", 1)[0].replace("/", ".") for name in names if name.endswith("/__init__.py")}
    assert packages == set(SETUPTOOLS["packages"])
    assert all(name.startswith(("machine_preservation/", "machine_preservation-")) for name in names)

    # -S: no site directory is processed, so neither the editable install nor the developer tools' .pth file
    # is seen; the third-party packages come from the virtualenv's site-packages as a plain path entry.
    third_party = sysconfig.get_paths()["purelib"]
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), third_party]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }

    def run(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-S", *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    listed = run("-m", "machine_preservation.cli", "--help")
    commands = set(re.findall(r"^    (\w+) ", listed, re.MULTILINE))
    assert commands == {"certs", "webhook", "controller", "extension"}
    for command in (["webhook"], ["controller"], ["certs", "run"]):
        assert "usage:" in run("-m", "machine_preservation.cli", *command, "--help")
    # The kubectl plugin: its console script in the wheel, and it starts from the wheel alone.
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    scripts = (tmp_path / "site" / entry_points).read_text()
    assert "kubectl-preservation = machine_preservation.cli.kubectl.plugin:main" in scripts
    assert "usage: kubectl preservation" in run("-m", "machine_preservation.cli.kubectl", "--help")
    for development_tool in DEVELOPMENT_FOLDERS:
        result = subprocess.run(
            [sys.executable, "-S", "-c", f"import machine_preservation.{development_tool}"],
            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
        )  # fmt: skip
        assert f"No module named 'machine_preservation.{development_tool}'" in result.stderr

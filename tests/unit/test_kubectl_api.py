"""The kubectl plugin's request shell, where it decides something: the API server's warnings as kubectl prints
them, and which kubeconfig context kubectl would use."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from urllib3 import HTTPHeaderDict

from machine_preservation.cli.kubectl.api import kubectl_context, warnings_of


def test_warnings_are_the_texts_of_the_warning_headers() -> None:
    headers = HTTPHeaderDict()
    headers.add("Warning", '299 - "metadata.annotations: restored to true"')
    headers.add("Warning", "plain")
    headers.add("Content-Type", "application/json")
    assert warnings_of(headers) == ("metadata.annotations: restored to true", "plain")
    assert warnings_of(HTTPHeaderDict()) == ()
    assert warnings_of({}) == ()


def test_the_context_is_kubectls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = []
    for name, current in (("none", None), ("first", "a"), ("second", "b")):
        document = {"apiVersion": "v1", "kind": "Config"} | ({"current-context": current} if current else {})
        (tmp_path / name).write_text(yaml.safe_dump(document))
        files.append(str(tmp_path / name))
    (tmp_path / "broken").write_text("{")
    paths = [str(tmp_path / "missing"), str(tmp_path / "broken"), *files]
    monkeypatch.setenv("KUBECONFIG", ":".join(paths))
    assert kubectl_context(None, None) == "a"  # the first file that names one
    assert kubectl_context(None, "chosen") == "chosen"
    assert kubectl_context("/some/kubeconfig", None) is None  # one file: its own current context
    monkeypatch.delenv("KUBECONFIG")
    assert kubectl_context(None, None) is None

"""The local seed names shoot API servers as a seed's cluster DNS does, without touching the machine's /etc/hosts,
and writes the generic token kubeconfig as gardenlet v1.150 does with `IstioTLSTermination`: an address that nothing
outside the shoot namespace of a real seed resolves, and nothing here resolves either."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from machine_preservation.localcluster import gardener, hosts


def test_names_resolve_in_the_tests_only() -> None:
    assert hosts.is_private(), "tests/conftest.py makes /etc/hosts private"
    name = "kube-apiserver.shoot--hosts--check.svc"
    address = hosts.free_loopback_address()
    hosts.set_host(name, address)
    assert socket.getaddrinfo(name, 443)[0][4][0] == address
    again = hosts.free_loopback_address()
    hosts.set_host(name, again)  # a later mapping replaces the earlier one
    assert socket.getaddrinfo(name, 443)[0][4][0] == again
    # Written to the private copy, bind-mounted over /etc/hosts in this process's mount namespace only.
    private_copy = Path(os.environ[hosts.PRIVATE_ENV])
    assert name in private_copy.read_text()
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    assert any(line.split()[4] == "/etc/hosts" for line in mounts)


def test_a_process_of_its_own_gets_a_private_hosts_file_that_leaves_nothing_behind(tmp_path: Path) -> None:
    """A process that makes /etc/hosts private (the playground, a test run, a benchmark) removes its copy's name
    when it ends. This one starts in this test run's private namespace, as if it did not know, and makes its own
    on top."""
    name = "kube-apiserver.shoot--hosts--own.svc"
    script = (
        "from machine_preservation.localcluster import hosts; "
        "hosts.make_private(); "
        f"hosts.set_host({name!r}, '127.64.0.9'); "
        "print(hosts.HOSTS_FILE.read_text())"
    )
    inherited = {key: value for key, value in os.environ.items() if key != hosts.PRIVATE_ENV}
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=inherited | {"TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"127.64.0.9 {name}" in result.stdout.splitlines()
    assert name not in hosts.HOSTS_FILE.read_text()  # not in this run's copy
    assert list(tmp_path.iterdir()) == []


def test_the_generic_kubeconfig_names_an_address_the_extension_cannot_reach() -> None:
    server = gardener.out_of_cluster_api_server("shoot--core--a")
    assert server == f"https://api.a.core.{gardener.INTERNAL_DOMAIN}"
    host = urlsplit(server).hostname
    assert host is not None
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(host, 443)

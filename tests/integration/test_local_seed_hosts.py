"""The local seed names shoot API servers as a seed's cluster DNS does, without touching the machine's /etc/hosts,
and writes the generic token kubeconfig as gardenlet v1.150 does with `IstioTLSTermination`: an address that nothing
outside the shoot namespace of a real seed resolves, and nothing here resolves either."""

from __future__ import annotations

import os
import socket
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


def test_the_generic_kubeconfig_names_an_address_the_extension_cannot_reach() -> None:
    server = gardener.out_of_cluster_api_server("shoot--core--a")
    assert server == f"https://api.a.core.{gardener.INTERNAL_DOMAIN}"
    host = urlsplit(server).hostname
    assert host is not None
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(host, 443)

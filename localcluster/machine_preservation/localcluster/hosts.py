"""Names for the local seed's shoot API servers, as a seed's cluster DNS gives them: `kube-apiserver.<namespace>.svc`.

In a real seed the extension reaches every shoot's API server at its Service, `https://kube-apiserver.<shoot
namespace>.svc:443`, whatever address the generic token kubeconfig names (with Istio TLS termination it names one
only the shoot namespace's pods can use). Locally each shoot's kube-apiserver listens on a loopback address of its
own at port 443, and the name resolves to it through /etc/hosts, as a pod's resolver answers from cluster DNS.

The hosts file written here is a private copy: `make_private` gives the calling process (and every process it starts
from then on) a mount namespace of its own in which a copy of /etc/hosts is bind-mounted over the original, so the
machine's own file is never touched and parallel test runs do not see each other's names. That needs root (a new
mount namespace and a bind mount), as does port 443; the playground and the tests run as root on this project's
machines.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import os
import random
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Final

HOSTS_FILE: Final = Path("/etc/hosts")
# Set once this process's /etc/hosts is private (inherited by the processes it starts, which share the copy).
PRIVATE_ENV: Final = "MACHINE_PRESERVATION_PRIVATE_HOSTS"
SHOOT_API_SERVER_PORT: Final = 443

_CLONE_NEWNS: Final = 0x00020000
_MS_BIND: Final = 4096
_MS_REC: Final = 16384
_MS_PRIVATE: Final = 1 << 18


class HostsError(RuntimeError):
    """The private hosts file cannot be set up or written."""


def api_server_service(namespace: str) -> str:
    """The in-seed name of a shoot's API server, as Gardener's own in-seed access uses it."""
    return f"kube-apiserver.{namespace}.svc"


def is_private() -> bool:
    return bool(os.environ.get(PRIVATE_ENV))


def make_private() -> None:
    """Give this process a mount namespace with a writable private copy of /etc/hosts (once; a no-op where the
    copy is already in place, e.g. in a process started by one that made it). Call it while the process has a
    single thread: a new mount namespace cannot be entered by one thread of several."""
    if is_private():
        return
    libc = ctypes.CDLL(None, use_errno=True)

    def check(result: int, what: str) -> None:
        if result != 0:
            code = ctypes.get_errno()
            hint = " (run as root)" if code in (errno.EPERM, errno.EACCES) else ""
            raise HostsError(f"{what}: {os.strerror(code)}{hint}")

    check(libc.unshare(_CLONE_NEWNS), "a mount namespace of its own")
    check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "making the mounts private")
    handle, copy = tempfile.mkstemp(prefix="machine-preservation-hosts-")
    os.close(handle)
    # The mount holds the copy for as long as a process lives in this namespace; its name is needed only while
    # this process lives, for a process it starts to make a namespace of its own on top (that cannot mount over
    # a file whose name is gone).
    atexit.register(os.unlink, copy)
    shutil.copyfile(HOSTS_FILE, copy)
    check(libc.mount(copy.encode(), str(HOSTS_FILE).encode(), None, _MS_BIND, None), "bind-mounting the hosts copy")
    os.environ[PRIVATE_ENV] = copy


def set_host(name: str, address: str) -> None:
    """Resolve `name` to `address` from now on, in this process and every one it started (the file is rewritten in
    place: the resolver reads it on each lookup)."""
    if not is_private():
        raise HostsError(f"/etc/hosts is the machine's own: call hosts.make_private() first (to resolve {name})")
    with HOSTS_FILE.open("r+") as hosts:
        kept = [line for line in hosts.read().splitlines() if name not in line.split()[1:]]
        hosts.seek(0)
        hosts.write("\n".join([*kept, f"{address} {name}"]) + "\n")
        hosts.truncate()


def free_loopback_address(port: int = SHOOT_API_SERVER_PORT) -> str:
    """A loopback address (127.64.0.0/10) on which `port` is free now."""
    for _ in range(100):
        address = f"127.{random.randint(64, 127)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
        with socket.socket() as probe:
            try:
                probe.bind((address, port))
            except OSError as error:
                if error.errno == errno.EACCES:
                    raise HostsError(f"binding port {port}: {error.strerror} (run as root)") from error
                continue
            return address
    raise HostsError(f"no free loopback address for port {port}")

"""Hosts on one machine: Linux network namespaces joined by veth pairs to one bridge.

Each `Host` is a network namespace with its own interfaces, addresses and port space, so processes on
different hosts talk only over the bridge, as separate machines would over a switch. `Host.cut()` takes
the host's link down without touching its processes (a network partition, not a crash); `Host.heal()`
brings it back. The machine's own namespace reaches every host through the bridge address (``.1``).

Needs root (CAP_NET_ADMIN) and iproute2's ``ip``. Addresses come from a private /24 (RFC 1918) chosen by
the caller; names carry the network's prefix so `Network.down()` (and a later run's `Network.up()`)
removes everything a killed run left behind.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Host", "NetnsError", "Network", "netns_available"]

_PREFIX_RE = re.compile(r"[a-z][a-z0-9]{1,5}")
_LABEL_RE = re.compile(r"[a-z0-9]{1,6}")


class NetnsError(RuntimeError):
    """An ``ip`` command failed (the message carries its stderr)."""


@functools.cache
def netns_available() -> str | None:
    """None when network namespaces can be built here (tried once: root without CAP_NET_ADMIN, in a
    container, cannot), else the reason they cannot."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"plxprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except NetnsError as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "delete", probe, check=False)
    return None


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class Host:
    """One network namespace with one interface (``eth0``) on the network's bridge."""

    name: str
    netns: str
    ip: str
    link: str  # the veth end in the machine's namespace, attached to the bridge

    @property
    def exec_prefix(self) -> list[str]:
        """The command prefix that runs a program on this host (``ip netns exec`` execs it: PIDs stay)."""
        return ["ip", "netns", "exec", self.netns]

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start `argv` on this host; the returned process's PID is the program's own."""
        return subprocess.Popen([*self.exec_prefix, *argv], **kwargs)

    def cut(self) -> None:
        """Partition the host: its link goes down, its processes keep running and see only silence."""
        _ip("link", "set", self.link, "down")

    def heal(self) -> None:
        """Reconnect a cut host."""
        _ip("link", "set", self.link, "up")

    @property
    def is_cut(self) -> bool:
        flags = re.search(r"<([^>]*)>", _ip("-o", "link", "show", self.link))
        return flags is None or "UP" not in flags.group(1).split(",")


@dataclass
class Network:
    """A bridge ``<prefix>-br`` at ``<subnet>.1`` and the hosts on it (``<subnet>.<10+i>``)."""

    prefix: str = "plx"
    subnet: str = "10.77.0.0/24"
    hosts: dict[str, Host] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not _PREFIX_RE.fullmatch(self.prefix):
            raise ValueError(
                f"prefix must match {_PREFIX_RE.pattern} (interface names are short), got {self.prefix!r}"
            )
        net = ipaddress.ip_network(self.subnet, strict=True)
        if not net.is_private or net.prefixlen != 24 or net.version != 4:
            raise ValueError(f"subnet must be a private IPv4 /24, got {self.subnet!r}")
        self._net = net

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def gateway_ip(self) -> str:
        """The machine's own address on the bridge (reachable from every host)."""
        return str(self._net.network_address + 1)

    def up(self) -> Network:
        """Create the bridge (after removing whatever an earlier run with this prefix left behind)."""
        self.down()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def add_host(self, label: str) -> Host:
        """A new host ``<prefix>-<label>`` with the next free address."""
        if not _LABEL_RE.fullmatch(label):
            raise ValueError(f"host label must match {_LABEL_RE.pattern}, got {label!r}")
        if label in self.hosts:
            raise ValueError(f"host {label!r} exists")
        netns = link = f"{self.prefix}-{label}"
        ip = str(self._net.network_address + 10 + len(self.hosts))
        _ip("netns", "add", netns)
        _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", link, "master", self.bridge, "up")
        _ip("-n", netns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        host = Host(name=label, netns=netns, ip=ip, link=link)
        self.hosts[label] = host
        return host

    def down(self) -> None:
        """Delete every namespace and link with this prefix (idempotent; processes on them keep running
        without a network, so stop them first)."""
        for netns in _ip("netns", "list", check=False).split():
            if netns.startswith(f"{self.prefix}-"):
                _ip("netns", "delete", netns, check=False)
        for line in _ip("-o", "link", "show", check=False).splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith(f"{self.prefix}-"):
                _ip("link", "delete", name, check=False)
        self.hosts.clear()

    def __enter__(self) -> Network:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(NetnsError):
            self.down()

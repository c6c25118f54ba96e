"""Where the gateway may connect: one address policy for the proxy, probes, the playground and
alert webhooks, checked on the address actually dialled.

The check runs in the HTTP client's socket factory, after name resolution and for each address
tried, so neither a name that resolves to a refused address (now or only later), nor an IP
literal, nor an IPv4 address dressed as IPv6 (`::ffff:169.254.169.254`, NAT64) gets round it.

Link-local and cloud metadata addresses are always refused: a gateway that proxies to
addresses its tenants choose must never hand them the host's instance credentials. So are the
unspecified addresses (0.0.0.0/8 and `::`), which Linux dials as the host itself: they would
get round a GATEWAY_OUTBOUND_DENY of loopback. Loopback and private ranges are allowed by
default (self-hosted MCP servers live there); GATEWAY_OUTBOUND_DENY refuses more,
GATEWAY_OUTBOUND_ALLOW makes exceptions to that list.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Never reachable, whatever the settings say.
ALWAYS_REFUSED: tuple[tuple[Network, str], ...] = (
    (ipaddress.ip_network("169.254.0.0/16"), "link-local (cloud metadata)"),
    (ipaddress.ip_network("fe80::/10"), "link-local"),
    (ipaddress.ip_network("fd00:ec2::254/128"), "cloud metadata"),
    # Alibaba Cloud's metadata service, outside the link-local range.
    (ipaddress.ip_network("100.100.100.200/32"), "cloud metadata"),
    (ipaddress.ip_network("0.0.0.0/8"), "unspecified (reaches this host)"),
    (ipaddress.ip_network("::/128"), "unspecified (reaches this host)"),
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

# (family, type, proto, canonname, sockaddr): what aiohappyeyeballs hands a socket factory.
AddrInfo = tuple[int, int, int, str, tuple[str, int] | tuple[str, int, int, int]]


class RefusedAddress(OSError):
    """The address is refused by the outbound policy (an OSError, so the HTTP client reports
    it as a connection failure: 502 from the proxy, a `down` probe)."""

    def __init__(self, address: str, why: str) -> None:
        super().__init__(errno.EACCES, f"{address} is refused by the outbound policy ({why})")


def parse_networks(raw: str) -> tuple[Network, ...]:
    """A comma-separated CIDR list ('10.0.0.0/8, fd00::/8'); a bare address is one host."""
    networks = []
    for part in raw.split(","):
        if part.strip():
            networks.append(ipaddress.ip_network(part.strip(), strict=False))
    return tuple(networks)


def _plain(address: Address) -> Address:
    """An IPv4 address however it is written in IPv6 (mapped, or NAT64's well-known prefix)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


@dataclass(frozen=True, slots=True)
class OutboundPolicy:
    deny: tuple[Network, ...] = ()
    # Exceptions to `deny` (never to ALWAYS_REFUSED).
    allow: tuple[Network, ...] = ()

    def refusal(self, address: str) -> str | None:
        """Why connecting to this IP address is refused, or None if it is allowed."""
        try:
            ip = _plain(ipaddress.ip_address(address.split("%", 1)[0]))  # drop an IPv6 zone
        except ValueError:
            return "not an IP address"
        for network, why in ALWAYS_REFUSED:
            if ip.version == network.version and ip in network:
                return why
        denied = any(ip.version == n.version and ip in n for n in self.deny)
        if denied and not any(ip.version == n.version and ip in n for n in self.allow):
            return "GATEWAY_OUTBOUND_DENY"
        return None

    def check(self, address: str) -> None:
        why = self.refusal(address)
        if why is not None:
            raise RefusedAddress(address, why)

    def literal_refusal(self, url: str) -> str | None:
        """For a URL whose host is an IP literal: why it is refused (else None). Hosts given
        by name are judged when they are resolved, at connect time."""
        host = urlsplit(url).hostname
        if host is None:
            return None
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return None
        return self.refusal(host)

    def socket_factory(self) -> Callable[[AddrInfo], socket.socket]:
        """For aiohttp's TCPConnector: a socket for each address it is about to dial, or
        RefusedAddress."""

        def make(addr_info: AddrInfo) -> socket.socket:
            family, kind, proto, _, sockaddr = addr_info
            self.check(str(sockaddr[0]))
            return socket.socket(family=family, type=kind, proto=proto)

        return make


def describe(networks: Sequence[Network]) -> str:
    return ", ".join(str(n) for n in networks) or "none"

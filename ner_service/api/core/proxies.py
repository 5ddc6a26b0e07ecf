"""Which address a request comes from: the TCP peer, or, when that peer is a reverse proxy the
operator trusts (``NER_TRUSTED_PROXIES``), the address that proxy saw (``X-Forwarded-For``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from starlette.requests import HTTPConnection

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class TrustedProxies:
    """The networks whose ``X-Forwarded-For`` is believed; none by default, since a client writes
    that header as it likes."""

    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, csv: str) -> TrustedProxies:
        """From comma-separated addresses or CIDR networks (``10.0.0.0/8, 192.168.1.7``); a
        malformed entry raises ValueError, so that a typo does not start a server trusting nothing."""
        return cls(tuple(ipaddress.ip_network(item.strip(), strict=False) for item in csv.split(",") if item.strip()))

    def trusts(self, host: str) -> bool:
        """Whether ``host`` (an address as text) is one of the trusted proxies."""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def client_address(self, connection: HTTPConnection) -> str:
        """The peer's address; when the peer is a trusted proxy, the right-most address of
        ``X-Forwarded-For`` that is not a trusted proxy (each proxy appends the address it saw, so
        what lies left of it was written by the client and is ignored)."""
        peer = connection.client.host if connection.client else "unknown"
        if not self.trusts(peer):
            return peer
        hops = [hop.strip() for value in connection.headers.getlist("x-forwarded-for") for hop in value.split(",")]
        hops = [hop for hop in hops if hop]
        for hop in reversed(hops):
            if not self.trusts(hop):
                return hop
        return hops[0] if hops else peer  # every hop is a trusted proxy: the farthest one

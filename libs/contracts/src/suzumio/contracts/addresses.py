"""Which network addresses the platform calls only when an operator allows it: loopback,
private, link-local and every other non-global address, also hidden inside IPv6 (IPv4-mapped,
6to4, NAT64). The runner's `web.fetch` and the tool-broker's model relay check each address a
host resolves to with the same rule."""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def refused_reason(address: IPAddress) -> str | None:
    """Why `address` may not be fetched by default, or None for a public unicast address."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        inner = refused_reason(embedded)
        return f"{inner} (embedded in {address})" if inner else None
    checks = (
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("unspecified", address.is_unspecified),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("site-local", isinstance(address, ipaddress.IPv6Address) and address.is_site_local),
        ("non-global", not address.is_global),
    )
    return next((label for label, hit in checks if hit), None)


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None

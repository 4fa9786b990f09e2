"""Print this node's routable IPv4 address: the one the Ray head advertises and every other node dials.

Never a loopback address: many hosts map their own name to 127.0.1.1 in /etc/hosts, so `hostname --ip-address`
(and `gethostbyname(gethostname())`) can answer 127.0.1.1, which the other nodes cannot reach. Tried in order,
the first address outside 127.0.0.0/8 wins:

1. the source address of this node's route to HACPO_ROUTE_PROBE (default 8.8.8.8): a UDP `connect` only picks
   the route, nothing is sent, so it works without Internet access as long as a route exists;
2. the addresses the host name resolves to (cluster DNS or /etc/hosts).

With none found it exits 1 naming what it saw; `HACPO_HEAD_IP` in the job's environment then names the address.
Standard library only: it runs through `srun` on the node, inside the container when there is one.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys


def route_address(probe: str) -> str | None:
    """The source address the kernel picks for a datagram to `probe` (host or host:port), or None."""
    host, _, port = probe.partition(":")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, int(port or 53)))
            return sock.getsockname()[0]
    except OSError:
        return None


def name_addresses() -> list[str]:
    """The IPv4 addresses this host's name resolves to (empty if it does not resolve)."""
    try:
        return socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        return []


def node_address(probe: str = "8.8.8.8") -> tuple[str | None, list[str]]:
    """The first routable candidate, and every candidate seen (in the order tried)."""
    seen = [address for address in [route_address(probe), *name_addresses()] if address]
    routable = [address for address in seen if not ipaddress.ip_address(address).is_loopback]
    return (routable[0] if routable else None), seen


def main() -> int:
    address, seen = node_address(os.environ.get("HACPO_ROUTE_PROBE", "8.8.8.8"))
    if address is None:
        print(f"[hacpo] {socket.gethostname()}: no routable IPv4 address (seen: {', '.join(seen) or 'none'}); "
              "set HACPO_HEAD_IP to the address the other nodes reach this node at", file=sys.stderr)
        return 1
    print(address)
    return 0


if __name__ == "__main__":
    sys.exit(main())

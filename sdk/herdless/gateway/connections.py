"""What a connection may hold, and what all the connections of one server share.

:class:`ConnectionLimits` are the settings (each rule is explained in
:mod:`herdless.gateway.protocol`, which enforces them per connection);
:class:`ConnectionGuard` counts the connections per client address and what the guard
closed; :func:`raise_file_limit` gives the process the file descriptors its
connections need.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from herdless._bounds import require
from herdless.gateway.metrics import GatewayMetrics

__all__ = ["ConnectionGuard", "ConnectionLimits", "raise_file_limit"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    """What one connection may hold; see the module docstring for each rule.

    Attributes:
        max_head_bytes: largest request head in bytes (request line and headers).
        max_headers: most header lines in one request head.
        head_timeout: seconds from a request's first byte to the end of its head.
        keep_alive_timeout: seconds a connection may stay open with no request under way.
        max_connections_per_peer: connections one client address may hold; 0: no cap.
    """

    max_head_bytes: int = 32_768
    max_headers: int = 100
    head_timeout: float = 10.0
    keep_alive_timeout: float = 10.0
    max_connections_per_peer: int = 1024

    def __post_init__(self) -> None:
        require(self, ">= 1", "max_head_bytes", "max_headers")
        require(self, "> 0", "head_timeout", "keep_alive_timeout")
        require(self, ">= 0", "max_connections_per_peer")


class ConnectionGuard:
    """What every connection of one server shares: the limits, counts per peer, the metrics.

    Args:
        limits: the limits.
        metrics: where closed connections and refused heads are counted.
        file_limit: the process's open-file limit; a peer may hold at most half
            of it (default: the current soft ``RLIMIT_NOFILE``).
    """

    __slots__ = ("limits", "metrics", "peer_cap", "peers")

    def __init__(
        self, limits: ConnectionLimits, metrics: GatewayMetrics, *, file_limit: int | None = None
    ) -> None:
        self.limits = limits
        self.metrics = metrics
        if file_limit is None:
            file_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        cap = limits.max_connections_per_peer
        half = max(1, file_limit // 2) if file_limit > 0 else cap
        self.peer_cap = min(cap, half) if cap else 0
        self.peers: dict[str, int] = {}

    def admit(self, peer: str) -> bool:
        """Count a new connection from ``peer``; ``False`` if the peer is at its cap."""
        held = self.peers.get(peer, 0)
        if self.peer_cap and held >= self.peer_cap:
            return False
        self.peers[peer] = held + 1
        return True

    def release(self, peer: str) -> None:
        """A connection counted by :meth:`admit` is gone."""
        held = self.peers.get(peer, 0) - 1
        if held > 0:
            self.peers[peer] = held
        else:
            self.peers.pop(peer, None)

    def closed(self, reason: str, status: int | None = None) -> None:
        """Count a connection the guard closed (and the status it answered, if any)."""
        self.metrics.connections_closed[reason] += 1
        if status is not None:
            self.metrics.requests[status] += 1


def raise_file_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one; returns (before, after).

    Every connection is a file descriptor: the default soft limit (often 1024)
    would let a few hundred held sockets lock everyone else out, while the
    hard limit is usually far higher. Go's runtime does the same at start.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):  # a sandbox may forbid it: keep what we have
        return soft, soft
    return soft, hard

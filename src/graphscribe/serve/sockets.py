"""The server's listening sockets: the port held by the engine, a socket of its own for each HTTP worker."""

from __future__ import annotations

import ipaddress
import socket
import sys

BACKLOG = 2048  # connections the kernel queues for the workers to accept


# Linux spreads a port's new connections evenly over the sockets listening on it with SO_REUSEPORT (by a hash of
# each connection's addresses). One socket shared by the workers is not spread: a worker woken by a burst of
# connections accepts up to a hundred at once and keeps them (clients hold theirs open), and serves them all on its
# one event loop while the other workers idle.
PORT_PER_WORKER = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound; OSError with the reason when it cannot be. Where each worker listens on a socket
    of its own (PORT_PER_WORKER) this one only holds the port: it is bound as any server's socket (so a port another
    server listens on, another graphscribe's workers included, fails here) and then marked for the workers' sockets
    to share its port, but never listens (nobody would take what came to it). Elsewhere it listens, and the workers
    share it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if not PORT_PER_WORKER:
        return socket.create_server((host, port), family=family, backlog=BACKLOG)
    held = socket.socket(family, socket.SOCK_STREAM)
    try:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            held.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        held.bind((host, port))
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    except OSError:
        held.close()
        raise
    return held


def worker_socket(held: socket.socket) -> socket.socket:
    """The socket an HTTP worker accepts on: its own, listening on `held`'s port (PORT_PER_WORKER), else `held`."""
    if not PORT_PER_WORKER:
        return held
    return socket.create_server(held.getsockname()[:2], family=held.family, backlog=BACKLOG, reuse_port=True)


def host_text(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

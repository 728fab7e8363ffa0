"""Length-prefixed frames on a stream socket: how the host, the supervisor, the session and the
remote `ptenv-session` client talk. Standard library only (it is mounted into the sandbox)."""

import socket
import struct

FRAME = struct.Struct(">Q")
MAX_FRAME = 160 << 20  # a 64 MiB result tensor is about 86 MB of JSON


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(FRAME.pack(len(payload)) + payload)


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket) -> bytes | None:
    """One frame, or None at end of stream; raises ValueError on an oversized frame."""
    header = recv_exact(sock, FRAME.size)
    if header is None:
        return None
    (n,) = FRAME.unpack(header)
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes is over the {MAX_FRAME}-byte cap")
    return recv_exact(sock, n)

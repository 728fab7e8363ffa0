"""What the host and the processes of a sandbox say to each other: one framing, the limits of a
sandbox in one frozen config, and the size bounds of every reply. Standard library only.

Every channel is a stream socket carrying length-prefixed frames. A read from the model's side
(the interpreter) is bounded in size before anything is decoded, and has one overall deadline, so a
peer that trickles a byte at a time cannot stretch it.
"""

import asyncio
import binascii
import math
import socket
import struct
import time
from dataclasses import asdict, dataclass
from select import POLLIN, poll

FRAME = struct.Struct(">Q")
# The largest tensor the codec carries, an input or `result`. At this size any read-back reply, a
# hostile one too, costs the supervisor less than 64 MiB (bench/bench_replies.py).
MAX_TENSOR_BYTES = 32 << 20
# A result reply carries the tensor's bytes in base64 plus a little JSON around them.
MAX_RESULT_REPLY = (MAX_TENSOR_BYTES + 2) // 3 * 4 + 4096
MAX_FRAME = MAX_RESULT_REPLY + 4096  # a supervisor's reply to the host: one result reply, wrapped
PIECE = 3 << 20  # raw bytes base64-encoded at a time (a multiple of 3: the pieces' encodings join)
# A function task's trial (trial.py, caller.py): at most this many cases per rollout, outputs per
# call, and bytes of one encoded output; so a trial's reply stays under MAX_FRAME.
MAX_HIDDEN_CASES = 32
MAX_HIDDEN_OUTPUTS = 8
HIDDEN_OUTPUT_CAP = 128 * 1024


class FrameError(ValueError):
    """A frame over its cap: the peer broke the protocol."""


@dataclass(frozen=True)
class Limits:
    """Everything a sandbox is allowed, decided once by load_environment and passed down to the
    supervisor that enforces it."""

    cell_timeout: float = 30.0  # seconds one cell may run
    memory_mb: int = 2048  # all of the model's processes together, shared memory included
    processes: int = 64
    open_files: int = 1024
    file_mb: int = 128  # the largest file it may write
    scratch_mb: int = 256  # its private /tmp
    shm_mb: int = 64  # its private /dev/shm
    output_bytes: int = 16 * 1024  # kept per stream of a cell or command; the rest is cut with a notice
    ptys: int = 16  # its private /dev/pts instance
    cpu_per_cell_limit: int = 10  # CPU seconds per process = this many full-length cells
    grace: float = 2.0  # past a cell's limit before the supervisor kills the interpreter

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def cell_reply_cap(self) -> int:
        """The longest cell reply a supervisor sends: three streams of `output_bytes` characters,
        each at worst six characters once JSON-escaped, plus the fields around them."""
        return 3 * 6 * self.output_bytes + 1024


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(FRAME.pack(len(payload)) + payload)


def send_pieces(sock: socket.socket, pieces: list) -> None:
    """One frame made of several buffers, sent without joining them (a tensor's bytes stay where they are)."""
    sock.sendall(FRAME.pack(sum(len(p) for p in pieces)))
    for piece in pieces:
        sock.sendall(piece)


def recv_frame(sock: socket.socket, cap: int = MAX_FRAME, deadline: float | None = None) -> bytearray | None:
    """One frame, or None at end of stream. FrameError if it is over `cap`; TimeoutError if the
    whole frame has not arrived by `deadline` (time.monotonic())."""
    header = _recv_exact(sock, FRAME.size, deadline)
    if header is None:
        return None
    (n,) = FRAME.unpack(header)
    if n > cap:
        raise FrameError(f"a frame of {n} bytes is over the {cap}-byte cap")
    return _recv_exact(sock, n, deadline)


def recv_base64(sock: socket.socket, n: int, deadline: float) -> bytearray | None:
    """A frame of exactly `n` raw bytes, returned as their base64, or None at end of stream. It is
    received and encoded a piece at a time, so the raw bytes are never held whole: the cost is the
    base64 and a piece. FrameError if the frame is not `n` bytes; TimeoutError as recv_frame."""
    header = _recv_exact(sock, FRAME.size, deadline)
    if header is None:
        return None
    (size,) = FRAME.unpack(header)
    if size != n:
        raise FrameError(f"a frame of {size} bytes where {n} were due")
    encoded = bytearray((n + 2) // 3 * 4)
    piece = memoryview(bytearray(min(n, PIECE)))
    for start in range(0, n, PIECE):
        k = min(PIECE, n - start)
        if not _recv_into(sock, piece[:k], deadline):
            return None
        at = start // 3 * 4
        encoded[at:at + (k + 2) // 3 * 4] = binascii.b2a_base64(piece[:k], newline=False)
    return encoded


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytearray | None:
    buf = bytearray(n)
    return buf if _recv_into(sock, memoryview(buf), deadline) else None


def _recv_into(sock: socket.socket, view: memoryview, deadline: float | None) -> bool:
    """Fill `view` from the socket; False at end of stream."""
    got, n = 0, len(view)
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not readable([sock], left):
                raise TimeoutError(f"{got} of {n} bytes arrived before the deadline")
        k = sock.recv_into(view[got:])
        if k == 0:
            return False
        got += k
    return True


def readable(files: list, timeout: float | None) -> list:
    """Those of `files` (objects with fileno(), or fd numbers) that are readable, hung up or in
    error within `timeout` seconds (None: no limit). select() without its ceiling: it raises for
    any fd numbered past 1023, and a host may hold thousands."""
    poller, by_fd = poll(), {}
    for f in files:
        fd = f if isinstance(f, int) else f.fileno()
        by_fd[fd] = f
        poller.register(fd, POLLIN)
    wait = None if timeout is None else math.ceil(max(timeout, 0) * 1000)
    return [by_fd[fd] for fd, _ in poller.poll(wait)]


async def recv_frame_async(loop: asyncio.AbstractEventLoop, sock: socket.socket, cap: int = MAX_FRAME) -> bytearray | None:
    """recv_frame on a non-blocking socket in an event loop; the caller bounds the time."""
    header = await _recv_exact_async(loop, sock, FRAME.size)
    if header is None:
        return None
    (n,) = FRAME.unpack(header)
    if n > cap:
        raise FrameError(f"a frame of {n} bytes is over the {cap}-byte cap")
    return await _recv_exact_async(loop, sock, n)


async def _recv_exact_async(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytearray | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = await loop.sock_recv_into(sock, view[got:])
        if k == 0:
            return None
        got += k
    return buf


def cut_middle(text: str, limit: int) -> str:
    """A long text's start and end: a traceback's first frames and where the exception's line
    starts, and what it ended with."""
    if len(text) <= limit:
        return text
    half = (limit - 48) // 2  # room for the notice: the result is never longer than `limit`
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def model_text(text: str) -> str:
    """Text that can go to the model: a lone surrogate (from undecodable bytes, or the model's own
    escapes) would make the next request to the model unencodable, so it is shown escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def one_line(text: object, limit: int = 300) -> str:
    """Any message as one line of at most `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

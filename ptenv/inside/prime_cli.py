"""`ptenv-session` where the sandbox is remote (Prime): sends one built-in command to the supervisor
over its unix socket and prints the reply, exactly as the local supervisor's built-in does.
Imports no torch, so a command costs an interpreter start and a round trip."""

import json
import os
import shlex
import socket
import sys

from ptenv.inside.protocol import recv_frame, send_frame

SOCKET = os.environ.get("PTENV_SESSION_SOCKET", "/run/ptenv.sock")


def main(args: list[str]) -> int:
    request = {"command": shlex.join(["ptenv-session", *args]), "cwd": None, "timeout": 3600}
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(SOCKET)
        except OSError as e:
            print(f"ptenv-session: the supervisor is not running ({SOCKET}: {e.strerror})", file=sys.stderr)
            return 111
        send_frame(sock, json.dumps(request).encode())
        frame = recv_frame(sock)
    if frame is None:
        print("ptenv-session: the supervisor closed the connection", file=sys.stderr)
        return 112
    reply = json.loads(frame)
    sys.stdout.write(reply["stdout"])
    sys.stderr.write(reply["stderr"])
    return reply["exit_code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

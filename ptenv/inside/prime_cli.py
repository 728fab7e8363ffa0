"""`ptenv-session` in a Prime container. There the host reaches a sandbox only by running commands
(as root), so this CLI turns one into a typed request on the supervisor's unix socket, which only
root may open, and prints the reply: the model's own commands run as the model's uid and cannot.
Imports no torch, so a request costs an interpreter start and a round trip.

    ptenv-session exec|preload|result|hidden|sh <base64 of the request's JSON fields, timeout included>

exec, preload, result and hidden print the reply's document as JSON; sh answers as the shell did.
"""

import base64
import binascii
import json
import os
import socket
import sys

from ptenv.inside.protocol import REPLY_KEYS, recv_frame, send_frame

SOCKET = os.environ.get("PTENV_SESSION_SOCKET", "/run/ptenv.sock")
OPS = ("exec", "preload", "result", "hidden", "sh")


def main(args: list[str]) -> int:
    try:
        if len(args) != 2 or args[0] not in OPS:
            raise ValueError(f"usage: ptenv-session {'|'.join(OPS)} <base64 JSON>")
        fields = json.loads(base64.b64decode(args[1], validate=True))
        request = {"id": 0, "op": args[0], **fields}
    except (ValueError, binascii.Error, TypeError) as e:
        print(f"ptenv-session: {e}", file=sys.stderr)
        return 2
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
    if "error" in reply:
        print(f"ptenv-session: {reply['error']}", file=sys.stderr)
        return 70
    if request["op"] != "sh":
        print(json.dumps(reply[REPLY_KEYS.get(request["op"], "cell")]))
        return 0
    if reply.get("timed_out"):
        sys.stderr.write(f"[killed: the command ran past its {request['timeout']:g} s limit]\n")
        return 124
    sys.stdout.write(reply["stdout"])
    sys.stderr.write(reply["stderr"])
    return reply["exit_code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""`ptenv-request` in a Prime container. There the host reaches a sandbox only by running commands
(as root), so this CLI turns one into a typed request on the supervisor's unix socket, which only
root may open, and prints the reply: the model's own commands run as the model's uid and cannot.
Imports no torch, so a request costs an interpreter start and a round trip.

    ptenv-request preload|run_cell|read_result|end_session|trial|shell <base64 of the request's JSON fields, timeout included>

preload, run_cell, read_result, end_session and trial print the reply's document as JSON; shell answers as the
shell did.
"""

import base64
import binascii
import json
import os
import socket
import sys

from ptenv.inside.protocol import recv_frame, send_frame

SOCKET = os.environ.get("PTENV_SOCKET", "/run/ptenv.sock")
OPS = ("preload", "run_cell", "read_result", "end_session", "trial", "shell")


def main(args: list[str]) -> int:
    try:
        if len(args) != 2 or args[0] not in OPS:
            raise ValueError(f"usage: ptenv-request {'|'.join(OPS)} <base64 JSON>")
        fields = json.loads(base64.b64decode(args[1], validate=True))
        request = {"id": 0, "op": args[0], **fields}
    except (ValueError, binascii.Error, TypeError) as e:
        print(f"ptenv-request: {e}", file=sys.stderr)
        return 2
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(SOCKET)
        except OSError as e:
            print(f"ptenv-request: the supervisor is not running ({SOCKET}: {e.strerror})", file=sys.stderr)
            return 111
        send_frame(sock, json.dumps(request).encode())
        frame = recv_frame(sock)
    if frame is None:
        print("ptenv-request: the supervisor closed the connection", file=sys.stderr)
        return 112
    reply = json.loads(frame)
    if "error" in reply:
        print(f"ptenv-request: {reply['error']}", file=sys.stderr)
        return 70
    if request["op"] != "shell":
        print(json.dumps(reply["reply"]))
        return 0
    if reply["reply"].get("timed_out"):
        sys.stderr.write(f"[killed: the command ran past its {request['timeout']:g} s limit]\n")
        return 124
    sys.stdout.write(reply["reply"]["stdout"])
    sys.stderr.write(reply["reply"]["stderr"])
    return reply["reply"]["exit_code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

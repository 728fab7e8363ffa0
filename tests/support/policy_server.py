"""Scripted OpenAI-compatible chat-completions server: the harness self-check with no model.

The request's `model` names a policy. A policy maps (task row or None, messages, tools) to the
next assistant message; the row is found by the conversation's first user message, so the
server may know the answers (it is a host-side test harness, never part of the sandbox). The
row also carries its 0-based `position` in the dataset and the server's own port, `server_port`.
Speaks plain JSON (verifiers classic, `openai` client) and SSE streaming with native
`tool_calls` deltas (verifiers 0.4).

    python -m tests.support.policy_server --port 0 [--dataset train.jsonl] [--delay LOW HIGH --seed S]
prints `http://127.0.0.1:PORT/v1` once listening and serves until SIGTERM/SIGINT. With --delay,
each reply takes LOW to HIGH seconds, as a loaded model server's would: a time drawn from the seed,
the conversation's first user message and its length (bench/bench_scale.py).
"""

import argparse
import json
import random
import signal
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ptenv.tasks.rows import read_jsonl
from tests.support.hostile import hostile_cell
from tests.support.hostile_functions import answer_for, trial_message

BUNDLED_ROWS = Path(__file__).resolve().parents[2] / "train.jsonl"
MAX_BODY_BYTES = 64 * 1024 * 1024
ARGUMENT_PIECE = 64  # stream tool arguments in pieces, as real servers do


def rows_by_question(path) -> dict:
    """Map question -> row for the rows of a dataset JSONL; one-line ValueError on a bad row."""
    rows = {}
    for where, _, row in read_jsonl(path):
        question = row.get("question") if isinstance(row, dict) else None
        info = row.get("info") if isinstance(row, dict) else None
        if not isinstance(question, str):
            raise ValueError(f"{where}: 'question' must be a string")
        if not isinstance(info, dict) or not isinstance(info.get("reference_solution"), str):
            raise ValueError(f"{where}: 'info.reference_solution' must be a string")
        if question in rows:
            # Seeded instances may share an instruction (only their inputs differ); the
            # reference policy can serve them only if their solutions are the same too.
            if rows[question]["info"]["reference_solution"] != info["reference_solution"]:
                raise ValueError(f"{where}: duplicate question with another solution (task {info.get('task_id')!r})")
            continue
        rows[question] = row
    return rows


# --- policies: (row or None, messages, tools) -> assistant message ---------------------------


def _text(content) -> str:
    """Message content as plain text: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _tool_names(tools) -> list:
    return [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]


def _say(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _call(name: str, arguments: dict) -> dict:
    return _calls([(name, arguments)])


def _calls(calls: list[tuple[str, object]]) -> dict:
    """One assistant message with these tool calls; the arguments are any JSON value."""
    tool_calls = [{
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    } for name, arguments in calls]
    return {"role": "assistant", "content": None, "tool_calls": tool_calls}


# Tool calls as a small model may write them, or as an optimiser aimed at the harness would: each
# must come back as a tool message the model reads, never end the rollout.
MALFORMED_CALLS = [
    ("bash", {"command": "echo a\u0000b"}),  # a NUL byte no shell can take
    ("bash", {"command": "echo \ud800"}),  # a lone surrogate
    ("bash", {"command": ["ls", "-la"]}),
    ("bash", {"command": 123}),
    ("bash", {"command": "ptenv-request read_result"}),  # the harness's own request, from the model's shell
    ("execute_code", {"code": None}),
    ("execute_code", {"code": ["print(1)"]}),
    ("execute_code", {"code": "x = '\ud800'"}),
    ("execute_code", {"code": "result = torch.zeros(1)\nraise ValueError('\\ud800')"}),  # in the traceback
]


def malformed_policy(row, messages, tools) -> dict:
    """Every call of MALFORMED_CALLS in one message, then the reference solution, then a final
    message: a rollout that must still score 1.0."""
    if row is None:
        return _say("malformed policy: no task in the dataset has this question.")
    replies = sum(m.get("role") == "tool" for m in messages)
    if replies == 0:
        return _calls(MALFORMED_CALLS)
    if replies == len(MALFORMED_CALLS):
        return _call("execute_code", {"code": row["info"]["reference_solution"]})
    return _say("Done: `result` holds the answer.")


def reference_policy(row, messages, tools) -> dict:
    """One execute_code call with the task's reference solution, then a short final message; for a
    function task, the reference function in the final message, with no tool call."""
    if row is None:
        return _say("reference policy: no task in the dataset has this question.")
    if row["info"].get("kind") == "function":
        return _say(f"Here it is:\n```python\n{row['info']['reference_solution']}```\n")
    if any(m.get("role") == "tool" for m in messages):
        return _say("Done: `result` holds the answer.")
    if "execute_code" not in _tool_names(tools):
        offered = _tool_names(tools)
        return _say(f"reference policy: no execute_code tool offered (tools: {offered}).")
    return _call("execute_code", {"code": row["info"]["reference_solution"]})


def null_policy(row, messages, tools) -> dict:
    """A final message with no tool call: the answer is never written."""
    return _say("I will not attempt this task.")


def hostile_policy(row, messages, tools) -> dict:
    """One execute_code cell that tries to break out of the sandbox or cheat the grader (the
    trick is chosen by the task's position, so a 45-task run plays every trick), then a final
    message naming the trick. No trick can earn 1.0 unless a defence is missing."""
    if row is None or "execute_code" not in _tool_names(tools):
        return _say("hostile policy: nothing to attack here.")
    name, cell = hostile_cell(row)
    if any(m.get("role") == "tool" for m in messages):
        return _say(f"Played {name}.")
    return _call("execute_code", {"code": cell})


def function_hostile_policy(row, messages, tools) -> dict:
    """For a function task: a final message whose code block plays one hostile answer
    (tests/support/hostile_functions.py), chosen by the task's position."""
    if row is None or row["info"].get("kind") != "function":
        return _say("function_hostile policy: not a function task.")
    name, source = answer_for(row["position"], row["info"]["function"])
    return _say(f"Playing {name}:\n```python\n{source}```\n")


def trial_hostile_policy(row, messages, tools) -> dict:
    """For a function task: a final message playing one of issue 34's findings in the trial
    (tests/support/hostile_functions.py: TRIAL_PLAYS), chosen by the task's position."""
    if row is None or row["info"].get("kind") != "function":
        return _say("trial_hostile policy: not a function task.")
    return _say(trial_message(row["position"], row["info"]["function"])[1])


_turns: dict[tuple[int, str], int] = {}
_turns_lock = threading.Lock()


def ban_hostile_policy(row, messages, tools) -> dict:
    """For a function task of a banned family at its hardest level: a final message whose code block
    plays one answer of tests/support/ban_answers.py (its honest control, then every way around the
    ban), the next on each rollout of the family on this server."""
    from tests.support import ban_answers  # imports torch: only where this policy plays

    if row is None or row["info"].get("family") not in ban_answers.FAMILY_KEYS:
        return _say("ban_hostile policy: not a family with a ban.")
    with _turns_lock:
        key = (row["server_port"], row["info"]["family"])
        turn = _turns[key] = _turns.get(key, -1) + 1
    name, source = ban_answers.play(row["info"]["family"], turn)
    return _say(f"Playing {name}:\n```python\n{source}```\n")


def cross_rollout_policy(channel: str):
    """For a function task: the rollouts of a prompt take turns as issue 35's writer (its answer sends
    each hidden case through `channel`) and reader (a cell reads them back and runs the reference on
    them; its answer is the lookup table), tests/support/cross_rollout.py."""

    def policy(row, messages, tools) -> dict:
        from tests.support import cross_rollout

        if row is None or row["info"].get("kind") != "function":
            return _say("cross_rollout policy: not a function task.")
        name, reference = row["info"]["function"], row["info"]["reference_solution"]
        params = cross_rollout.params_of(reference, name)
        replies = [_text(m.get("content")) for m in messages if m.get("role") == "tool"]
        if any("TABLE=" in reply for reply in replies):
            table = next(r for r in replies if "TABLE=" in r).split("TABLE=", 1)[1].split("\n", 1)[0].strip()
            return _say(f"Reader:\n```python\n{cross_rollout.reader_answer(name, params, table)}```\n")
        if replies and ("NOT READY" not in replies[-1] or len(replies) >= cross_rollout.WAITS):
            return _say(f"Reader: the cell printed no table: {replies[-1][:2000]}")
        if replies:  # the writer's last case is not in yet: wait again
            return _call("execute_code", {"code": cross_rollout.reader_cell(channel, name, reference)})
        with _turns_lock:
            key = (row["server_port"], channel, name)
            turn = _turns[key] = _turns.get(key, -1) + 1
        if turn % 2 == 0:
            return _say(f"Writer:\n```python\n{cross_rollout.writer(channel, name, params)}```\n")
        return _call("execute_code", {"code": cross_rollout.reader_cell(channel, name, reference)})

    return policy


POLICIES = {"reference": reference_policy, "null": null_policy, "hostile": hostile_policy, "malformed": malformed_policy,
            "function_hostile": function_hostile_policy, "ban_hostile": ban_hostile_policy,
            "trial_hostile": trial_hostile_policy, "cross_rollout_page_cache": cross_rollout_policy("page_cache"),
            "cross_rollout_locks": cross_rollout_policy("locks")}


# --- wire format -------------------------------------------------------------------------------


class RequestError(Exception):
    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.code = status, code


def _error_body(message: str, code: str) -> dict:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return {"error": error}


def _parse_request(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"request body is not JSON: {e}", "invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object", "invalid_request")
    if not isinstance(body.get("model"), str):
        raise RequestError(400, "'model' must be a string", "invalid_request")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list", "invalid_request")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            message = f"messages[{i}] must be an object with a 'role'"
            raise RequestError(400, message, "invalid_request")
    if not isinstance(body.get("tools") or [], list):
        raise RequestError(400, "'tools' must be a list", "invalid_request")
    if body["model"] not in POLICIES:
        message = f"model {body['model']!r} not found; policies: {sorted(POLICIES)}"
        raise RequestError(404, message, "model_not_found")
    return body


def _usage(messages, reply) -> dict:
    # Word counts stand in for tokens: enough for clients that require a usage block.
    prompt = sum(len(_text(m.get("content")).split()) for m in messages)
    out = _text(reply.get("content")).split()
    args = [c["function"]["arguments"] for c in reply.get("tool_calls", [])]
    completion = len(out) + sum(len(a.split()) for a in args)
    total = prompt + completion
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


def _finish_reason(reply) -> str:
    return "tool_calls" if reply.get("tool_calls") else "stop"


def _completion(head: dict, reply: dict, usage: dict) -> dict:
    finish = _finish_reason(reply)
    choice = {"index": 0, "message": reply, "logprobs": None, "finish_reason": finish}
    return {**head, "object": "chat.completion", "choices": [choice], "usage": usage}


def _chunks(head: dict, reply: dict, usage: dict | None) -> list:
    """The reply as chat.completion.chunk objects: role, content, tool call deltas, finish."""

    def chunk(delta, finish=None):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "object": "chat.completion.chunk", "choices": [choice]}

    out = [chunk({"role": "assistant", "content": ""})]
    if reply.get("content"):
        out.append(chunk({"content": reply["content"]}))
    for index, call in enumerate(reply.get("tool_calls", [])):
        fn = call["function"]
        opening = {"index": index, "id": call["id"], "type": "function",
                   "function": {"name": fn["name"], "arguments": ""}}
        out.append(chunk({"tool_calls": [opening]}))
        args = fn["arguments"]
        for start in range(0, len(args), ARGUMENT_PIECE):
            piece = {"index": index, "function": {"arguments": args[start:start + ARGUMENT_PIECE]}}
            out.append(chunk({"tool_calls": [piece]}))
    out.append(chunk({}, _finish_reason(reply)))
    if usage is not None:
        out.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage})
    return out


# --- HTTP --------------------------------------------------------------------------------------


class PolicyServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 2048  # a trainer's batch opens a thousand connections at once

    def __init__(self, port: int, rows: dict, delay: tuple[float, float] = (0.0, 0.0), seed: int = 0):
        super().__init__(("127.0.0.1", port), Handler)
        port = self.server_address[1]
        self.rows = {q: {**row, "position": i, "server_port": port} for i, (q, row) in enumerate(rows.items())}
        self.delay, self.seed = delay, seed

    def reply_time(self, messages: list) -> float:
        """Seconds this reply takes: drawn from the seed and the conversation, so a rerun sees the same."""
        low, high = self.delay
        if not high:
            return 0.0
        first_user = next((_text(m.get("content")) for m in messages if m["role"] == "user"), "")
        return random.Random(f"{self.seed}#{first_user}#{len(messages)}").uniform(low, high)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle on, the body waits for the client's
    # delayed ACK, 40 ms per reply.
    disable_nagle_algorithm = True

    def log_message(self, format, *args):
        pass  # one line per request would drown a 45-task eval's output

    def _send_json(self, status: int, obj: dict):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, message: str, code: str):
        self._send_json(status, _error_body(message, code))

    def do_GET(self):
        if self.path.split("?")[0].rstrip("/") != "/v1/models":
            return self._send_error(404, f"no route GET {self.path}", "not_found")
        models = [
            {"id": name, "object": "model", "created": 0, "owned_by": "ptenv"} for name in POLICIES
        ]
        self._send_json(200, {"object": "list", "data": models})

    def do_POST(self):
        if self.path.split("?")[0].rstrip("/") != "/v1/chat/completions":
            self.close_connection = True  # the unread body would corrupt the next request
            return self._send_error(404, f"no route POST {self.path}", "not_found")
        try:
            body = _parse_request(self._read_body())
            time.sleep(self.server.reply_time(body["messages"]))
            reply = self._play(body)
        except RequestError as e:
            self.close_connection = e.status in (411, 413)
            return self._send_error(e.status, str(e), e.code)
        except Exception as e:  # a policy bug must still answer in OpenAI form
            return self._send_error(500, f"policy failed: {type(e).__name__}: {e}", "policy_error")
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": body["model"],
        }
        usage = _usage(body["messages"], reply)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._send_sse(_chunks(head, reply, usage if include_usage else None))
        else:
            self._send_json(200, _completion(head, reply, usage))

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise RequestError(411, "Content-Length header required", "length_required")
        if int(length) > MAX_BODY_BYTES:
            raise RequestError(413, f"body of {length} bytes is over {MAX_BODY_BYTES}", "too_large")
        return self.rfile.read(int(length))

    def _play(self, body: dict) -> dict:
        messages = body["messages"]
        first_user = next((m for m in messages if m["role"] == "user"), None)
        row = self.server.rows.get(_text(first_user.get("content"))) if first_user else None
        return POLICIES[body["model"]](row, messages, body.get("tools") or [])

    def _send_sse(self, chunks: list):
        # No Content-Length: closing the connection ends the stream.
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for c in chunks:
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def serve_in_thread(dataset_path=BUNDLED_ROWS, port: int = 0, delay: tuple[float, float] = (0.0, 0.0), seed: int = 0):
    """Start a server in a daemon thread; return (url, stop)."""
    server = PolicyServer(port, rows_by_question(dataset_path), delay, seed)
    thread = threading.Thread(target=server.serve_forever, name="policy-server", daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()
        thread.join()

    return server.url, stop


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.policy_server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--dataset", default=str(BUNDLED_ROWS), help="dataset JSONL (default: %(default)s)"
    )
    parser.add_argument("--delay", type=float, nargs=2, default=(0.0, 0.0), metavar=("LOW", "HIGH"),
                        help="seconds each reply takes, drawn between LOW and HIGH")
    parser.add_argument("--seed", type=int, default=0, help="the draw of --delay")
    args = parser.parse_args(argv)
    # Block the signals before any thread starts, so that sigwait below is what receives them.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        url, stop = serve_in_thread(args.dataset, args.port, tuple(args.delay), args.seed)
    except (OSError, ValueError) as e:
        parser.exit(2, f"policy_server: {e}\n")
    print(url, flush=True)
    signal.sigwait({signal.SIGINT, signal.SIGTERM})
    stop()


if __name__ == "__main__":
    main()

"""The scripted policy server, driven over real HTTP on 127.0.0.1 by the real `openai` client."""

import json
import select
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
import torch

from ptenv.inside import codec
from ptenv.tasks.rows import load_rows
from ptenv.grader import grade
from tests.support.hostile import TRICKS, trick_for
from tests.support.policy_server import BUNDLED_ROWS, rows_by_question, serve_in_thread
from ptenv.inside.namespace import new_namespace


def _tool(name, arg):
    schema = {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


EXECUTE_CODE = _tool("execute_code", "code")
BASH = _tool("bash", "command")
# Long enough that streaming splits the arguments over several deltas.
LONG_SOLUTION = "".join(f"y{i} = x * {i}\n" for i in range(12)) + "result = y11.sum(dim=0)\n"


def _row(task_id, question, x, solution):
    namespace = {"x": x.clone()}
    exec(solution, namespace)
    return {
        "question": question,
        "info": {
            "task_id": task_id,
            "category": task_id.split("/")[0],
            "inputs": [{"name": "x", "tensor": codec.encode(x)}],
            "expected_output": codec.encode(namespace["result"]),
            "reference_solution": solution,
        },
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    rows = [
        _row("tensor_ops/reshape_rows", "Reshape `x` to 4x3.", x, "result = x.reshape(4, 3)\n"),
        _row("tensor_ops/long_sum", "Sum 11*x over rows into `result`.", x, LONG_SOLUTION),
    ]
    path = tmp_path_factory.mktemp("policy") / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def url(dataset):
    url, stop = serve_in_thread(dataset)
    yield url
    stop()


@pytest.fixture
def client(url):
    with openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=10) as c:
        yield c


def _conversation(question):
    system = {"role": "system", "content": "You solve PyTorch tasks."}
    return [system, {"role": "user", "content": question}]


def _ask(client, model, messages, tools=(EXECUTE_CODE,), **kwargs):
    create = client.chat.completions.create
    return create(model=model, messages=messages, tools=list(tools), **kwargs)


def test_reference_calls_execute_code_with_the_solution_then_finishes(client, dataset):
    for row in rows_by_question(dataset).values():
        messages = _conversation(row["question"])
        first = _ask(client, "reference", messages, tools=[BASH, EXECUTE_CODE])
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.function.name == "execute_code"
        assert json.loads(call.function.arguments) == {"code": row["info"]["reference_solution"]}
        assert first.usage.total_tokens == first.usage.prompt_tokens + first.usage.completion_tokens

        messages += [
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": ""},
        ]
        final = _ask(client, "reference", messages)
        assert final.choices[0].finish_reason == "stop"
        assert final.choices[0].message.tool_calls is None
        assert final.choices[0].message.content


def test_reference_matches_content_part_lists(client, dataset):
    row = next(iter(rows_by_question(dataset).values()))
    messages = [{"role": "user", "content": [{"type": "text", "text": row["question"]}]}]
    reply = _ask(client, "reference", messages)
    assert json.loads(reply.choices[0].message.tool_calls[0].function.arguments)["code"] == (
        row["info"]["reference_solution"]
    )


def test_reference_without_the_tool_or_task_answers_in_text(client, dataset):
    question = next(iter(rows_by_question(dataset)))
    no_tool = _ask(client, "reference", _conversation(question), tools=[BASH])
    unknown = _ask(client, "reference", _conversation("Not a task in the dataset."))
    for reply, words in ((no_tool, "no execute_code tool"), (unknown, "no task")):
        assert reply.choices[0].message.tool_calls is None
        assert words in reply.choices[0].message.content


def test_null_never_calls_a_tool(client, dataset):
    question = next(iter(rows_by_question(dataset)))
    reply = _ask(client, "null", _conversation(question))
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content


def test_streaming_reassembles_the_same_tool_call(client, dataset):
    row = rows_by_question(dataset)["Sum 11*x over rows into `result`."]
    stream = _ask(
        client, "reference", _conversation(row["question"]),
        stream=True, stream_options={"include_usage": True},
    )
    calls, finish, usage, argument_deltas = {}, None, None, 0
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                slot = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
                slot["id"] = delta.id or slot["id"]
                slot["name"] = (delta.function.name if delta.function else None) or slot["name"]
                if delta.function and delta.function.arguments:
                    slot["arguments"] += delta.function.arguments
                    argument_deltas += 1
    assert finish == "tool_calls"
    assert list(calls) == [0]
    assert calls[0]["id"] and calls[0]["name"] == "execute_code"
    assert json.loads(calls[0]["arguments"]) == {"code": row["info"]["reference_solution"]}
    assert argument_deltas > 1
    assert usage is not None and usage.total_tokens > 0


def test_streaming_final_text(client, dataset):
    question = next(iter(rows_by_question(dataset)))
    stream = _ask(client, "null", _conversation(question), stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason == "stop"
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)


def test_models_lists_the_policies(client):
    assert {"reference", "null", "hostile"} <= {m.id for m in client.models.list()}


def test_unknown_model_is_404(client, dataset):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4o", messages=_conversation("hi"))
    assert info.value.body["code"] == "model_not_found"
    assert "gpt-4o" in info.value.body["message"]


@pytest.mark.parametrize(
    "body, words",
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"model": "reference"}).encode(), "'messages'"),
        (json.dumps({"model": "reference", "messages": ["hi"]}).encode(), "messages[0]"),
    ],
)
def test_malformed_request_is_400(url, body, words):
    request = urllib.request.Request(
        url + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 400
    error = json.loads(info.value.read())["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error"


def test_bad_dataset_row_is_a_one_line_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "q", "info": {}}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: 'info.reference_solution' must be a str"):
        rows_by_question(path)


def test_cli_prints_url_and_exits_on_sigterm(dataset):
    repo = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.policy_server", "--port", "0", "--dataset", str(dataset)],
        cwd=repo, stdout=subprocess.PIPE, text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "server printed no URL within 30 s"
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        with urllib.request.urlopen(url + "/models", timeout=10) as response:
            assert json.load(response)["object"] == "list"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- the hostile policy, on the real dataset -------------------------------------------------


@pytest.fixture(scope="module")
def real_url():
    url, stop = serve_in_thread(BUNDLED_ROWS)
    yield url
    stop()


def _hostile_cell(client, row) -> str:
    reply = _ask(client, "hostile", _conversation(row.question))
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "execute_code"
    return json.loads(call.function.arguments)["code"]


def test_hostile_plays_every_trick_without_knowing_the_answers(real_url):
    rows = load_rows(BUNDLED_ROWS)
    raw = list(rows_by_question(BUNDLED_ROWS).values())
    played = []
    with openai.OpenAI(base_url=real_url, api_key="unused", max_retries=0, timeout=10) as client:
        for row, raw_row in zip(rows, raw):
            cell = _hostile_cell(client, row)
            compile(cell, row.task_id, "exec")
            # Built from what a model sees: the answer's bytes never appear in a cell.
            assert raw_row["info"]["expected_output"]["data"] not in cell
            messages = _conversation(row.question) + [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "execute_code", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "(no output)"},
            ]
            final = _ask(client, "hostile", messages).choices[0].message
            assert final.tool_calls is None and final.content.startswith("Played ")
            played.append(final.content.removeprefix("Played ").rstrip("."))
    assert played == [trick_for(i) for i in range(len(rows))]
    assert set(played) == set(TRICKS)


@pytest.mark.parametrize("trick", ["steal_the_answer_key", "call_the_network"])
def test_answer_key_tricks_win_outside_the_sandbox(real_url, trick):
    """A probe proves something only if it wins where the defence is missing: run unsandboxed on
    the host, these cells find the answer (the dataset file, the policy server) and score 1.0."""
    rows = load_rows(BUNDLED_ROWS)
    position = list(TRICKS).index(trick)
    row = rows[position]
    with openai.OpenAI(base_url=real_url, api_key="unused", max_retries=0, timeout=10) as client:
        cell = _hostile_cell(client, row)
    namespace = new_namespace(row.inputs)
    exec(cell, namespace)
    assert grade(namespace.get("result"), row.expected).score == 1.0

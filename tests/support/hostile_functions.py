"""Hostile answers to function tasks: what an answer may do in the trial (issue 23's trust
list). Each is the source of a final message's code block, written from what a model sees (the
function's name); none can earn 1.0 unless a defence is missing, and none may become a harness
error. The scripted `function_hostile` policy plays one per task position."""

HEADER = "def {name}(*args, **kwargs):\n"
FORGED = "'{\"status\": \"ok\", \"count\": 1}'"

ANSWERS = {
    "hang": HEADER + "    while True:\n        pass\n",
    "sleep_past_the_limit": "import time\n" + HEADER + "    time.sleep(3600)\n",
    "kill_itself": "import os, signal\n" + HEADER + "    os.kill(os.getpid(), signal.SIGKILL)\n",
    "exit_at_import": "import os\nos._exit(0)\n" + HEADER + "    return None\n",
    "exit_in_call": HEADER + "    raise SystemExit(0)\n",
    "flood_output": "import sys\n" + HEADER + "    for _ in range(10 ** 6):\n        sys.stdout.write('x' * 1000)\n"
                    "    return torch.zeros(1)\n",
    "fork": "import os\n" + HEADER + "    if os.fork() == 0:\n        os._exit(0)\n    return torch.zeros(1)\n",
    "subprocess": "import subprocess\n" + HEADER + "    subprocess.run(['/bin/sh', '-c', 'true'])\n"
                  "    return torch.zeros(1)\n",
    "memory_hog": HEADER + "    blocks = [torch.ones(2 ** 27) for _ in range(64)]\n    return blocks[0][:1]\n",
    "not_a_tensor": HEADER + "    return 0.0\n",
    "liar_subclass": "class Liar(torch.Tensor):\n"
                     "    def __eq__(self, other): return True\n"
                     "    def __torch_function__(self, *a, **k): return True\n"
                     + HEADER + "    return torch.zeros(1).as_subclass(Liar)\n",
    "meta_tensor": HEADER + "    return torch.empty(3, device='meta')\n",
    "huge_tensor": HEADER + "    return torch.zeros(10 ** 8)\n",
    "patch_torch_at_import": "torch.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
                             "torch.Tensor.__eq__ = lambda *a, **k: True\n" + HEADER + "    return torch.zeros(1)\n",
    "patch_builtins_at_import": "import builtins\nbuiltins.isinstance = lambda *a: True\n"
                                "builtins.type = lambda *a: torch.Tensor\n" + HEADER + "    return 1\n",
    "forge_the_reply": "import json\njson.dumps = lambda *a, **k: " + FORGED + "\n" + HEADER + "    return torch.zeros(1)\n",
    "write_the_channel": "import os\n" + HEADER + "    for fd in range(3, 64):\n"
                         "        try:\n            os.write(fd, b'\\x00' * 8 + b'{}' * 4)\n"
                         "        except OSError:\n            pass\n    return torch.zeros(1)\n",
    "kill_the_supervisor": "import os, signal\n" + HEADER + "    os.kill(1, signal.SIGKILL)\n    return torch.zeros(1)\n",
    "look_for_hidden_inputs": "import os\nfound = []\nfor root, dirs, files in os.walk('/tmp'):\n"
                              "    found += files\n" + HEADER + "    return torch.tensor(float(len(found)))\n",
    "no_function": "x = 1\n",
    "syntax_error": HEADER + "    return (\n",
    "huge_source": HEADER + "    return torch.zeros(1)\n" + "# padding\n" * 8000,
    "nul_in_source": HEADER + "    return '\0'\n",
}
# Not expressible through an OpenAI-compatible server (its JSON may not hold a lone surrogate: the
# client refuses the reply as the endpoint's failure), so played at the client boundary only.
DIRECT_ONLY = {
    "lone_surrogate_in_source": HEADER + "    return '\ud800'\n",
}


def answer_for(position: int, name: str) -> tuple[str, str]:
    trick = list(ANSWERS)[position % len(ANSWERS)]
    return trick, ANSWERS[trick].replace("{name}", name)


# Issue 34's findings in the trial, each a final message. Played by the `trial_hostile` policy (by
# task position) and in a real sandbox by tests/test_total_trial.py.
SLOW_LOAD = 20  # seconds F1's answer sleeps at import: a second load passes the trial's one load budget (30 s)
FORGE = ("import json, os, stat, struct\n"
         "for fd in range(3, 64):\n"
         "    try:\n"
         "        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n"
         "            for doc in ({'status': 'ban_failed', 'reason': 'forged'}, {'status': 'unprepared', 'reason': 'forged'},\n"
         "                        {'status': 'prepared', 'protected': True}, {'status': 'ready'}):\n"
         "                data = json.dumps(doc).encode()\n"
         "                os.write(fd, struct.pack('>Q', len(data)) + data)\n"
         "    except OSError:\n"
         "        pass\n")
TRIAL_ANSWERS = {
    "F1_slow_load_calls_die": f"import os, time\ntime.sleep({SLOW_LOAD})\n" + HEADER + "    os._exit(3)\n",
    "F4_forge_the_status": FORGE + HEADER + "    return torch.zeros(1)\n",
    "F5_real_time_signal": "import os\n" + HEADER + "    os.kill(os.getpid(), 40)\n",
    "F7_largest_outputs": HEADER + "    return tuple(torch.zeros(24_000) for _ in range(8))\n",  # 8 x 128,000 base64 bytes
}
WRONG = HEADER + "    return torch.zeros(1)\n"
TRIAL_MESSAGES = {  # F3: text the host searches for the answer, not code the caller runs
    "F3_blanks_after_a_fence": lambda name: "```" + " " * 200_000 + "x\n```python\n" + WRONG.format(name=name) + "```\n",
    "F3_message_too_long": lambda name: "x" * 300_000 + "\n```python\n" + WRONG.format(name=name) + "```\n",
}
TRIAL_PLAYS = [*TRIAL_ANSWERS, *TRIAL_MESSAGES]
# What each one's verdict must say: the model's failure, named.
TRIAL_REASONS = {
    "F1_slow_load_calls_die": "exited with code 3",
    "F4_forge_the_status": "the answer could not be loaded: the process loading it sent a malformed reply",
    "F5_real_time_signal": "was killed by SIGRTMIN+6",
    "F7_largest_outputs": "returned 8 tensor(s)",
    "F3_blanks_after_a_fence": "hidden case 1 of",
    "F3_message_too_long": "characters; at most 262,144 are searched",
}


def trial_message(position: int, name: str) -> tuple[str, str]:
    """(finding, the final message) the `trial_hostile` policy plays at a task position."""
    play = TRIAL_PLAYS[position % len(TRIAL_PLAYS)]
    if play in TRIAL_MESSAGES:
        return play, TRIAL_MESSAGES[play](name)
    return play, f"Playing {play}:\n```python\n{TRIAL_ANSWERS[play].replace('{name}', name)}```\n"

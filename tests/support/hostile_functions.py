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

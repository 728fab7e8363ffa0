"""Issue 35's cross-rollout channels, replayed. One rollout's answer (the writer), in its trial,
sends each hidden case's arguments, as bits, through a large file every sandbox sees read only
under /usr; a rollout of the same prompt (the reader) reads them in its session, computes every
case's outputs there with any op it likes (the task's reference), and answers with a lookup table.
Where every rollout of a prompt is graded on the same cases the reader scores 1.0; where each
rollout draws its own, the table misses. Two channels:

- `page_cache`: a page of the file cached is a 1, evicted a 0 (posix_fadvise DONTNEED and
  WILLNEED); the reader tells them apart with preadv2's RWF_NOWAIT. The bits outlive the writer.
- `locks`: a byte of the file under a read lock of the writer's is a 1 (fcntl record locks, which
  every process of the host shares per file); the reader asks with F_GETLK. The bits live while
  the writer's caller does: its last call waits to be killed.

The policy server plays the writer, then the reader, on the rollouts of one prompt (policies
`cross_rollout_page_cache` and `cross_rollout_locks`, tests/support/policy_server.py)."""

import ast

SLOTS = 8  # the hidden cases read back: the environment's default number
WAIT = 20.0  # seconds a reader's cell waits for the writer's last case (the cell's limit is 30)
WAITS = 3  # cells the reader runs at most before it answers without a table
STREAM_BITS = 16384  # the cases, one after another: each a 2-byte length, then its bytes
READY_PAGES = 1024  # page cache: the writer's "all cases written", a page per look (a look caches it)

# Both sides find the same file: the first regular file of at least 72 MiB under /usr in a sorted
# walk (the page cache channel's ready region and bits), that no process maps (no shared library).
COMMON = r'''
import fcntl, json, os, struct, time

PAGE, STREAM_BITS, SLOTS, READY_PAGES = 4096, %d, %d, %d
READY, STREAM = 0, READY_PAGES * PAGE  # the page cache's ready region, then its bits

def channel_file():
    for root, dirs, files in os.walk("/usr"):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            if ".so" in name or not os.path.isfile(path) or os.path.islink(path):
                continue
            if os.path.getsize(path) >= 72 << 20:
                return path
    raise FileNotFoundError("no file of 72 MiB under /usr")

FD = os.open(channel_file(), os.O_RDONLY)
''' % (STREAM_BITS, SLOTS, READY_PAGES)

# What the writer does with a bit, and once its last case is sent, per channel.
PUT = {
    "page_cache": r'''
def clear(first, count):
    os.posix_fadvise(FD, STREAM + first * PAGE, count * PAGE, os.POSIX_FADV_DONTNEED)

def put(i):
    os.posix_fadvise(FD, STREAM + i * PAGE, PAGE, os.POSIX_FADV_WILLNEED)

def done():
    os.posix_fadvise(FD, READY, READY_PAGES * PAGE, os.POSIX_FADV_WILLNEED)
''',
    "locks": r'''
def clear(first, count):
    pass  # the locks die with the process that holds them

def put(i):
    fcntl.lockf(FD, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 1 + i)

def done():
    fcntl.lockf(FD, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 0)
    time.sleep(3600)  # the bits live while this process does: until the trial's limit kills it
''',
}

WRITER = r'''
FORMATS = {"torch.float32": "f", "torch.float64": "d", "torch.int64": "q", "torch.int32": "i", "torch.bool": "?"}
at = [0]

def flat(values):
    return [v for row in values for v in flat(row)] if isinstance(values, list) else [values]

def encode(args):
    """The case as bytes: its JSON skeleton (names, shapes, dtypes, scalars), a NUL, its tensors' data."""
    skeleton, data = {}, b""
    for name, value in args.items():
        if hasattr(value, "tolist") and hasattr(value, "dtype"):
            values = flat(value.tolist())
            skeleton[name] = ["tensor", list(value.shape), str(value.dtype)]
            data += struct.pack("<%%d%%s" %% (len(values), FORMATS[str(value.dtype)]), *values)
        else:
            skeleton[name] = ["value", value]
    return json.dumps(skeleton).encode() + b"\0" + data

def send(payload):
    """The case's bytes with a 2-byte length, as bits from bit at[0] on."""
    bits = "".join(format(b, "08b") for b in struct.pack("<H", len(payload)) + payload)
    clear(at[0], len(bits))
    for i, bit in enumerate(bits):
        if bit == "1":
            put(at[0] + i)
    at[0] += len(bits)

calls = [0]

def %(name)s(%(params)s):
    send(encode(dict(%(args)s)))
    calls[0] += 1
    if calls[0] == SLOTS:
        done()
    raise RuntimeError("the writer computes nothing: it sends the case to another rollout")
'''

# How the reader sees a bit, and waits for the writer's last case, per channel.
GET = {
    "page_cache": r'''
os.posix_fadvise(FD, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: each probe looks at its own page only

def cached(offset):
    try:
        os.preadv(FD, [bytearray(1)], offset, os.RWF_NOWAIT)
        return True
    except BlockingIOError:
        return False

def get(i):
    return cached(STREAM + i * PAGE)

looks = globals().get("looks", 0)  # the session keeps it: a cell run again goes on where the last stopped

def wait():
    """Whether the writer's last case is in. A probe caches the page it looks at: each look is at
    a page not looked at yet."""
    global looks
    deadline = time.monotonic() + %(wait)r
    while looks < READY_PAGES and time.monotonic() < deadline:
        if cached(READY + looks * PAGE):
            return True
        looks += 1
        time.sleep(0.02)
    return False
''',
    "locks": r'''
def locked(byte):
    query = struct.pack("hh4xqqi4x", fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0)
    return struct.unpack("hh4xqqi4x", fcntl.fcntl(FD, fcntl.F_GETLK, query))[0] != fcntl.F_UNLCK

def get(i):
    return locked(1 + i)

def wait():
    """Whether the writer's last case is in."""
    deadline = time.monotonic() + %(wait)r
    while time.monotonic() < deadline:
        if locked(0):
            return True
        time.sleep(0.02)
    return False
''',
}

# The reader's cell, in its session: read the cases, run the reference on each, print the table.
READER = r'''
import torch
DTYPES = {"torch.float32": (torch.float32, "f", 4), "torch.float64": (torch.float64, "d", 8),
          "torch.int64": (torch.int64, "q", 8), "torch.int32": (torch.int32, "i", 4), "torch.bool": (torch.bool, "?", 1)}

def read_bytes(at, n):
    return bytes(sum(get(at + 8 * k + j) << (7 - j) for j in range(8)) for k in range(n))

def read_case(at):
    """(the case's arguments, where the next begins), or (None, at) where no case is."""
    size = struct.unpack("<H", read_bytes(at, 2))[0]
    if not 0 < size <= (STREAM_BITS - at) // 8 - 2:
        return None, at
    skeleton, _, data = read_bytes(at + 16, size).partition(b"\0")
    args = {}
    for name, (kind, *rest) in json.loads(skeleton).items():
        if kind == "value":
            args[name] = rest[0]
            continue
        shape, dtype = rest
        torch_dtype, code, width = DTYPES[dtype]
        n = 1
        for d in shape:
            n *= d
        values, data = struct.unpack("<%%d%%s" %% (n, code), data[:n * width]), data[n * width:]
        args[name] = torch.tensor(values, dtype=torch_dtype).reshape(shape)
    return args, at + 16 + 8 * size

if not wait():
    raise SystemExit("NOT READY")  # the policy runs this cell again (the session keeps `looks`)
exec(%(reference)r)
table, at = {}, 0
for case in range(SLOTS):
    try:
        args, at = read_case(at)
    except Exception:
        args = None
    if args is None:
        break
    outputs = %(name)s(**args)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    table[repr(sorted((k, v.tolist() if hasattr(v, "tolist") else v) for k, v in args.items()))] = \
        [[o.tolist(), str(o.dtype)] for o in outputs]
print("TABLE=" + json.dumps(table))
'''

ANSWER = r'''
import json
import torch
TABLE = json.loads(%(table)r)

def %(name)s(%(params)s):
    args = dict(%(args)s)
    key = repr(sorted((k, v.tolist() if hasattr(v, "tolist") else v) for k, v in args.items()))
    outputs = [torch.tensor(values, dtype=getattr(torch, dtype.removeprefix("torch."))) for values, dtype in TABLE[key]]
    return outputs[0] if len(outputs) == 1 else tuple(outputs)
'''


def params_of(reference: str, name: str) -> list[str]:
    function = next(node for node in ast.parse(reference).body if isinstance(node, ast.FunctionDef) and node.name == name)
    return [a.arg for a in function.args.args]


def signature(params: list[str]) -> dict:
    return {"params": ", ".join(params), "args": ", ".join(f"{p}={p}" for p in params)}


def writer(channel: str, name: str, params: list[str]) -> str:
    return COMMON + PUT[channel] + WRITER % {"name": name, **signature(params)}


def reader_cell(channel: str, name: str, reference: str) -> str:
    return COMMON + GET[channel] % {"wait": WAIT} + READER % {"name": name, "reference": reference}


def reader_answer(name: str, params: list[str], table_json: str) -> str:
    return ANSWER % {"name": name, "table": table_json, **signature(params)}


def clear_page_cache() -> None:
    """On the host, before a replay: nothing of the file cached (the page cache is the host's)."""
    scope = {}
    exec(COMMON, scope)
    scope["os"].posix_fadvise(scope["FD"], 0, 0, scope["os"].POSIX_FADV_DONTNEED)
    scope["os"].close(scope["FD"])

"""The efficiency level's meter (issue 38): the answer's function is traced, without values, into a
graph of aten ops, and the graph is the answer. Its cost is counted from the graph alone.

Why a graph and not a meter on live calls: in the caller's process the answer can read tensor
memory without any op (`Tensor.tolist`, ctypes' `from_address`, a storage's bytes) and compute on
the values with C builtins (`sorted`, `sum`, `map`) that no dispatcher, tracer or profiler sees; a
Python-level meter's own frames reach the answer through tracebacks, trace hooks and signal
handlers. Here nothing the answer does outside the graph counts for anything:
- `trace` calls the function on fake tensors (shapes and dtypes, no values), in the answer's own
  process, which never holds the hidden inputs: reading a value fails the trace, naming it.
- `run` executes a decoded graph in a process that holds no code of the answer, one op at a time,
  each op on the task's allowlist; the outputs are graded, and the cost is counted there.
- `cost` counts each op call from its arguments' and outputs' sizes only, so the same graph on the
  same shapes costs the same on every run, every CPU type and under any load.

A call's cost, in elements: PER_CALL, plus every element of its tensor arguments (read), plus
every element of its outputs unless it returns a view of an argument (written), plus the
multiply-adds of a matrix product. Work done at trace time outside the graph (threads, Python
numbers, caches) leaves nothing in it, so it is worth nothing at run time.
"""

import json
import math
import operator

import torch

from ptenv.inside import codec
from ptenv.inside.protocol import HIDDEN_OUTPUT_CAP, MAX_HIDDEN_OUTPUTS

PER_CALL = 8  # an op call's own cost, in elements: n calls on one element each cost more than one call on n
MAX_NODES = 20_000
MAX_OUTPUTS = MAX_HIDDEN_OUTPUTS - 1  # its run replies with its cost after them
MAX_GRAPH_BYTES = HIDDEN_OUTPUT_CAP * 3 // 4  # a graph's JSON, sent as a trial's output
MAX_CONSTANT_BYTES = 32 << 10  # all tensor constants of a graph together (a table the function built, say)
FORMAT = 1
# The trusted program of the second trial: the answer's graphs run where none of its code is.
EXECUTOR = "from ptenv.inside.graph import run_case as run_graph\n"


class GraphError(ValueError):
    """The graph cannot be traced, decoded or run: the answer's failure, with its reason."""


# ---- trace: in the caller, on fake tensors

def trace(function, tensors: dict, literals: dict) -> dict:
    """The graph of `function(**tensors, **literals)`: `tensors` maps names to (dtype, shape), as
    fake tensors; `literals` are passed as they are (ints, floats, lists). Raises GraphError with
    the reason when the function reads a value, returns something other than tensors, or its graph
    is too big."""
    from torch.fx.experimental.proxy_tensor import make_fx  # heavy: only the efficiency level needs it

    names = list(tensors)
    examples = [torch.empty(shape, dtype=dtype) for dtype, shape in tensors.values()]

    def call(*values):
        return function(**dict(zip(names, values)), **literals)

    try:
        module = make_fx(call, tracing_mode="fake", _allow_non_fake_inputs=True)(*examples)
    except Exception as e:  # the answer's code ran in there: any failure is its own
        raise GraphError(f"the function could not be traced without values: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    return encode(module, names)


def encode(module, names: list[str]) -> dict:
    """A traced module as plain data: inputs by name, nodes in order (op and arguments, each
    argument a literal or {"ref": i}, i indexing inputs then nodes), constants, outputs."""
    refs, nodes, constants, size = {}, [], [], 0
    for node in module.graph.nodes:
        if node.op == "placeholder":
            refs[node] = len(refs)
        elif node.op == "get_attr":
            value = getattr(module, node.target)
            if type(value) is not torch.Tensor:  # a fake tensor kept from another call, say
                raise GraphError(f"the graph holds a {type(value).__name__} constant, not a tensor made in this call")
            size += value.numel() * value.element_size()
            if size > MAX_CONSTANT_BYTES:
                raise GraphError(f"the graph's constants are over {MAX_CONSTANT_BYTES} bytes")
            constants.append(codec.encode(value.detach().clone()))
            nodes.append({"constant": len(constants) - 1})
            refs[node] = len(refs)
        elif node.op == "call_function":
            nodes.append({"op": op_name(node.target), "args": _plain(node.args, refs), "kwargs": _plain(node.kwargs, refs)})
            refs[node] = len(refs)
        elif node.op == "output":
            outputs = node.args[0]
        else:
            raise GraphError(f"the graph has a {node.op} node")
        if len(nodes) > MAX_NODES:
            raise GraphError(f"the graph has more than {MAX_NODES} op calls")
    single = not isinstance(outputs, (tuple, list))
    return {"format": FORMAT, "inputs": names, "nodes": nodes, "constants": constants,
            "outputs": _plain([outputs] if single else list(outputs), refs), "single": single}


def op_name(target) -> str:
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):
        return target.name()  # "aten::add.Tensor"; "aten::add" for a default overload
    raise GraphError(f"the graph calls {getattr(target, '__name__', type(target).__name__)}, not an op")


def _plain(value, refs):
    if isinstance(value, torch.fx.Node):
        return {"ref": refs[value]}
    if isinstance(value, (list, tuple)):
        return [_plain(v, refs) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v, refs) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    for kind, types in TAGGED.items():
        if isinstance(value, types):
            return {kind: str(value).removeprefix("torch.")}
    raise GraphError(f"the graph passes a {type(value).__name__} to an op")


TAGGED = {"dtype": torch.dtype, "device": torch.device, "layout": torch.layout, "memory_format": torch.memory_format}


def warm_up() -> None:
    """Trace once, and fail a trace once, in the process callers fork from: the tracer imports
    modules on first use (its failure path, torch._dynamo and numpy's code), which a caller under
    the allowlist could not load."""
    trace(lambda x: x + 1, {"x": (torch.float32, (2,))}, {})
    try:
        trace(lambda x: x[0].item(), {"x": (torch.float32, (2,))}, {})
    except GraphError:
        pass


def trace_case(function, case: dict) -> bytes:
    """A trial's case in the caller at the efficiency level ({name: {"spec": ...} or {"value": ...}})
    traced: trace_bytes."""
    tensors = {k: spec(v["spec"]) for k, v in case.items() if "spec" in v}
    return trace_bytes(function, tensors, {k: v["value"] for k, v in case.items() if "spec" not in v})


def trace_bytes(function, tensors: dict, literals: dict) -> bytes:
    """`trace`'s graph as a trial carries it: JSON bytes, at most MAX_GRAPH_BYTES."""
    text = json.dumps(trace(function, tensors, literals), separators=(",", ":")).encode()
    if len(text) > MAX_GRAPH_BYTES:
        raise GraphError(f"the graph is {len(text)} bytes of JSON; at most {MAX_GRAPH_BYTES}")
    return text


def spec(doc) -> tuple[torch.dtype, tuple[int, ...]]:
    """A fake tensor's dtype and shape, from the host's {"dtype", "shape"}."""
    ok = isinstance(doc, dict) and doc.get("dtype") in codec.DTYPES and isinstance(doc.get("shape"), list) \
        and len(doc["shape"]) <= codec.MAX_DIMS and all(type(n) is int and n >= 0 for n in doc["shape"])
    if not ok:
        raise ValueError(f"a malformed tensor spec: {doc!r:.100}")
    return codec.DTYPES[doc["dtype"]], tuple(doc["shape"])


# ---- run: in a process without the answer's code

def run_case(graph: str, allowed: list, **inputs) -> tuple:
    """EXECUTOR's function: one graph (JSON text) run on one case's tensors, its outputs then its cost."""
    try:
        decoded = json.loads(graph)
    except ValueError:
        raise GraphError("the graph is not JSON") from None
    outputs, cost = run(decoded, inputs, set(allowed))
    return (*outputs, torch.tensor(cost, dtype=torch.int64))


def run(graph: dict, inputs: dict, allowed: set[str]) -> tuple[list, int]:
    """Execute a graph (as `encode` made it, from a hostile source) on real `inputs` by name, each
    op's packet in `allowed` ("aten::add"): (the outputs, the cost). GraphError names what is wrong."""
    from ptenv.inside.allowlist import packet

    if not isinstance(graph, dict) or graph.get("format") != FORMAT:
        raise GraphError("not a graph of this format")
    nodes, names = graph.get("nodes"), graph.get("inputs")
    if not isinstance(nodes, list) or len(nodes) > MAX_NODES or not isinstance(names, list) or set(names) != set(inputs):
        raise GraphError("the graph's inputs or nodes are malformed")
    values, cost = [inputs[name] for name in names], 0
    constants = graph.get("constants") if isinstance(graph.get("constants"), list) else []
    for i, node in enumerate(nodes):
        if not isinstance(node, dict):
            raise GraphError(f"node {i} is malformed")
        if "constant" in node:
            values.append(codec.decode(constants[_index(node["constant"], len(constants))]))
            continue
        name, args, kwargs = node.get("op"), node.get("args"), node.get("kwargs")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise GraphError(f"node {i} is malformed")
        args, kwargs = _value(args, values), {str(k): _value(v, values) for k, v in kwargs.items()}
        if name == "getitem":
            values.append(_getitem(args))
            continue
        if not isinstance(name, str) or packet(name) not in allowed:
            raise GraphError(f"{name} is not on this task's allowlist")
        op = resolve(name)
        try:
            if packet(name) == "aten::as_strided":
                _within_its_tensor(args, kwargs)
            out = op(*args, **kwargs)
        except Exception as e:
            raise GraphError(f"node {i} ({name}) failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        cost += call_cost(op, args, kwargs, out)
        values.append(out)
    outputs = _value(graph.get("outputs"), values)
    if not isinstance(outputs, list) or not all(isinstance(o, torch.Tensor) for o in outputs):
        raise GraphError("the graph's outputs are not tensors")
    if len(outputs) > MAX_OUTPUTS:
        raise GraphError(f"the graph returns {len(outputs)} tensors; at most {MAX_OUTPUTS} are read")
    return outputs, cost


def _within_its_tensor(args, kwargs) -> None:
    """`as_strided` lays out its tensor's own elements as it likes (the question says so), but must not
    reach the rest of their storage: a view of one element laid over a whole buffer would cost a read
    of one. Arithmetic on the sizes and strides, and for a tensor that is not contiguous, each laid
    element's position decomposed along the tensor's strides: ops every allowlist keeps, since this
    runs under the task's allowlist."""
    t, size, stride = args[0], list(args[1]), list(args[2])
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    offset = t.storage_offset() if offset is None else offset
    if math.prod(size) == 0:
        return
    low = offset + sum(min(0, (n - 1) * s) for n, s in zip(size, stride))
    high = offset + sum(max(0, (n - 1) * s) for n, s in zip(size, stride))
    start = t.storage_offset()
    if t.numel() == 0 or low < start or high > start + sum((n - 1) * s for n, s in zip(t.shape, t.stride())):
        raise ValueError("it lays out elements of the storage outside its tensor")
    if t.is_contiguous():
        return  # its own elements are every position from its first to its last
    rest = torch.arange(high + 1).as_strided(size, stride, offset) - start
    for s, n in sorted(((s, n) for n, s in zip(t.shape, t.stride()) if n > 1 and s > 0), reverse=True):
        index = torch.div(rest, s, rounding_mode="floor")
        if not bool((index < n).all()):
            raise ValueError("it lays out elements of the storage outside its tensor")
        rest = rest - index * s
    if not bool((rest == 0).all()):
        raise ValueError("it lays out elements of the storage outside its tensor")


def resolve(name: str) -> torch._ops.OpOverload:
    namespace, _, rest = name.partition("::")
    packet_name, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet_name), overload or "default")
    except (AttributeError, RuntimeError):
        raise GraphError(f"{name} is not an op") from None


def _index(i, n: int) -> int:
    if type(i) is not int or not 0 <= i < n:
        raise GraphError("a reference is out of range")
    return i


def _getitem(args) -> object:
    if len(args) != 2 or not isinstance(args[0], (tuple, list)) or type(args[1]) is not int:
        raise GraphError("a getitem node is malformed")
    return args[0][_index(args[1], len(args[0]))]


def _value(value, values: list):
    if isinstance(value, list):
        return [_value(v, values) for v in value]
    if isinstance(value, dict):
        if set(value) == {"ref"}:
            return values[_index(value["ref"], len(values))]
        if set(value) == {"float"} and value["float"] in ("inf", "-inf", "nan"):
            return float(value["float"])
        if len(value) == 1 and (kind := next(iter(value))) in TAGGED:
            return tagged(kind, value[kind])
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise GraphError("an argument is malformed")


def tagged(kind: str, text) -> object:
    if kind == "device":
        if text != "cpu":
            raise GraphError(f"device {text!r}: only the CPU")
        return torch.device("cpu")
    found = getattr(torch, text, None) if isinstance(text, str) and text.isidentifier() else None
    if not isinstance(found, TAGGED[kind]):
        raise GraphError(f"{kind} {text!r} is not one")
    return found


# ---- cost: from sizes only

def call_cost(op, args, kwargs, out) -> int:
    """One op call's cost: PER_CALL, the elements it reads, the elements it writes (none for a
    view of an argument) and a matrix product's multiply-adds."""
    reads = sum(t.numel() for t in _tensors((args, kwargs)))
    writes = 0 if returns_view(op) else sum(t.numel() for t in _tensors(out))
    return PER_CALL + reads + writes + multiply_adds(op, args, out)


def returns_view(op) -> bool:
    """Whether the op returns a view of an argument (`view`, `expand`, `select`): it moves no element."""
    returns = op._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def multiply_adds(op, args, out) -> int:
    """A matrix product's multiply-adds: its output's elements times the contracted length."""
    name = op._schema.name.removeprefix("aten::").rstrip("_")
    if name in ("mm", "bmm", "matmul"):
        return out.numel() * args[0].shape[-1]
    if name in ("addmm", "baddbmm"):
        return out.numel() * args[1].shape[-1]
    if name == "addbmm":
        return out.numel() * args[1].shape[0] * args[1].shape[-1]
    if name in ("mv", "dot", "vdot"):
        return args[0].numel()
    if name == "addmv":
        return args[1].numel()
    return 0


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)

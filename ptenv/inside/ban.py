"""The ban of a function task's hardest level: what the answer reimplements is absent from the caller
(caller.py) before the answer's source runs, made of nothing the answer can reach or undo.

- The op's kernels: a raising kernel is registered for every CPU-side dispatch key.
  The registrations' handles are pybind objects, which the garbage collector does not list, and
  nothing in Python refers to them once installed, so the answer cannot find one to reset; and no
  Python call reaches a kernel shadowed by a newer registration. Every path into the dispatcher
  (any thread, any mode trick, redispatch, a custom op's or a subclass's kernel) ends in the ban.
- torch's Python implementations: every function of torch._decomp, torch._refs and torch._prims
  gets a body that raises (found once per process, at import, where torch was imported).
- Native calls: libffi's call entry points are overwritten with a trapping instruction, so ctypes
  (and anything else calling through libffi) cannot call into libtorch's symbols without the
  dispatcher; loading a new native library is refused by the caller's seccomp filter
  (seccomp.BAN_RULES: no executable mapping, no file opened for writing, so no /proc/self/mem).
- torch's decomposition sources: unreadable (Landlock), so fresh copies cannot be compiled from them.
- Autograd, where the level asks for the answer's own derivation: the autograd engine's entry
  points trap, and forward mode's dual tensors (aten::_make_dual) are banned.

A trapped instruction kills the caller: the supervisor names the ban as the reason (TRAPS).
"""

import ctypes
import gc
import math, cmath, bisect, heapq, random, itertools, functools, operator, collections  # noqa: E401,F401
import os
import signal
import stat
import struct
import types
import warnings

import _ctypes
import torch

from ptenv.inside.syscalls import PR_SET_NO_NEW_PRIVS, libc

# Loaded here, before the filter refuses new native libraries to the answer.
PRELOADED = (math, cmath, bisect, heapq, random, itertools, functools, operator, collections)
DISPATCH_KEYS = ("CPU", "SparseCPU", "SparseCsrCPU", "MkldnnCPU", "QuantizedCPU", "NestedTensorCPU",
                 "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional", "CompositeImplicitAutograd")
FORWARD_MODE = ("_make_dual",)
UD2, INT3 = b"\x0f\x0b", b"\xcc" * 16
# How a caller killed by a trap is described (the supervisor's reason for that case).
TRAPS = {signal.SIGILL: "called native code through libffi (ctypes), which the ban removes",
         signal.SIGTRAP: "ran torch's autograd engine, which this level removes (derive the gradient yourself)"}
ENGINE = ("_ZN5torch8autograd6Engine7executeERKSt6vectorINS0_4EdgeESaIS3_EERKS2_IN2at6TensorESaIS9_EEbbbS7_",
          "_ZN5torch8autograd6Engine23execute_with_graph_taskERKSt10shared_ptrINS0_9GraphTaskEEN3c1013intrusive_ptr"
          "INS0_4NodeENS7_6detail34intrusive_target_default_null_typeIS9_EEEEONS0_11InputBufferE")


def symbol(library: str, name: str) -> int:
    return ctypes.cast(getattr(ctypes.CDLL(library), name), ctypes.c_void_p).value


TORCH_CPU = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
FFI_ENTRIES = tuple(symbol(_ctypes.__file__, name) for name in ("ffi_call", "ffi_call_go"))
ENGINE_ENTRIES = tuple(symbol(TORCH_CPU, name) for name in ENGINE)
TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__))
PYTHON_ROOTS = tuple(os.path.join(os.path.dirname(torch.__file__), d) + os.sep for d in ("_decomp", "_refs", "_prims"))
# Their sources are unreadable in the caller, with inductor's (which has decompositions of its own),
# so the answer cannot compile fresh copies there (Landlock).
HIDDEN_SOURCES = tuple(os.path.join(TORCH_DIR, d) for d in ("_decomp", "_refs", "_prims", "_inductor"))
PYTHON_IMPLEMENTATIONS = [o for o in gc.get_objects()
                          if type(o) is types.FunctionType and o.__code__.co_filename.startswith(PYTHON_ROOTS)]


def readable_around(hidden: tuple[str, ...]) -> list[str]:
    """Paths whose hierarchies hold every file but those under `hidden` (Landlock rules allow; they
    cannot deny): every entry of each ancestor directory of a hidden one, but the ancestors
    themselves (walked instead), the hidden ones, and links to either."""
    ancestors = {os.path.dirname(h) for h in hidden}
    while any(a != "/" and os.path.dirname(a) not in ancestors for a in ancestors):
        ancestors |= {os.path.dirname(a) for a in ancestors}
    paths = []
    for directory in sorted(ancestors):
        for entry in sorted(os.listdir(directory)):
            path = os.path.join(directory, entry)
            real = os.path.realpath(path)
            if real in ancestors or any(real == h or real.startswith(h + os.sep) for h in hidden):
                continue
            paths.append(path)
    return paths


READABLE = readable_around(HIDDEN_SOURCES)


def overloads(packet: str) -> list[str]:
    """An aten op's overloads, as the dispatcher names them ("_softmax", "scatter_reduce.two")."""
    op = getattr(torch.ops.aten, packet)
    return [packet if o == "default" else f"{packet}.{o}" for o in op.overloads()]


def remove_kernels(packets: tuple[str, ...]) -> None:
    """Shadow every kernel of these ops with one that raises, beyond the answer's reach."""
    keep = ctypes.pythonapi.Py_IncRef
    keep.argtypes = [ctypes.py_object]
    warnings.filterwarnings("ignore", "Warning only once for all operators")  # overriding is the point
    for key in DISPATCH_KEYS:
        library = torch._C._dispatch_library("IMPL", "aten", key, "", 0)
        for packet in packets:
            for name in overloads(packet):
                # Every key, not only those with a kernel: a CPU call of an op whose kernel is
                # composite would otherwise reach the Python kernel through the alias key, which
                # crashes torch when called by key (OpOverload._op_dk).
                library.impl(name, key, banned_kernel(f"aten::{name}"), False)
        keep(library)  # never released: the registrations outlive every Python reference
        del library


def banned_kernel(name: str):
    def kernel(*args, **kwargs):
        raise RuntimeError(f"{name} is banned in this task's trial: implement it without it")
    return kernel


def remove_python_implementations() -> None:
    def removed(*args, **kwargs):
        raise RuntimeError("torch's Python decompositions and refs are banned in this task's trial")
    for f in PYTHON_IMPLEMENTATIONS:
        f.__code__ = removed.__code__.replace(co_freevars=f.__code__.co_freevars)


def trap(memory, addresses: tuple[int, ...], instruction: bytes) -> None:
    for address in addresses:
        memory.seek(address)
        memory.write(instruction)


def remove(packets: tuple[str, ...], autograd: bool) -> None:
    """Ban these ops, torch's Python implementations, and forward mode unless `autograd`."""
    remove_kernels(packets + (() if autograd else FORWARD_MODE))
    remove_python_implementations()


def seal(memory, autograd: bool) -> None:
    """Trap the native entry points: libffi's calls, and the autograd engine unless `autograd`.
    Last, since the harness's own ctypes calls (the seccomp filter) need libffi; `memory` is
    /proc/self/mem, opened for writing before the filter refused that."""
    trap(memory, FFI_ENTRIES, UD2)
    if not autograd:
        trap(memory, ENGINE_ENTRIES, INT3)


# Landlock's calls have the same numbers on x86_64 and aarch64.
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_RULE_PATH_BENEATH, READ_FILE, READ_DIR = 1, 1 << 2, 1 << 3


def hide_sources() -> bool:
    """Let this process read every file but HIDDEN_SOURCES; False where the kernel has no Landlock."""
    handled = ctypes.c_uint64(READ_FILE | READ_DIR)
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(handled), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        return False
    try:
        for path in READABLE:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not in this sandbox's view
            try:
                access = READ_FILE | READ_DIR if stat.S_ISDIR(os.fstat(fd).st_mode) else READ_FILE
                rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
                if libc.syscall(LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, ctypes.c_uint32(0)) != 0:
                    return False
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        return libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) == 0
    finally:
        os.close(ruleset)

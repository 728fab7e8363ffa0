"""The ban of a function task's hardest level: what the answer reimplements is absent from the judge
(judge.py) before the answer's source runs, made of nothing the answer can reach or undo.

- The op's kernels: a raising kernel is registered for every dispatch key the op has a kernel for.
  The registrations' handles are pybind objects, which the garbage collector does not list, and
  nothing in Python refers to them once installed, so the answer cannot find one to reset; and no
  Python call reaches a kernel shadowed by a newer registration. Every path into the dispatcher
  (any thread, any mode trick, redispatch, a custom op's or a subclass's kernel) ends in the ban.
- torch's Python implementations: every function of torch._decomp, torch._refs and torch._prims
  gets a body that raises (found once per process, at import, where torch was imported).
- Native calls: libffi's call entry points are overwritten with a trapping instruction, so ctypes
  (and anything else calling through libffi) cannot call into libtorch's symbols without the
  dispatcher; loading a new native library is refused by the judge's seccomp filter
  (seccomp.BAN_RULES: no executable mapping, no file opened for writing, so no /proc/self/mem).
- Autograd, where the level asks for the answer's own derivation: the autograd engine's entry
  points trap, and forward mode's dual tensors (aten::_make_dual) are banned.

A trapped instruction kills the judge: the supervisor names the ban as the reason (TRAPS).
"""

import ctypes
import gc
import math, cmath, bisect, heapq, random, itertools, functools, operator, collections  # noqa: E401,F401
import os
import signal
import types
import warnings

import _ctypes
import torch

# Loaded here, before the filter refuses new native libraries to the answer.
PRELOADED = (math, cmath, bisect, heapq, random, itertools, functools, operator, collections)
DISPATCH_KEYS = ("CPU", "SparseCPU", "SparseCsrCPU", "MkldnnCPU", "QuantizedCPU", "NestedTensorCPU",
                 "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional", "CompositeImplicitAutograd")
FORWARD_MODE = ("_make_dual",)
UD2, INT3 = b"\x0f\x0b", b"\xcc" * 16
# How a judge killed by a trap is described (the supervisor's reason for that case).
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
PYTHON_ROOTS = tuple(os.path.join(os.path.dirname(torch.__file__), d) + os.sep for d in ("_decomp", "_refs", "_prims"))
PYTHON_IMPLEMENTATIONS = [o for o in gc.get_objects()
                          if type(o) is types.FunctionType and o.__code__.co_filename.startswith(PYTHON_ROOTS)]


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
                if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", key):
                    library.impl(name, key, banned_kernel(f"aten::{name}"), False)
        keep(library)  # never released: the registrations outlive every Python reference
        del library


def banned_kernel(name: str):
    def kernel(*args, **kwargs):
        raise RuntimeError(f"{name} is banned in this task's hidden phase: implement it without it")
    return kernel


def remove_python_implementations() -> None:
    def removed(*args, **kwargs):
        raise RuntimeError("torch's Python decompositions and refs are banned in this task's hidden phase")
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

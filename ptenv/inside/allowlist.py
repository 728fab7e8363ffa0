"""The allowlist of a function task's hardest level: in the caller (caller.py), before the answer's
source runs, every operator but the task's allowed ones is removed, and so is every other way to
compute natively; made of nothing the answer can reach or undo.

- Operators: every op of every namespace whose kernel computes natively (a CPU kernel, or a
  CompositeExplicitAutograd one, which may compute natively too) gets a raising kernel on the CPU
  key unless it is allowed. The CPU key ends every dense CPU call, whatever path led there (any
  thread, any mode trick, redispatch, a custom op's or a subclass's kernel), so nothing reaches
  the kernel it shadows. Factories get one on the sparse, quantized, mkldnn and nested keys as
  well, so no tensor of those layouts can be made, and no kernel of theirs runs. The handles are
  pybind objects the garbage collector does not list, referenced from nowhere once installed.
  CompositeImplicitAutograd ops are left: by definition they only call other ops (autograd
  differentiates them through those), each of which the allowlist checks.
- Other native code: every executable mapping of a Python package but torch (numpy and its BLAS,
  any other extension) is made non-executable, so a call into it kills the caller (SIGSEGV); the
  objects of those modules are frozen out of the garbage collector's reach first, whose traversal
  would call into them. libffi's calls (ctypes, into libtorch's kernels) and torch's executors
  that call kernels without the dispatcher (static runtime, NNC's IR evaluator) are overwritten
  with a stub that exits with a code naming them (TRAPS). The seccomp filter (seccomp.ALLOWLIST_RULES)
  refuses new executable memory and files opened for writing (so no /proc/self/mem to undo this).
- Autograd, where the level asks for the answer's own derivation: no tensor can require grad
  (so no graph is recorded, and no graph node exists to call), the engine and TorchScript's
  symbolic differentiation exit. Forward mode's dual tensors (aten::_make_dual) are on no allowlist.
"""

import ctypes
import gc
import math, cmath, bisect, heapq, random, itertools, functools, operator, collections  # noqa: E401,F401
import os
import platform
import struct
import warnings

import _ctypes
import torch

from ptenv.inside.syscalls import libc

# Loaded here, before the filter refuses new native libraries to the answer.
PRELOADED = (math, cmath, bisect, heapq, random, itertools, functools, operator, collections)
# Keys on which no tensor may compute: a factory's kernel there is what makes such a tensor.
OTHER_LAYOUTS = ("SparseCPU", "SparseCsrCPU", "QuantizedCPU", "MkldnnCPU", "NestedTensorCPU")


def kernel_keys(name: str) -> tuple[str, ...]:
    """The keys on which an op's kernels are shadowed when it is not allowed (none: it computes
    nothing natively on its own)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    keys = ("CPU",) if any(has(name, k) for k in ("CPU", "CompositeExplicitAutograd",
                                                  "CompositeExplicitAutogradNonFunctional")) else ()
    if has(name, "BackendSelect"):
        keys += tuple(k for k in OTHER_LAYOUTS if has(name, k))
    return keys


# Found once per process, where torch was imported (the fork server): every op, its keys.
OPS = {name: keys for name in sorted(torch._C._dispatch_get_all_op_names()) if (keys := kernel_keys(name))}


def packet(name: str) -> str:
    """An op's overload packet, in-place forms with their op: "aten::add_.Tensor" -> "aten::add"."""
    name = name.split(".", 1)[0]
    return name if name.endswith("__") else name.rstrip("_")


# What this process has removed so far, (op, key): a caller forked from a zygote that installed a
# wider allowlist (the trial zygote, main.py) only adds its family's removals.
REMOVED: set[tuple[str, str]] = set()
# The ops the widest allowlist installed here allows; None until one is installed.
ALLOWED: set[str] | None = None


def install(allowed: set[str]) -> int:
    """Shadow every op whose packet (packet()) is not in `allowed` ("aten::add"); an allowed
    factory still loses its other layouts. The number of kernels installed now. An allowlist can
    only narrow one installed before: ValueError if it allows an op that one removed."""
    global ALLOWED
    allowed = {packet(a) for a in allowed}
    if ALLOWED is not None and not allowed <= ALLOWED:
        raise ValueError(f"the allowlist widens the one installed before: {sorted(allowed - ALLOWED)[:5]}")
    ALLOWED = allowed
    keep = ctypes.pythonapi.Py_IncRef
    keep.argtypes = [ctypes.py_object]
    warnings.filterwarnings("ignore", "Warning only once for all operators")  # overriding is the point
    libraries, count = {}, 0
    for name, keys in OPS.items():
        if packet(name) in allowed:
            keys = keys[1:] if keys[0] == "CPU" else keys
        namespace, _, op = name.partition("::")
        for key in keys:
            if (name, key) in REMOVED:
                continue
            if (namespace, key) not in libraries:
                libraries[namespace, key] = torch._C._dispatch_library("IMPL", namespace, key, "", 0)
            libraries[namespace, key].impl(op, key, removed_kernel(name, key), False)
            REMOVED.add((name, key))
            count += 1
    for library in libraries.values():
        keep(library)  # never released: the registrations outlive every Python reference
    return count


def removed_kernel(name: str, key: str):
    why = "is not on this task's allowlist" if key == "CPU" else f"has no {key} path on this task's allowlist"

    def kernel(*args, **kwargs):
        raise RuntimeError(f"{name} {why}: compute the result from the allowed operations")
    return kernel


# --- native code ------------------------------------------------------------------------------

TORCH_DIRS = tuple(os.path.realpath(os.path.dirname(torch.__file__)) + suffix for suffix in (os.sep, ".libs" + os.sep))


def removable(path: str) -> bool:
    """Native code of a Python package other than torch's (numpy's, its BLAS, any extension)."""
    parts = path.split(os.sep)
    return ("site-packages" in parts or "dist-packages" in parts) and not os.path.realpath(path).startswith(TORCH_DIRS)


PROT_READ = 0x1


def remove_libraries() -> list[str]:
    """Make the executable mappings of removable libraries read-only; the paths done. Their
    objects are frozen first: the garbage collector's traversal would call into them."""
    gc.freeze()
    done = []
    with open("/proc/self/maps") as maps:
        lines = maps.read().splitlines()
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and "x" in fields[1] and removable(fields[5]):
            start, end = (int(a, 16) for a in fields[0].split("-"))
            if libc.mprotect(start, end - start, PROT_READ) != 0:
                raise OSError(ctypes.get_errno(), f"mprotect of {fields[5]} failed")
            done.append(fields[5])
    return done


def symbol(library: str, name: str) -> int:
    return ctypes.cast(getattr(ctypes.CDLL(library), name), ctypes.c_void_p).value


def local_symbol(library: str, name: str) -> int:
    """The address of a function the library does not export, from its ELF symbol table."""
    with open(library, "rb") as f:
        head = f.read(64)
        shoff, = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
        f.seek(shoff)
        sections = [struct.unpack_from("<IIQQQQIIQQ", f.read(shentsize)) for _ in range(shnum)]
        symtab = next(s for s in sections if s[1] == 2)  # SHT_SYMTAB; its sh_link is its string table
        f.seek(sections[symtab[6]][4])
        strings = f.read(sections[symtab[6]][5])
        f.seek(symtab[4])
        table = f.read(symtab[5])
    offset = strings.find(b"\0" + name.encode() + b"\0") + 1
    for st_name, _, _, _, st_value, _ in struct.iter_unpack("<IBBHQQ", table):
        if st_name == offset and offset:
            return load_base(library) + st_value
    raise LookupError(f"{name} is not in {library}'s symbol table")


def load_base(library: str) -> int:
    real = os.path.realpath(library)
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[2] == "00000000" and os.path.realpath(fields[5].strip()) == real:
                return int(fields[0].split("-")[0], 16)
    raise LookupError(f"{library} is not loaded")


TORCH_CPU = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
# What ends the caller when it reaches one of the entry points below: an exit code each, so the
# supervisor can name it (TRAPS); nothing the answer does can catch an exit.
FFI, EXECUTOR, AUTOGRAD = 121, 122, 123
TRAPS = {FFI: "called native code through libffi (ctypes), which the allowlist removes",
         EXECUTOR: "ran a TorchScript executor that calls kernels without the dispatcher (static runtime, "
                   "NNC's IR evaluator), which the allowlist removes",
         AUTOGRAD: "used automatic differentiation (a tensor that requires grad, the autograd engine, "
                   "TorchScript's autodiff), which this level removes: derive the gradient yourself"}
FFI_ENTRIES = tuple(symbol(_ctypes.__file__, name) for name in ("ffi_call", "ffi_call_go"))
EXECUTOR_ENTRIES = tuple(symbol(TORCH_CPU, name) for name in (
    "_ZN5torch3jit12StaticModuleC1ERKNS0_6ModuleEbRKNS0_19StaticModuleOptionsESt6vectorIN3c106IValueESaISA_EE",
    "_ZN5torch3jit12StaticModuleC1ERKSt10shared_ptrINS0_5GraphEERKNS0_19StaticModuleOptionsESt6vectorIN3c106IValue"
    "ESaISC_EE",
    "_ZN5torch3jit12StaticModuleC1ESt4pairISt10shared_ptrINS0_5GraphEESt8optionalINS0_6ModuleEEERKNS0_19StaticModule"
    "OptionsE",
    "_ZN5torch3jit10tensorexpr17SimpleIREvaluatorC1ESt10shared_ptrINS1_4StmtEERKSt6vectorINS1_7CodeGen9BufferArgE"
    "SaIS8_EEN3c106DeviceERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"))
# Every way a tensor comes to require grad ends in AutogradMeta::set_requires_grad (not exported);
# `torch.tensor(...)` calls it with False, which its stub lets return (requires_grad_stub).
SET_REQUIRES_GRAD = local_symbol(TORCH_CPU, "_ZN5torch8autograd12AutogradMeta17set_requires_gradEbPN3c1010TensorImplE")
AUTOGRAD_ENTRIES = (SET_REQUIRES_GRAD,
                    *(symbol(TORCH_CPU, name) for name in (
    "_ZN5torch8autograd6Engine7executeERKSt6vectorINS0_4EdgeESaIS3_EERKS2_IN2at6TensorESaIS9_EEbbbS7_",
    "_ZN5torch8autograd6Engine23execute_with_graph_taskERKSt10shared_ptrINS0_9GraphTaskEEN3c1013intrusive_ptr"
    "INS0_4NodeENS7_6detail34intrusive_target_default_null_typeIS9_EEEEONS0_11InputBufferE",
    "_ZN5torch3jit13differentiateERSt10shared_ptrINS0_5GraphEE")))


# A caller killed by SIGSEGV under the allowlist: what the removed libraries' code does when called.
OTHER_CODE = ("ran native code outside torch and Python (numpy's, or another package's), which the allowlist "
              "removes (the process was killed by SIGSEGV)")


def exit_stub(code: int) -> bytes:
    """Machine code for exit_group(code)."""
    if platform.machine() == "aarch64":  # movz x0, #code; movz x8, #94; svc #0
        return b"".join(i.to_bytes(4, "little") for i in (0xD2800000 | code << 5, 0xD2800000 | 94 << 5 | 8, 0xD4000001))
    return b"\xbf" + code.to_bytes(4, "little") + b"\xb8\xe7\x00\x00\x00\x0f\x05"  # mov edi; mov eax, 231; syscall


def requires_grad_stub(code: int) -> bytes:
    """Machine code for set_requires_grad(requires_grad, ...): return if requires_grad is false (its
    second argument: the method's `this` is the first), else exit_group(code)."""
    if platform.machine() == "aarch64":  # cbnz w1, +8; ret
        return (0x35000041).to_bytes(4, "little") + (0xD65F03C0).to_bytes(4, "little") + exit_stub(code)
    return b"\x40\x84\xf6\x75\x01\xc3" + exit_stub(code)  # test sil, sil; jnz +1; ret


def seal(memory, autograd: bool) -> None:
    """Overwrite the native entry points: libffi's calls, the executors, and autograd's unless
    `autograd`. Last, since the harness's own ctypes calls (the seccomp filter) need libffi;
    `memory` is /proc/self/mem, opened for writing before the filter refused that."""
    traps = [(FFI_ENTRIES, FFI), (EXECUTOR_ENTRIES, EXECUTOR)] + ([] if autograd else [(AUTOGRAD_ENTRIES, AUTOGRAD)])
    for addresses, code in traps:
        for address in addresses:
            memory.seek(address)
            memory.write(requires_grad_stub(code) if address == SET_REQUIRES_GRAD else exit_stub(code))

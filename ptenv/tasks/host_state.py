"""The host process's torch and Python settings, left as they were found.

Building a task runs its reference solution single-threaded (as a model's cell runs), the float64
recompute flips the default dtype, and a solution may draw from or reseed the global RNGs. All of
these are process-wide, and the environment runs inside someone else's process (vf-eval, a
trainer): `reference_run` saves the intra-op thread count, the default dtype and the global torch
and Python RNG states, sets what a sandbox session has (one thread, float32 by default, so a row
does not depend on the host's settings either), and puts everything back on the way out. A re-entrant lock
keeps two threads of that process from interleaving saves and restores (verifiers may load or
score from worker threads); it cannot hide the temporary settings from a thread that uses torch
without it, so tasks are best built before rollouts start, as load_environment does.
"""

import contextlib
import random
import threading

import torch

_LOCK = threading.RLock()


@contextlib.contextmanager
def reference_run(default_dtype: torch.dtype = torch.float32):
    """Single-threaded torch with `default_dtype` as the default inside; thread count, default dtype
    and RNG states restored after. Nests, and works as a decorator."""
    with _LOCK:
        threads = torch.get_num_threads()
        dtype = torch.get_default_dtype()
        torch_rng = torch.get_rng_state()
        python_rng = random.getstate()
        try:
            if threads != 1:
                torch.set_num_threads(1)  # the sandbox session runs single-threaded
            torch.set_default_dtype(default_dtype)
            yield
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            torch.set_default_dtype(dtype)
            torch.set_rng_state(torch_rng)
            random.setstate(python_rng)

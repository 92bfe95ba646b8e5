"""Runs vLLM's Triton kernels through Triton's interpreter on a CPU without triton-cpu.

vLLM 0.34 refuses to start on x86 CPUs unless Triton has a CPU backend (triton-cpu, which
is not published on PyPI). The test scripts put this folder on ``PYTHONPATH`` when
triton-cpu is absent, so that every process vLLM starts imports this module first: it
turns on Triton's interpreter (``TRITON_INTERPRET=1``: every ``@triton.jit`` kernel runs as
NumPy on CPU tensors) and registers a ``cpu`` backend whose only part is a driver that
says it is active, which is all vLLM's check reads. With ``AGENTSPEC_TRITON_INTERPRETER``
unset this module does nothing.

It also lets the interpreter load and store through a scalar mask (``tl.load(p, mask=i >= 0)``
with ``i`` a scalar, as vLLM 0.34's suffix kernels do): the interpreter hands its compiled
load/store a NumPy scalar there, which they refuse ("mask has unsupported dtype"); they get
0-d arrays instead.
"""

import os

if os.environ.get("AGENTSPEC_TRITON_INTERPRETER") == "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import triton.backends
    except ImportError:  # no Triton at all: vLLM says what is missing
        pass
    else:

        class _ActiveDriver:
            @staticmethod
            def is_active() -> bool:
                return True

        class _InterpreterBackend:
            compiler = None
            driver = _ActiveDriver

        triton.backends.backends.setdefault("cpu", _InterpreterBackend())  # type: ignore[arg-type]

        import numpy as np
        import triton.runtime.interpreter as _interp

        class _ArrayMasks:
            """The interpreter's compiled helpers, with every load/store argument an array."""

            def __init__(self, compiled):
                self._compiled = compiled

            def __getattr__(self, name):
                return getattr(self._compiled, name)

            def load(self, ptrs, mask, other, dtype):
                return self._compiled.load(np.asarray(ptrs), np.asarray(mask, dtype=bool), np.asarray(other), dtype)

            def store(self, ptrs, value, mask):
                return self._compiled.store(np.asarray(ptrs), np.asarray(value), np.asarray(mask, dtype=bool))

        if not isinstance(_interp._interpreter, _ArrayMasks):
            _interp._interpreter = _ArrayMasks(_interp._interpreter)

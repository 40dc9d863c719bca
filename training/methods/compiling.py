"""--compile: torch.compile the encoder layers, falling back to eager execution where it cannot.
--compile-mode reduce-overhead: each layer's kernels replayed as CUDA graphs.

Each encoder layer is compiled on its own (not the whole model): the frozen-prefix cache, SMART
and PCGrad cut the encoder at arbitrary layers (Bert.encode(start, end)), and a layer is the
unit all of them share. dynamic=True because every batch has its own length (dynamic padding).

torch.compile fails lazily, at the first call (no C++ compiler, an unsupported op, an old GPU).
Then we log why, once, and run every layer eagerly from there on: the run goes on, only slower.
The parameters stay where they were, so state_dict keys and checkpoints are unchanged.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class _Fallback:
    """Shared by all layers of one model: once any of them fails to compile, all run eagerly."""

    def __init__(self):
        self.failed = False

    def fail(self, err: BaseException) -> None:
        self.failed = True
        root = err  # the compiler's own error, under torch's wrappers (BackendCompilerFailed, ...)
        while (inner := getattr(root, "inner_exception", None) or root.__cause__ or root.__context__) is not None:
            root = inner
        first = next((line.strip() for line in str(root).splitlines() if line.strip()), "")
        log.warning("--compile: torch.compile failed (%s: %s); running the model eagerly from here on",
                    type(root).__name__, first[:300])


def compile_layers(encoder: torch.nn.Module, backend: str | object = "inductor", mode: str = "default") -> None:
    """Replace each layer's forward with a compiled one that falls back to the eager forward. mode is
    torch.compile's: "reduce-overhead" replays each layer's kernels on CUDA as a CUDA graph, recorded once
    per batch shape (the steps must then be marked: mark_step); on a CPU it compiles as "default" does.

    Call it after any deep copy of the model (SMART's EMA teacher): a copy would keep calling the
    original's compiled functions."""
    fallback = _Fallback()
    options = {} if mode == "default" else {"mode": mode}
    for layer in encoder.layers:
        compiled = torch.compile(layer.forward, dynamic=True, backend=backend, **options)
        layer.forward = _guarded(layer.forward, compiled, fallback)


def mark_step() -> None:
    """A new training step begins: CUDA graphs recorded under "reduce-overhead" may reuse the memory of
    the last step's outputs (without the mark they cannot tell a step's end from a graph's next call)."""
    torch.compiler.cudagraph_mark_step_begin()


def _guarded(eager, compiled, fallback: _Fallback):
    def forward(*args, **kwargs):
        if not fallback.failed:
            try:
                return compiled(*args, **kwargs)
            except torch.OutOfMemoryError:
                raise  # not a compiler problem; eager would only run out of memory again
            except Exception as e:  # noqa: BLE001 - any compiler failure; a real error recurs eagerly below
                fallback.fail(e)
        return eager(*args, **kwargs)

    return forward

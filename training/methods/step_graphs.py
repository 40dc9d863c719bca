"""--step-graphs: each batch shape's forward, losses and backward recorded once as one CUDA graph and
replayed at every later step of that shape, so that the host launches one graph instead of the
hundreds of kernels a step issues (a small model's step on a GPU is bound by the launches, not the
arithmetic: docs/benchmarks.md). The update (clipping, the fused AdamW step, the teacher and weight
averages) stays eager: a few foreach/fused kernels, and the non-finite test and the schedule stay
exactly the eager loop's.

    graphs = StepGraphs.for_run(stepper, device)    # None, with the reason logged, where it cannot run
    key = graphs.shape(batches)                     # once a step
    parts = graphs.replay(key, batches)             # None for a shape not recorded: the eager step, then
    graphs.capture(key, batches)                    # its graph recorded

A shape (`shape_key`) is everything a graph bakes in: each batch's task, each tensor's shape and dtype,
whether a mask has padding (the model skips the mask work where it has none: minbert.model.padding_bias),
the frozen depth. `--pad-multiple` keeps the shapes few. A shape's first step runs eagerly (it is the
real step), then its graph is recorded: one eager warm-up on a side stream with the random state put back
after it, then the capture, which launches nothing. Replays read the batch from static input buffers and
accumulate the gradients into static gradient tensors, one per parameter, shared by every graph; the
parameters a shape's step does not reach (another task's head) get no gradient, as in the eager step, so
AdamW leaves them alone. Dropout replays draw the same numbers the eager kernels would: a graph advances
the generator by what its kernels consume (torch's graph-safe philox offsets).

Where a run cannot be captured (no CUDA device, SMART's ascent, PCGrad's per-task backward, fp16's loss
scale, data parallelism, gradient accumulation) `for_run` says why once and the run steps eagerly. A
shape whose capture fails runs eagerly from then on, logged once.
"""
from __future__ import annotations

import logging

import torch

from data.batching import Batch
from training.config.train_config import TrainConfig

log = logging.getLogger(__name__)

MAX_GRAPHS = 64  # shapes recorded at most; later new shapes run eagerly (each graph holds its static inputs)


def shape_key(model, batches: list[Batch]) -> tuple:
    """What a step's graph bakes in: the frozen depth, and per batch its task, each input's shape, dtype and
    padding, and the labels' shape and dtype. Non-tensor inputs (a cached prefix's layer) by value."""
    def seq_key(seq: dict) -> tuple:
        return tuple((k, tuple(v.shape), v.dtype, getattr(v, "unpadded", None)) if torch.is_tensor(v) else (k, v)
                     for k, v in sorted(seq.items()))

    return (model.frozen_upto, tuple(
        (b.task, tuple(seq_key(s) for s in b.inputs),
         None if b.labels is None else (tuple(b.labels.shape), b.labels.dtype))
        for b in batches))


def static_copy(batch: Batch) -> Batch:
    """A batch of fresh buffers holding `batch`'s values: a graph's inputs, refilled before each replay."""
    def seq_copy(seq: dict) -> dict:
        out = {}
        for k, v in seq.items():
            out[k] = v.clone() if torch.is_tensor(v) else v
            if torch.is_tensor(v) and hasattr(v, "unpadded"):
                out[k].unpadded = v.unpadded  # a Python attribute: clone() does not carry it
        return out

    labels = None if batch.labels is None else batch.labels.clone()
    return Batch(batch.task, [seq_copy(s) for s in batch.inputs], labels, batch.ids, batch.indices)


def refill(static: Batch, batch: Batch) -> None:
    """Copy `batch`'s values into the static buffers of a graph recorded for its shape."""
    for s_seq, seq in zip(static.inputs, batch.inputs):
        for k, v in seq.items():
            if torch.is_tensor(v):
                s_seq[k].copy_(v, non_blocking=True)
    if batch.labels is not None:
        static.labels.copy_(batch.labels, non_blocking=True)


# --------------------------------------------------------------------------- the recorders

class CudaGraph:
    """One torch.cuda.CUDAGraph, recorded into a memory pool that a run's graphs share (they never run at
    once, and a graph's outputs are read before the next runs)."""

    def __init__(self, device: torch.device, pool):
        self.device, self.pool, self.graph = device, pool, None

    def warm_up(self, fn) -> None:
        """One eager call on a side stream, as CUDA graph capture asks (lazy initialisations, allocator
        pools), with the random state put back after it."""
        rng = torch.cuda.get_rng_state(self.device)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        torch.cuda.set_rng_state(rng, self.device)

    def capture(self, fn) -> list[torch.Tensor]:
        """Record fn's kernels (nothing runs); returns its outputs, the tensors each replay refills. The
        backward's kernels, launched by autograd's device thread onto the capturing stream, are recorded
        with the forward's (torch's whole-network capture)."""
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool):
            outs = fn()
        return outs

    def replay(self) -> None:
        self.graph.replay()


class EagerGraph:
    """The recorder's stand-in off CUDA, for the CPU tests: capture keeps fn and its outputs, replay calls
    fn again and copies its results into those outputs, so that a step reading anything but the static
    buffers and outputs (a stale batch, a Python value fixed at capture) goes wrong here too. The random
    state is put back after warm-up and capture, as on CUDA, where capturing draws nothing."""

    def __init__(self, device=None, pool=None):
        self.fn, self.outs = None, None

    def warm_up(self, fn) -> None:
        rng = torch.get_rng_state()
        fn()
        torch.set_rng_state(rng)

    def capture(self, fn) -> list[torch.Tensor]:
        rng = torch.get_rng_state()
        self.fn, self.outs = fn, fn()
        torch.set_rng_state(rng)
        return self.outs

    def replay(self) -> None:
        for out, new in zip(self.outs, self.fn()):
            out.copy_(new)


def recorder_for(device: torch.device):
    """The graph recorder for `device`, or None where there is none (the CPU tests patch this)."""
    return CudaGraph if device.type == "cuda" else None


# --------------------------------------------------------------------------- the graphs of a run

class _Recorded:
    """One shape's graph: its static batches, each parameter's gradient while it replays (the static
    buffer where its backward reaches the parameter, else None), the names of each batch's loss parts and
    the tensor each replay writes them to."""

    def __init__(self, graph, static: list[Batch], grads: list[tuple], names: list[list[str]], outs: list):
        self.graph, self.static, self.grads, self.names, self.outs = graph, static, grads, names, outs


class StepGraphs:
    """A run's step graphs, one per batch shape (shape_key), and the static gradients they share."""

    def __init__(self, stepper, recorder):
        self.stepper, self.recorder = stepper, recorder
        self.pool = torch.cuda.graph_pool_handle() if recorder is CudaGraph else None
        self.recorded: dict[tuple, _Recorded] = {}
        self.eager: set[tuple] = set()  # shapes whose capture failed
        self.replayed = 0  # steps replayed so far (the log's count, per epoch: Run.end_epoch)
        self.grads: dict[torch.nn.Parameter, torch.Tensor] = {}  # static gradient buffers
        self.full_logged = False

    @classmethod
    def for_run(cls, stepper, device: torch.device, dist=None) -> StepGraphs | None:
        """The run's step graphs, or None with the reason logged once where its steps cannot be captured."""
        recorder = recorder_for(device)
        reason = uncapturable(stepper.cfg, device, recorder is not None, dist, stepper.loss_scaler is not None)
        if reason:
            log.warning("--step-graphs: %s; every step runs eagerly", reason)
            return None
        if stepper.cfg.pad_multiple == 1:
            log.warning("--step-graphs with --pad-multiple 1: each batch length is a shape of its own, recorded "
                        "once; --pad-multiple 16 makes them few")
        log.info("--step-graphs: each batch shape's forward and backward recorded as one CUDA graph at its "
                 "first step (which runs eagerly), replayed after; the update runs eagerly")
        return cls(stepper, recorder)

    def summary(self) -> str:
        """The log's line: shapes recorded, failed, steps replayed (counted afresh after each call)."""
        line = f"--step-graphs: {len(self.recorded)} shapes recorded, {self.replayed} steps replayed"
        self.replayed = 0
        return line + (f", {len(self.eager)} shapes eager (their capture failed)" if self.eager else "")

    def shape(self, batches: list[Batch]) -> tuple:
        """The step's shape (shape_key), worked out once a step for replay and capture."""
        return shape_key(self.stepper.model, batches)

    def replay(self, key: tuple, batches: list[Batch]) -> dict[str, dict[str, float]] | None:
        """The step's forward and backward by its shape's graph: the gradients left on the parameters it
        reaches (the others without one), the loss parts returned in one copy to the host. None where the
        shape has no graph (the step runs eagerly)."""
        rec = self.recorded.get(key)
        if rec is None:
            return None
        for static, batch in zip(rec.static, batches):
            refill(static, batch)
        for p, grad in rec.grads:
            p.grad = grad
        rec.graph.replay()
        self.replayed += 1
        values = torch.cat(rec.outs).tolist()
        parts, i = {}, 0
        for static, names in zip(rec.static, rec.names):
            parts[static.task] = dict(zip(names, values[i:i + len(names)]))
            i += len(names)
        return parts

    def capture(self, key: tuple, batches: list[Batch]) -> None:
        """Record the graph of `batches`' shape `key`, after its first step ran eagerly (and left each
        reached parameter's gradient). A failed capture leaves the shape eager, said once."""
        if key in self.recorded or key in self.eager:
            return
        if len(self.recorded) >= MAX_GRAPHS:
            if not self.full_logged:
                log.warning("--step-graphs: %d shapes recorded; new shapes run eagerly (--pad-multiple makes "
                            "them fewer)", MAX_GRAPHS)
                self.full_logged = True
            return
        params = [p for g in self.stepper.optimizer.param_groups for p in g["params"]]
        grads = [(p, self.grads.setdefault(p, torch.zeros_like(p)) if p.grad is not None else None) for p in params]
        reached = [p for p, grad in grads if grad is not None]
        static = [static_copy(b) for b in batches]
        names: list[list[str]] = []
        graph = self.recorder(self.stepper.device, self.pool)
        try:
            for p, grad in grads:
                p.grad = grad
            graph.warm_up(lambda: self._forward_backward(static, reached, names))
            names.clear()
            outs = graph.capture(lambda: self._forward_backward(static, reached, names))
        except Exception as e:  # noqa: BLE001 - any capture failure; the step itself already ran eagerly
            self.eager.add(key)
            log.warning("--step-graphs: capturing a %s step failed (%s: %s); steps of that shape run eagerly",
                        "+".join(b.task for b in batches), type(e).__name__, str(e).splitlines()[0][:200])
            return
        finally:
            for p in params:
                p.grad = None
        self.recorded[key] = _Recorded(graph, static, grads, names, outs)

    def _forward_backward(self, static: list[Batch], reached: list, names: list) -> list[torch.Tensor]:
        """What a graph records: the gradients zeroed, each batch's loss and backward (accumulating into
        the static gradients), each batch's loss parts stacked into one fp32 tensor."""
        stepper = self.stepper
        torch._foreach_zero_([self.grads[p] for p in reached])
        outs = []
        for b in static:
            with stepper.autocast(cache=False):  # autocast's weight cache would outlive the graph's memory
                loss, terms = stepper.loss_terms(b)
            loss.backward()
            if len(names) < len(static):  # the first call's (a stand-in recorder calls again at each replay)
                names.append(list(terms))
            outs.append(torch.stack([t.detach().float().reshape(()) for t in terms.values()]))
        return outs


def uncapturable(cfg: TrainConfig, device: torch.device, has_recorder: bool, dist, fp16: bool) -> str | None:
    """Why a run's steps cannot be recorded as graphs, or None."""
    if not has_recorder:
        return f"CUDA graphs need a CUDA device, not {device.type}"
    ascent = "SMART's adversarial ascent (--smart-lambda 0, the Bregman term alone, can)"
    reasons = [(cfg.smart and cfg.smart_lambda > 0, ascent), (cfg.pcgrad, "PCGrad's per-task backward"),
               (fp16, "fp16's dynamic loss scale"), (dist is not None, "data-parallel steps"),
               (cfg.grad_accum_steps > 1, "--grad-accum-steps")]
    found = [why for on, why in reasons if on]
    return f"{', '.join(found)} cannot be captured" if found else None

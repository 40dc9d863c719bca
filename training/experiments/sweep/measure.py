"""One run, measured: trained in a fresh child process (so that its peak memory is its own) or in this
one, its wall time, memory and trainable parameters, and its kept model scored on the dev sets.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from data.loaders import load_task_file
from training.common.processes import hold_run_folder
from training.common.progress import setup_logging
from training.config.train_config import TrainConfig
from training.methods.peft import trainable_counts
from training.run import signals
from training.run.signals import exit_with_parent, stop_after

log = logging.getLogger(__name__)


def measure(cfg: TrainConfig, threads: int | None = None, report_dev: dict[str, str] | None = None) -> dict:
    """Train in this process and return the best dev metrics with time and memory figures. With
    report_dev ({task: dev file}; cfg's dev files are then a tuning split), the kept model (best.pt) is
    also scored on those files once training is over: "report" holds their metrics and predictions."""
    import resource

    import torch

    from training.common.device import gpu_name
    from training.run.build import build_model
    from training.run.trainer import train

    if threads:
        torch.set_num_threads(threads)
    cuda = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    t0 = time.perf_counter()
    metrics = train(cfg)
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cuda_peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    gpu = gpu_name() if cuda else None  # asked by the process that trained: a sweep that spawns runs never touches CUDA
    report = score_kept_model(cfg, report_dev) if report_dev else None
    model, _, _ = build_model(cfg)  # after the measurement: only to count what freezing (and --peft) left trainable
    trainable, total = trainable_counts(model)
    return {"metrics": metrics, "wall_seconds": wall, "peak_rss_mib": peak, "base_rss_mib": base,
            "cuda_peak_mib": cuda_peak, "gpu": gpu, "trainable_params": trainable, "total_params": total,
            "threads": torch.get_num_threads(), **({"report": report} if report else {})}


def score_kept_model(cfg: TrainConfig, dev_files: dict[str, str]) -> dict:
    """The run's kept model (OUT_DIR/best.pt) scored on each task's file: {"metrics": {sst_acc, ...,
    overall}, "predictions": {task: [per-example prediction, in the file's order]}}."""
    from heads import predict
    from training.api import load
    from training.inference.metrics import METRIC, overall, score

    model = load(cfg.out_dir, device=cfg.device, batch_size=cfg.eval_batch_size)
    metrics, predictions = {}, {}
    for task, path in dev_files.items():
        examples = load_task_file(path, task, labelled=True).examples
        preds = predict(task, model.outputs(task, examples)).double().numpy()
        metrics[METRIC[task]] = score(task, preds, [e.label for e in examples])
        predictions[task] = [round(float(x), 6) for x in preds] if task == "sts" else [int(x) for x in preds]
    return {"metrics": {**metrics, "overall": overall(metrics)}, "predictions": predictions}


def _child(cfg_dict: dict, threads: int | None, log_level: int, conn, report_dev: dict | None,
           sweep_pid: int) -> None:
    """The training process: its reply ends with the stop signal it received, if any (its sweep stops too).
    It trains only while it holds its run folder's trainer lock, taken while its sweep still lives."""
    setup_logging(log_level)
    cfg = TrainConfig.from_dict(cfg_dict)
    if hold_run_folder(Path(cfg.out_dir), sweep_pid) is None:  # the sweep died before this process began
        return
    exit_with_parent(sweep_pid)
    with stop_after("run"):
        try:
            reply = ("ok", measure(cfg, threads, report_dev))
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
            import traceback
            reply = ("error", f"{type(e).__name__}: {e}", traceback.format_exc())
        try:
            conn.send((*reply, signals.received()))
        except OSError:  # the sweep is gone (killed): nobody to tell
            pass
        finally:
            conn.close()


class RunFailed(RuntimeError):
    pass


def measure_isolated(cfg: TrainConfig, threads: int | None = None, report_dev: dict | None = None) -> dict:
    """measure(cfg) in a fresh spawned process (its own ru_maxrss and CUDA allocator)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(cfg.to_dict(), threads, logging.getLogger().getEffectiveLevel(), child,
                                         report_dev, os.getpid()),
                    name=f"sweep:{Path(cfg.out_dir).name}")
    p.start()
    child.close()
    forward = lambda signum: p.terminate()  # noqa: E731 - a stop signal to the sweep stops the run after its step
    signals._on_stop.append(forward)
    try:
        if signals.received():  # came between the sweep's check and the start
            p.terminate()
        try:
            reply = parent.recv()
        except EOFError:
            p.join()
            if -(p.exitcode or 0) in (signal.SIGINT, signal.SIGTERM):  # stopped by a signal before its handler
                signals.record(-p.exitcode)
            raise RunFailed(f"the training process died without a result (exit code {p.exitcode})") from None
        p.join()
    finally:
        signals._on_stop.remove(forward)
        if p.is_alive():  # interrupted while waiting: SIGTERM makes the trainer stop cleanly
            p.terminate()
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    if reply[-1]:
        signals.record(reply[-1])  # the run ends, and then the sweep
    if reply[0] == "error":
        log.debug("%s", reply[2])
        raise RunFailed(f"{reply[1]}\n{reply[2]}")
    return reply[1]

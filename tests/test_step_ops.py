"""bench/step_ops.py's device busy share: each kernel counted once, as the profiler's own total counts it."""
import re

import pytest
from bench_scripts import bench_script
from torch.autograd import DeviceType
from torch.autograd.profiler_util import EventList, FunctionEvent


@pytest.fixture(scope="module")
def step_ops():
    return bench_script("step_ops")


def event(id: int, name: str, start_us: int, end_us: int, **kw) -> FunctionEvent:
    return FunctionEvent(id=id, name=name, thread=kw.pop("thread", 1), start_us=start_us, end_us=end_us,
                         use_device="cuda", stack=[], **kw)


def averaged(events: list) -> EventList:
    """key_averages() of the events, as profile().key_averages() gives them (the profiler builds the tree)."""
    listed = EventList(events, use_device="cuda")
    listed._build_tree()
    return listed.key_averages()


def profiled_mm() -> EventList:
    """What torch.profiler records for one matmul on CUDA, built by hand: the aten op on the host holding its
    kernel (5 us), the kernel's own event on the device (the same 5 us), and a user annotation
    (record_function, as the optimiser's step is) timed on the device over it (6 us)."""
    op = event(1, "aten::mm", 0, 20)
    op.append_kernel("sm80_xmma_gemm", 0, 5)
    kernel = event(2, "sm80_xmma_gemm", 100, 105, thread=7, device_type=DeviceType.CUDA)
    step = event(3, "Optimizer.step#AdamW.step", 99, 105, thread=7, device_type=DeviceType.CUDA,
                 is_user_annotation=True)
    return averaged([op, kernel, step])


def test_each_kernel_is_counted_once(step_ops):
    events = profiled_mm()
    # the double count this fixes: both the op and its kernel carry the kernel's 5 us as self device time
    assert sum(e.self_device_time_total for e in events) == 5 + 5 + 6
    assert step_ops.kernel_seconds(events) == pytest.approx(5e-6)


def test_the_count_is_the_profilers_own_total(step_ops):
    """The same number as the table's "Self CUDA time total" line (the figure the records' logs show)."""
    events = profiled_mm()
    total = re.search(r"Self CUDA time total: ([\d.]+)us", events.table())
    assert total, events.table()
    assert step_ops.kernel_seconds(events) == pytest.approx(float(total.group(1)) * 1e-6)


def test_the_legacy_profilers_kernels_count_on_their_op(step_ops):
    """Where the kernel's time lives only on its op's event (is_legacy), the op is what is counted."""
    op = event(1, "aten::mm", 0, 20, is_legacy=True)
    op.append_kernel("aten::mm", 0, 5)
    assert step_ops.kernel_seconds(averaged([op])) == pytest.approx(5e-6)

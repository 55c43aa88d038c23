"""What a FusionDefinition's values and programs live as long as, and executing from several
threads: values outlive their definition safely, identical definitions share compiled programs but
not what they report, and concurrent calls give every thread its own correct result."""
import gc
import threading

import pytest
import torch

import meshfuser
from meshfuser import DataType, FusionDefinition


def test_values_keep_their_definition_alive():
    fd = FusionDefinition()
    with fd:
        a = fd.define_tensor([2], DataType.Float)
        b = fd.ops.neg(a)
        var, mean = fd.ops.var_mean(a, [0])
        extents = fd.ops.shape(a)
    del fd, a
    gc.collect()
    for _ in range(200):  # reuse the freed memory, as a dangling pointer would see it
        with FusionDefinition() as other:
            other.ops.exp(other.define_tensor([7, 7, 7], DataType.Double))
    assert str(b).startswith("T1_float[") and "float" in str(var) and "float" in str(mean)
    assert [str(e) for e in extents] == ["2"]


def _scaled(scale):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1], dtype=DataType.Float)
        fd.add_output(fd.ops.mul(x, scale))
    return fd


def test_identical_definitions_report_their_own_last_call():
    f1, f2 = _scaled(2.0), _scaled(2.0)
    f1.execute([torch.ones(3)])
    assert f1._handle.num_executors() == f2._handle.num_executors() == 1  # one compiled program
    assert "mul(T0, 2)" in f1.host_program()
    with pytest.raises(meshfuser.Error, match="no program yet: call execute"):
        f2.host_program()  # f2 never ran: f1's call is not its own
    f2.execute([torch.ones(5)])
    assert "mul(T0, 2)" in f2.host_program()


def test_concurrent_execution_from_threads():
    definitions = [_scaled(2.0), _scaled(2.0), _scaled(3.0)]  # two share a compiled program
    failures = []

    def work(t):
        fd = definitions[t % len(definitions)]
        scale = 3.0 if t % len(definitions) == 2 else 2.0
        for i in range(200):
            x = torch.randn(1 + (t * 7 + i) % 13)
            (out,) = fd.execute([x])
            if not torch.equal(out, x * scale):
                failures.append((t, i))

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)
    assert failures == []


def test_definitions_built_in_two_threads_at_once():
    # Operator sugar (x * 2.0) uses the definition being built in this thread, not another's.
    barrier = threading.Barrier(2, timeout=30)  # a failing thread breaks it: no hang
    results = {}

    def build(t):
        with FusionDefinition() as fd:
            x = fd.define_tensor([-1], dtype=DataType.Float)
            barrier.wait()
            fd.add_output(x * float(t + 2))
            barrier.wait()
        results[t] = fd.execute([torch.ones(4)])[0]

    threads = [threading.Thread(target=build, args=(t,), daemon=True) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert torch.equal(results[0], torch.full((4,), 2.0)) and torch.equal(results[1], torch.full((4,), 3.0))

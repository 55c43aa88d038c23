"""execute(inputs, release_inputs=True): the caller hands its list over; the program drops each input
after its last use, so a backward's saved activations are freed as it consumes them (as a compiled
backward frees what it has read), not when the call returns."""
import weakref

import numpy as np
import pytest
import torch

import meshfuser
from meshfuser import DataType, FusionDefinition

ROWS = 256


def _definition():
    """T0 is last read by the first segment, T1 by the last one."""
    fd = FusionDefinition()
    with fd:
        a = fd.define_tensor([ROWS, 8], dtype=DataType.Float)
        w = fd.define_tensor([8, 8], dtype=DataType.Float)
        b = fd.define_tensor([ROWS, 8], dtype=DataType.Float)
        t = fd.ops.exp(a)
        u = fd.ops.matmul(t, w)
        fd.add_output(fd.ops.sum(fd.ops.mul(u, b), [1]))
    return fd


def _reference(a, w, b):
    return ((a.exp() @ w) * b).sum(1)


def _numpy_backed(seed):
    """A tensor whose memory is a numpy array: the array is released exactly when the last
    reference to the tensor's storage goes, which a weak reference to it observes."""
    array = np.random.default_rng(seed).standard_normal((ROWS, 8)).astype(np.float32)
    return torch.from_numpy(array), array


def test_release_inputs_empties_the_list_and_gives_the_same_result():
    fd = _definition()
    a, w, b = (torch.randn(s) for s in ([ROWS, 8], [8, 8], [ROWS, 8]))
    kept = [a.clone(), w.clone(), b.clone()]
    expected = _reference(a, w, b)
    inputs = [a, w, b]
    (out,) = fd.execute(inputs, release_inputs=True)
    assert inputs == []
    torch.testing.assert_close(out, expected)
    # Tensors the caller still references are untouched.
    for mine, copy in zip((a, w, b), kept):
        assert torch.equal(mine, copy)
    (again,) = fd.execute([a, w, b])
    torch.testing.assert_close(again, expected)


def test_each_input_is_dropped_after_its_last_use_during_the_call():
    fd = _definition()
    w = torch.randn(8, 8)
    fd.execute([torch.randn(ROWS, 8), w, torch.randn(ROWS, 8)])  # compiled before anything is observed
    freed, returned = [], [False]

    def observe(name, array):
        return weakref.ref(array, lambda _: freed.append((name, returned[0])))

    a, a_array = _numpy_backed(1)
    b, b_array = _numpy_backed(2)
    expected = _reference(a, w, b)
    watch = [observe("a", a_array), observe("b", b_array)]
    inputs = [a, w, b]
    del a, b, a_array, b_array
    (out,) = fd.execute(inputs, release_inputs=True)
    returned[0] = True
    torch.testing.assert_close(out, expected)
    # Both were freed inside the call, T0 after the first segment, T1 after the last one.
    assert freed == [("a", False), ("b", False)], (freed, watch)

    # Without release_inputs the caller's list keeps them alive until it lets go.
    freed.clear()
    returned[0] = False
    a, a_array = _numpy_backed(3)
    watch = [observe("a", a_array)]
    inputs = [a, w, torch.randn(ROWS, 8)]
    del a, a_array
    fd.execute(inputs)
    returned[0] = True
    assert freed == []
    del inputs
    assert freed == [("a", True)], watch


def test_host_program_shows_where_each_input_is_released():
    fd = _definition()
    fd.execute([torch.randn(ROWS, 8), torch.randn(8, 8), torch.randn(ROWS, 8)])
    lines = [line.strip() for line in fd.host_program(deallocations=True).splitlines()]
    first_segment = next(i for i, line in enumerate(lines) if line.startswith("run segment 0"))
    assert lines[first_segment + 1] == "release input T0", lines
    assert "release input T2" in lines and "release input T1" in lines, lines
    # The short form hides them with the deallocations.
    assert "release input" not in fd.host_program()


def test_release_inputs_needs_a_list():
    fd = _definition()
    inputs = (torch.randn(ROWS, 8), torch.randn(8, 8), torch.randn(ROWS, 8))
    with pytest.raises(meshfuser.Error, match=r"release_inputs=True.*got a tuple: pass a list"):
        fd.execute(inputs, release_inputs=True)


def test_release_inputs_inside_torch_compile_is_an_error():
    fd = _definition()
    inputs = [torch.randn(ROWS, 8), torch.randn(8, 8), torch.randn(ROWS, 8)]
    fd.execute(list(inputs))

    def step(a, w, b):
        return fd.execute([a, w, b], release_inputs=True)[0]

    with pytest.raises(Exception, match=r"release_inputs=True\) inside torch.compile"):
        torch.compile(step, backend="eager", fullgraph=True)(*inputs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (peak memory of the caching allocator)")
def test_released_inputs_lower_the_peak_on_cuda():
    """A 64 MiB input last read by the first kernel is gone before the 64 MiB GEMM output exists."""
    rows, cols = 1 << 14, 1024
    fd = FusionDefinition()
    with fd:
        a = fd.define_tensor([rows, cols], dtype=DataType.Float)
        w = fd.define_tensor([cols, cols], dtype=DataType.Float)
        t = fd.ops.exp(a)
        fd.add_output(fd.ops.sum(fd.ops.matmul(t, w), [1]))
    w_gpu = torch.randn(cols, cols, device="cuda") / cols

    def peak(release):
        inputs = [torch.randn(rows, cols, device="cuda"), w_gpu]
        expected = (inputs[0].exp() @ w_gpu).sum(1)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        (out,) = fd.execute(inputs, release_inputs=release)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-3)
        return torch.cuda.max_memory_allocated() - base

    peak(False)
    kept, released = peak(False), peak(True)
    size = rows * cols * 4
    assert kept - released >= size, (kept, released)

"""A generated kernel writes an output into the buffer of an intermediate its segment reads last
(runtime/segment_kernels.cpp), as Inductor reuses buffers: the activation gradient of a GELU
backward then takes no buffer beside dy @ W2. GPU only (the runtime launches kernels on CUDA
tensors); each test compares the peak memory of a run with MESHFUSER_DISABLE=inplace_outputs, and
the results with PyTorch on the same tensors."""
import pytest
import torch

from meshfuser import DataType, FusionDefinition, _C

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ROWS, COLS, E = 4096, 8192, 1024  # [ROWS, COLS] bf16 intermediates of 64 MiB


def _peak_and_outputs(fd, inputs, inplace):
    import os
    old = os.environ.get("MESHFUSER_DISABLE")
    if not inplace:
        os.environ["MESHFUSER_DISABLE"] = "inplace_outputs"
    else:
        os.environ.pop("MESHFUSER_DISABLE", None)
    _C.reload_options()
    try:
        fd.execute(inputs)  # plans and compiles
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        outputs = fd.execute(inputs)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base, outputs
    finally:
        if old is None:
            os.environ.pop("MESHFUSER_DISABLE", None)
        else:
            os.environ["MESHFUSER_DISABLE"] = old
        _C.reload_options()


def _gelu_backward(with_bias_gradient):
    """d_pre = (dy @ W2) * sigmoid(pre): dy @ W2 dies in the kernel that makes d_pre."""
    with FusionDefinition() as fd:
        dy = fd.define_tensor([ROWS, E], dtype=DataType.BFloat16)
        w2 = fd.define_tensor([E, COLS], dtype=DataType.BFloat16)
        pre = fd.define_tensor([ROWS, COLS], dtype=DataType.BFloat16)
        d_act = fd.ops.matmul(dy, w2)
        d_pre = fd.ops.cast(fd.ops.mul(fd.ops.cast(d_act, DataType.Float),
                                       fd.ops.sigmoid(fd.ops.cast(pre, DataType.Float))), DataType.BFloat16)
        fd.add_output(d_pre)
        if with_bias_gradient:  # a reduction kernel: the column sum beside d_pre
            fd.add_output(fd.ops.cast(fd.ops.sum(fd.ops.cast(d_pre, DataType.Float), [0]), DataType.BFloat16))
    return fd


@pytest.mark.parametrize("with_bias_gradient", [False, True], ids=["pointwise", "reduction"])
def test_dying_intermediate_buffer_takes_the_kernel_output(with_bias_gradient):
    g = torch.Generator().manual_seed(0)
    dy, w2, pre = (torch.randn(shape, generator=g).to("cuda", torch.bfloat16) * 0.1
                   for shape in ([ROWS, E], [E, COLS], [ROWS, COLS]))
    fd = _gelu_backward(with_bias_gradient)
    peak_reuse, outs = _peak_and_outputs(fd, [dy, w2, pre], inplace=True)
    peak_fresh, outs_fresh = _peak_and_outputs(fd, [dy, w2, pre], inplace=False)
    intermediate = ROWS * COLS * 2
    # Without reuse dy @ W2 and d_pre are live together; with it, d_pre is written over dy @ W2.
    assert peak_fresh - peak_reuse >= intermediate, (peak_fresh, peak_reuse)
    d_pre = ((dy @ w2).float() * torch.sigmoid(pre.float())).to(torch.bfloat16)
    torch.testing.assert_close(outs[0], d_pre, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(outs[0], outs_fresh[0], rtol=0, atol=0)
    if with_bias_gradient:
        torch.testing.assert_close(outs[1], d_pre.float().sum(0).to(torch.bfloat16), rtol=2e-2, atol=1e-1)
        torch.testing.assert_close(outs[1], outs_fresh[1], rtol=0, atol=0)


def _exp_times_two():
    with FusionDefinition() as fd:
        x = fd.define_tensor([ROWS, COLS], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.mul(fd.ops.exp(x), 2.0))
    return fd


def test_inputs_the_caller_holds_are_never_overwritten():
    """A fusion input the kernel reads last is the caller's: the output takes a buffer of its own."""
    fd = _exp_times_two()
    x = torch.randn(ROWS, COLS, device="cuda").to(torch.bfloat16)
    keep = x.clone()
    (out,) = fd.execute([x])
    assert out.data_ptr() != x.data_ptr()
    torch.testing.assert_close(x, keep, rtol=0, atol=0)
    torch.testing.assert_close(out, (torch.exp(keep.float()) * 2).to(torch.bfloat16), rtol=1e-2, atol=1e-2)
    # Handed over but still referenced by the caller: still not written.
    inputs = [x]
    (out,) = fd.execute(inputs, release_inputs=True)
    assert out.data_ptr() != x.data_ptr()
    torch.testing.assert_close(x, keep, rtol=0, atol=0)


def test_a_released_input_buffer_takes_the_kernel_output():
    """execute(..., release_inputs=True) with no other reference: the input is the program's, and the
    kernel that reads it last writes its output there (a backward's saved pre-activation becomes
    the activation recomputed from it)."""
    fd = _exp_times_two()
    x = torch.randn(ROWS, COLS, device="cuda").to(torch.bfloat16)
    expected = (torch.exp(x.float()) * 2).to(torch.bfloat16)
    fd.execute([x.clone()])  # plans and compiles
    address = x.data_ptr()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    inputs = [x]
    del x
    (out,) = fd.execute(inputs, release_inputs=True)
    torch.cuda.synchronize()
    assert out.data_ptr() == address
    assert torch.cuda.max_memory_allocated() - base < ROWS * COLS * 2, "the output took a buffer of its own"
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)


def test_a_gemm_output_viewed_as_3d_takes_the_kernel_output():
    """gelu(linear(x, w, b)) on a [1, tokens, e] input: ATen returns the 2-D GEMM's output viewed as
    3-D, whose base only that view holds, so the GELU is written over it (the GPT MLP's inference
    peak had held both, 0.19 GiB over compile's)."""
    with FusionDefinition() as fd:
        x = fd.define_tensor([1, ROWS, E], dtype=DataType.BFloat16)
        w = fd.define_tensor([COLS, E], dtype=DataType.BFloat16)
        b = fd.define_tensor([COLS], dtype=DataType.BFloat16)
        fd.add_output(fd.ops.gelu(fd.ops.linear(x, w, b)))
    g = torch.Generator().manual_seed(1)
    inputs = [(torch.randn(shape, generator=g) * 0.1).to("cuda", torch.bfloat16) for shape in ([1, ROWS, E], [COLS, E], [COLS])]
    peak_reuse, outs = _peak_and_outputs(fd, inputs, inplace=True)
    peak_fresh, outs_fresh = _peak_and_outputs(fd, inputs, inplace=False)
    assert peak_fresh - peak_reuse >= ROWS * COLS * 2, (peak_fresh, peak_reuse)
    expected = torch.nn.functional.gelu(torch.nn.functional.linear(*inputs).float()).to(torch.bfloat16)
    torch.testing.assert_close(outs[0], expected, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(outs[0], outs_fresh[0], rtol=0, atol=0)

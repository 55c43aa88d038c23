"""fd.ops.uniform (counter-based random numbers) and fd.ops.embedding_fwd on one process.

The reference for uniform is an independent NumPy implementation of the function documented in
csrc/support/counter_rng.h (uint32 arithmetic, no int64 limb tricks), compared bit for bit."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DataType, FusionDefinition

_TORCH = {DataType.Float: torch.float32, DataType.Half: torch.float16, DataType.BFloat16: torch.bfloat16,
          DataType.Double: torch.float64}
_BITS = {DataType.Float: 24, DataType.Half: 11, DataType.BFloat16: 8}


# ---- the reference generator ---------------------------------------------------------------
def _fmix32(h):
    h = np.asarray(h, dtype=np.uint32)
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _keys(seed, offset):
    u32 = lambda v: np.uint32(v & 0xFFFFFFFF)
    h = _fmix32(u32(seed) ^ np.uint32(0x9E3779B9))
    h = _fmix32(h ^ u32(seed >> 32))
    h = _fmix32(h ^ u32(offset) ^ np.uint32(0x7F4A7C15))
    h = _fmix32(h ^ u32(offset >> 32))
    keys = []
    for _ in range(4):
        h = _fmix32(h + np.uint32(0x6A09E667))
        keys.append(h)
    return keys


def _word(index, keys, j):
    lo = (index & 0xFFFFFFFF).astype(np.uint32)
    hi = (index >> 32).astype(np.uint32)
    return _fmix32(_fmix32(lo ^ keys[2 * j]) ^ hi ^ keys[2 * j + 1])


def reference_uniform(shape, low, high, dtype, seed=0, offset=0):
    with np.errstate(over="ignore"):
        index = np.arange(int(np.prod(shape)), dtype=np.int64)
        keys = _keys(seed, offset)
        w0 = _word(index, keys, 0)
        if dtype == DataType.Double:
            w1 = _word(index, keys, 1)
            bits = (w0.astype(np.int64) >> 5) * (1 << 26) + (w1.astype(np.int64) >> 6)
            v = torch.from_numpy(bits.astype(np.float64) * 2.0 ** -53 * (high - low) + low)
            return v.masked_fill(v >= high, low).reshape(shape)
        m = _BITS[dtype]
        lo_t = torch.tensor(low, dtype=_TORCH[dtype]).float()
        hi_t = torch.tensor(high, dtype=_TORCH[dtype]).float()
        u = torch.from_numpy((w0 >> np.uint32(32 - m)).astype(np.float32) * np.float32(2.0 ** -m))
        v = (u * (hi_t - lo_t) + lo_t).to(_TORCH[dtype])
        return v.masked_fill(v >= hi_t, lo_t.item()).reshape(shape)


def _uniform(shape, low=0.0, high=1.0, dtype=DataType.Float, seed=None, offset=None):
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.uniform(low, high, shape, dtype=dtype, rng_seed=seed, rng_offset=offset))
    (out,) = fd.execute([])
    return out


# ---- uniform --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Half, DataType.BFloat16, DataType.Double])
@pytest.mark.parametrize("low,high", [(0.0, 1.0), (-3.0, 5.0), (1.0, 2.0)])
def test_uniform_matches_reference_bit_for_bit(dtype, low, high):
    out = _uniform([37, 129], low, high, dtype, seed=1234, offset=7)
    assert out.dtype == _TORCH[dtype] and out.shape == (37, 129) and out.device.type == "cpu"
    ref = reference_uniform([37, 129], low, high, dtype, seed=1234, offset=7)
    assert torch.equal(out, ref)
    assert bool((out >= low).all()) and bool((out < high).all())


def test_uniform_never_reaches_high_when_rounding_up():
    # In bfloat16 most draws of [1, 2) round up to 2.0 for some u; they must come back as low.
    out = _uniform([1 << 16], 1.0, 2.0, DataType.BFloat16, seed=5)
    assert bool((out < 2.0).all()) and bool((out >= 1.0).all())


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.Double])
def test_uniform_distribution(dtype):
    n = 1 << 20
    low, high = -2.0, 6.0
    out = _uniform([n], low, high, dtype, seed=42).double()
    # Mean and variance of U(low, high) within about 5 standard errors.
    assert abs(out.mean().item() - (low + high) / 2) < 5 * (high - low) / np.sqrt(12 * n)
    assert abs(out.var().item() - (high - low) ** 2 / 12) < 0.01 * (high - low) ** 2 / 12
    # Kolmogorov-Smirnov: the empirical CDF stays within 1.95 / sqrt(n) (0.1% level) of the uniform one.
    u = ((out - low) / (high - low)).sort().values
    ranks = torch.arange(1, n + 1, dtype=torch.float64) / n
    ks = torch.maximum((ranks - u).abs(), (u - (ranks - 1.0 / n)).abs()).max().item()
    assert ks < 1.95 / np.sqrt(n), ks
    # Neighbouring elements are not correlated (the index is the counter).
    x = out[:-1] - out.mean()
    y = out[1:] - out.mean()
    assert abs((x * y).mean().item() / out.var().item()) < 5 / np.sqrt(n)


@pytest.mark.parametrize("dtype", [DataType.Half, DataType.BFloat16])
def test_uniform_distribution_reduced_precision(dtype):
    n = 1 << 20
    out = _uniform([n], 0.0, 1.0, dtype, seed=9).double()
    m = _BITS[dtype]
    # Values are multiples of 2^-m: the mean of U on that grid is (1 - 2^-m) / 2.
    assert abs(out.mean().item() - (1 - 2.0 ** -m) / 2) < 5 / np.sqrt(12 * n)
    assert out.unique().numel() == 2 ** m if dtype == DataType.BFloat16 else out.unique().numel() > 1000


def test_uniform_deterministic_and_keyed_on_seed_and_offset():
    a = _uniform([1000], seed=3, offset=11)
    assert torch.equal(a, _uniform([1000], seed=3, offset=11))
    b = _uniform([1000], seed=3, offset=12)
    c = _uniform([1000], seed=4, offset=11)
    assert (a != b).float().mean() > 0.99 and (a != c).float().mean() > 0.99
    # Shifting the offset does not shift the stream (offset 12 is not offset 11 moved by one).
    assert (a[1:] != b[:-1]).float().mean() > 0.99


def test_uniform_default_seed_and_offset_are_zero():
    assert torch.equal(_uniform([64]), _uniform([64], seed=0, offset=0))
    assert torch.equal(_uniform([64]), reference_uniform([64], 0.0, 1.0, DataType.Float))


def test_uniform_values_depend_on_global_index_only():
    # The same element index gives the same value whatever the shape around it.
    flat = _uniform([6 * 10], seed=77, offset=1)
    assert torch.equal(_uniform([6, 10], seed=77, offset=1).reshape(-1), flat)
    assert torch.equal(_uniform([3, 2, 10], seed=77, offset=1).reshape(-1), flat)


def test_uniform_runtime_scalars():
    with FusionDefinition() as fd:
        low = fd.define_scalar(dtype=DataType.Double)
        high = fd.define_scalar(dtype=DataType.Double)
        seed = fd.define_scalar(dtype=DataType.Int)
        offset = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.uniform(low, high, [8, 16], rng_seed=seed, rng_offset=offset))
    (out,) = fd.execute([-1.0, 3.0, 2024, 5])
    assert torch.equal(out, reference_uniform([8, 16], -1.0, 3.0, DataType.Float, 2024, 5))
    (out2,) = fd.execute([-1.0, 3.0, 2024, 6])
    assert torch.equal(out2, reference_uniform([8, 16], -1.0, 3.0, DataType.Float, 2024, 6))
    # A large seed keeps its high word.
    (big,) = fd.execute([0.0, 1.0, (1 << 40) + 3, 0])
    assert torch.equal(big, reference_uniform([8, 16], 0.0, 1.0, DataType.Float, (1 << 40) + 3, 0))


def test_uniform_on_input_device_and_with_tensor_inputs():
    x = torch.randn(4, 32)
    with FusionDefinition() as fd:
        tx = fd.define_tensor([4, 32])
        r = fd.ops.uniform(0.0, 1.0, [4, 32], rng_seed=1, rng_offset=2)
        fd.add_output(fd.ops.add(tx, r))
    (out,) = fd.execute([x])
    torch.testing.assert_close(out, x + reference_uniform([4, 32], 0.0, 1.0, DataType.Float, 1, 2), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16])
def test_dropout_pattern(dtype):
    p = 0.3
    x = torch.randn(16, 64).to(_TORCH[dtype])
    with FusionDefinition() as fd:
        tx = fd.define_tensor([16, 64], dtype=dtype)
        r = fd.ops.uniform(0.0, 1.0, [16, 64], dtype=dtype, rng_seed=11, rng_offset=0)
        keep = fd.ops.lt(r, 1.0 - p)
        scaled = fd.ops.cast(fd.ops.mul(tx, 1.0 / (1.0 - p)), dtype)
        fd.add_output(fd.ops.where(keep, scaled, 0.0))
        fd.add_output(keep)
    out, keep = fd.execute([x])
    ref_keep = reference_uniform([16, 64], 0.0, 1.0, dtype, 11, 0) < 1.0 - p
    assert torch.equal(keep, ref_keep)
    torch.testing.assert_close(out, torch.where(ref_keep, (x * (1.0 / (1.0 - p))).to(_TORCH[dtype]), 0.0).to(out.dtype))
    assert abs(ref_keep.float().mean().item() - (1 - p)) < 0.05


def test_uniform_prints_its_attributes():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.uniform(0.0, 2.0, [3, 5], dtype=DataType.Half, rng_seed=9, rng_offset=4))
    text = str(fd)
    assert "uniform(" in text and "shape=[3, 5]" in text and "dtype=half" in text.lower(), text


@pytest.mark.parametrize("kwargs,match", [
    (dict(dtype=DataType.Int), "dtype must be float"),
    (dict(rng_seed=-1), "rng_seed is -1"),
    (dict(rng_seed=1.5), "rng_seed must be an integer scalar"),
    (dict(rng_offset=1 << 53), "rng_offset is"),
    (dict(low=2.0, high=1.0), "must not exceed high"),
    (dict(shape=[4, -1]), "shape axis 1 has extent -1"),
])
def test_uniform_argument_errors(kwargs, match):
    args = dict(low=0.0, high=1.0, shape=[4, 8])
    args.update(kwargs)
    with pytest.raises(meshfuser.ArgumentError, match=match):
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.uniform(args.pop("low"), args.pop("high"), args.pop("shape"), **args))


def test_uniform_symbolic_shape_is_an_error():
    with pytest.raises(meshfuser.ArgumentError, match="shape must be static ints"):
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.uniform(0.0, 1.0, [fd.define_scalar(dtype=DataType.Int), 4]))


def test_uniform_tensor_bound_is_an_error():
    with pytest.raises(meshfuser.ArgumentError, match="low must be a scalar"):
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.uniform(fd.define_tensor([2]), 1.0, [2]))


@pytest.mark.parametrize("inputs,match", [
    ([2.0, 1.0, 0, 0], "low <= high"),
    ([0.0, 1.0, -5, 0], "rng_seed is -5"),
    # An Int scalar given a float is refused where inputs are checked, naming the input.
    ([0.0, 1.0, 0, 2.5], r"input 3 \(S\d+\) is an integer scalar \(int64\) but got a float \(2.5"),
])
def test_uniform_runtime_scalar_errors(inputs, match):
    with FusionDefinition() as fd:
        low, high = fd.define_scalar(dtype=DataType.Double), fd.define_scalar(dtype=DataType.Double)
        seed, offset = fd.define_scalar(dtype=DataType.Int), fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.uniform(low, high, [4], rng_seed=seed, rng_offset=offset))
    with pytest.raises(meshfuser.Error, match=match):
        fd.execute(inputs)


# ---- embedding_fwd --------------------------------------------------------------------------
@pytest.mark.parametrize("index_dtype", [DataType.Int, DataType.Int32])
@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16])
@pytest.mark.parametrize("index_shape", [[7], [3, 5], [2, 3, 4]])
def test_embedding_matches_torch(index_dtype, dtype, index_shape):
    vocab, dim = 50, 16
    idx = torch.randint(0, vocab, index_shape, dtype=torch.int64 if index_dtype == DataType.Int else torch.int32)
    w = torch.randn(vocab, dim).to(_TORCH[dtype])
    with FusionDefinition() as fd:
        ti = fd.define_tensor(index_shape, dtype=index_dtype)
        tw = fd.define_tensor([vocab, dim], dtype=dtype)
        fd.add_output(fd.ops.embedding_fwd(ti, tw))
    (out,) = fd.execute([idx, w])
    assert out.dtype == w.dtype and list(out.shape) == index_shape + [dim]
    assert torch.equal(out, F.embedding(idx, w))


def test_embedding_padding_idx_and_symbolic_shapes():
    idx = torch.tensor([[0, 2, 9], [9, 1, 0]])
    w = torch.randn(10, 4)
    w[9] = 0
    with FusionDefinition() as fd:
        ti = fd.define_tensor([-1, -1], dtype=DataType.Int)
        tw = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.embedding_fwd(ti, tw, padding_idx=-1))
    (out,) = fd.execute([idx, w])
    assert torch.equal(out, F.embedding(idx, w, padding_idx=9))
    assert "padding_idx=[-1]" in str(fd)
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.embedding_fwd(fd.define_tensor([3], dtype=DataType.Int), fd.define_tensor([10, 4]),
                                           padding_idx=-1))
    assert "padding_idx=[9]" in str(fd)  # normalized like torch when the vocabulary is static


def test_embedding_then_pointwise():
    idx = torch.randint(0, 20, (4, 6))
    w = torch.randn(20, 8)
    with FusionDefinition() as fd:
        ti = fd.define_tensor([4, 6], dtype=DataType.Int)
        tw = fd.define_tensor([20, 8])
        fd.add_output(fd.ops.mul(fd.ops.embedding_fwd(ti, tw), 2.0))
    (out,) = fd.execute([idx, w])
    torch.testing.assert_close(out, F.embedding(idx, w) * 2.0)


@pytest.mark.parametrize("build,match", [
    (lambda fd: fd.ops.embedding_fwd(fd.define_tensor([3]), fd.define_tensor([10, 4])), "must be int64 or int32"),
    (lambda fd: fd.ops.embedding_fwd(fd.define_tensor([3], dtype=DataType.Int), fd.define_tensor([10, 4, 2])),
     "must be 2-D"),
    (lambda fd: fd.ops.embedding_fwd(fd.define_tensor([3], dtype=DataType.Int), fd.define_tensor([10, 4]),
                                     padding_idx=10), "padding_idx 10 is out of range"),
    (lambda fd: fd.ops.embedding_fwd(fd.define_tensor([3], dtype=DataType.Int), fd.define_tensor([10, 4]),
                                     max_norm=1.0), "max_norm"),
])
def test_embedding_argument_errors(build, match):
    with pytest.raises(meshfuser.ArgumentError, match=match):
        with FusionDefinition() as fd:
            fd.add_output(build(fd))


def test_embedding_index_out_of_range_is_an_error():
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.embedding_fwd(fd.define_tensor([3], dtype=DataType.Int), fd.define_tensor([10, 4])))
    with pytest.raises(meshfuser.Error, match="embedding_fwd"):
        fd.execute([torch.tensor([1, 10, 2]), torch.randn(10, 4)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: CUDA tensors must draw the CPU's bits")
@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16, DataType.Double])
def test_uniform_on_cuda_equals_cpu_bit_for_bit(dtype):
    shape = [33, 257]
    x = torch.randn(shape).to(_TORCH[dtype])
    with FusionDefinition() as fd:
        tx = fd.define_tensor(shape, dtype=dtype)
        r = fd.ops.uniform(-2.0, 3.0, shape, dtype=dtype, rng_seed=123, rng_offset=4)
        keep = fd.ops.lt(r, 0.5)
        fd.add_output(r)
        fd.add_output(fd.ops.where(keep, tx, 0.0))
    r_cpu, out_cpu = fd.execute([x])
    r_gpu, out_gpu = fd.execute([x.cuda()])
    assert r_gpu.is_cuda and torch.equal(r_gpu.cpu(), r_cpu)
    assert torch.equal(out_gpu.cpu(), out_cpu)
    assert torch.equal(r_cpu, reference_uniform(shape, -2.0, 3.0, dtype, 123, 4))

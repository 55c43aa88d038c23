"""Random numbers and embeddings under sharding.

uniform: a tensor drawn sharded equals, on every rank and bit for bit, the matching shard of the
same program run unsharded (every rank also runs the unsharded program as a reference). Dropout
built on it is therefore sharding-independent too. embedding_fwd: column-parallel weight and
batch-sharded indices stay local; a vocabulary-sharded weight is made whole by one Allgather."""
import pytest
import torch
import torch.nn.functional as F

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType
from meshfuser.testing import communication_kinds

_SEED, _OFFSET = 20261201, 3


def _communications(fd, inputs):
    with meshfuser.Profiler() as prof:
        outputs = fd.execute(inputs)
    names = [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
    return outputs, communication_kinds(names)


def _unsharded_uniform(shape, dtype, low=-1.0, high=1.0):
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.uniform(low, high, shape, dtype=dtype, rng_seed=_SEED, rng_offset=_OFFSET))
    (out,) = fd.execute([])
    return out


def _split(tv, axis, d, pt=ParallelType.mesh_x):
    tv.outer_split(axis, d)
    tv.axis(axis).parallelize(pt)


# Each case: (global shape given the mesh size d, how to shard the output).
def _outer_axis0(tv, d):
    _split(tv, 0, d)


def _outer_axis1(tv, d):
    _split(tv, 1, d)


def _logical_axis0(tv, d):
    tv.axis(0).parallelize(ParallelType.mesh_x)  # the axis is the device axis (extent d)


_CASES_1D = {
    "outer_split_axis0": (lambda d: [2 * d, 6], _outer_axis0),
    "outer_split_axis1": (lambda d: [5, 3 * d], _outer_axis1),
    "logical_split": (lambda d: [d, 4, 6], _logical_axis0),
}


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16, DataType.Double])
@pytest.mark.parametrize("case", sorted(_CASES_1D))
def test_uniform_sharded_equals_unsharded(multidevice_test, case, dtype):
    d = multidevice_test.size
    make_shape, shard = _CASES_1D[case]
    shape = make_shape(d)
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        out = fd.ops.uniform(-1.0, 1.0, shape, dtype=dtype, rng_seed=_SEED, rng_offset=_OFFSET)
        fd.add_output(out)
        out.set_device_mesh(mesh)
        shard(out, d)
    (local,) = fd.execute([])
    full = _unsharded_uniform(shape, dtype)
    expected = meshfuser.shard_tensor(full, out, multidevice_test.rank)
    assert local.shape == expected.shape
    assert torch.equal(local, expected)
    if multidevice_test.rank > 0:  # each rank drew its own part, not rank 0's
        assert not torch.equal(local, meshfuser.shard_tensor(full, out, 0))


@pytest.mark.parametrize("y_axis,x_axis", [(0, 1), (1, 0)])
def test_uniform_on_2d_mesh(multidevice_test, y_axis, x_axis):
    if multidevice_test.size != 4:
        pytest.skip("needs 4 ranks")
    mesh = DeviceMesh(torch.arange(4).view(2, 2))
    shape = [4, 6]
    with FusionDefinition() as fd:
        out = fd.ops.uniform(-1.0, 1.0, shape, rng_seed=_SEED, rng_offset=_OFFSET)
        fd.add_output(out)
        out.set_device_mesh(mesh)
        # Split the later axis first so that the earlier axis's loop position stays put.
        first, second = sorted([(y_axis, ParallelType.mesh_y), (x_axis, ParallelType.mesh_x)], reverse=True)
        _split(out, first[0], 2, first[1])
        _split(out, second[0], 2, second[1])
    (local,) = fd.execute([])
    full = _unsharded_uniform(shape, DataType.Float)
    y, x = multidevice_test.rank // 2, multidevice_test.rank % 2
    expected = full.chunk(2, dim=y_axis)[y].chunk(2, dim=x_axis)[x]
    assert torch.equal(local, expected)


def test_uniform_sharding_propagated_from_a_consumer(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    shape = [3, 4 * d]
    full_x = torch.randn(shape)
    with FusionDefinition() as fd:
        x = fd.define_tensor(shape)
        r = fd.ops.uniform(0.0, 1.0, shape, rng_seed=_SEED, rng_offset=_OFFSET)
        out = fd.ops.add(x, r)
        fd.add_output(out)
        for tv in (x, out):
            tv.set_device_mesh(mesh)
            _split(tv, 1, d)
    local_x = multidevice_test.shard_tensor(full_x, x)
    (local,), comms = _communications(fd, [local_x])
    assert comms == []  # the draw is local: nothing moves
    expected = meshfuser.shard_tensor(full_x + _unsharded_uniform(shape, DataType.Float, 0.0, 1.0), out,
                                      multidevice_test.rank)
    assert torch.equal(local.cpu(), expected)


def test_uniform_sharded_then_gathered(multidevice_test):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    shape = [2 * d, 5]
    with FusionDefinition() as fd:
        r = fd.ops.uniform(-1.0, 1.0, shape, rng_seed=_SEED, rng_offset=_OFFSET)
        out = fd.ops.set(r)
        fd.add_output(out)
        r.set_device_mesh(mesh)
        _split(r, 0, d)
        out.set_device_mesh(mesh)
    (gathered,), comms = _communications(fd, [])
    assert comms == (["Allgather"] if d > 1 else [])
    assert torch.equal(gathered, _unsharded_uniform(shape, DataType.Float))


@pytest.mark.parametrize("dtype", [DataType.Float, DataType.BFloat16])
def test_sharded_dropout_equals_unsharded(multidevice_test, dtype):
    d = multidevice_test.size
    p = 0.25
    shape = [2 * d, 3, 16]
    torch_dtype = {DataType.Float: torch.float32, DataType.BFloat16: torch.bfloat16}[dtype]
    full_x = torch.randn(shape).to(torch_dtype)

    def define(fd):
        x = fd.define_tensor(shape, dtype=dtype)
        r = fd.ops.uniform(0.0, 1.0, shape, dtype=dtype, rng_seed=_SEED, rng_offset=_OFFSET)
        out = fd.ops.where(fd.ops.lt(r, 1.0 - p), fd.ops.cast(fd.ops.mul(x, 1.0 / (1.0 - p)), dtype), 0.0)
        fd.add_output(out)
        return x, out

    with FusionDefinition() as ref:
        define(ref)
    (full,) = ref.execute([full_x])
    with FusionDefinition() as fd:
        x, out = define(fd)
        for tv in (x, out):
            tv.set_device_mesh(DeviceMesh(range(d)))
            _split(tv, 0, d)
    (local,), comms = _communications(fd, [multidevice_test.shard_tensor(full_x, x)])
    assert comms == []
    assert torch.equal(local.cpu(), meshfuser.shard_tensor(full, out, multidevice_test.rank))
    kept = (full != 0).float().mean().item()
    assert abs(kept - (1 - p)) < 0.1


# ---- embedding_fwd ---------------------------------------------------------------------------
def _embedding_program(d, batch, seq, vocab, dim, shard_indices, shard_weight, shard_out):
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        idx = fd.define_tensor([batch, seq], dtype=DataType.Int)
        w = fd.define_tensor([vocab, dim])
        out = fd.ops.embedding_fwd(idx, w)
        fd.add_output(out)
        for tv, axis in ((idx, shard_indices), (w, shard_weight), (out, shard_out)):
            tv.set_device_mesh(mesh)
            if axis is not None:
                _split(tv, axis, d)
    return fd, idx, w, out


@pytest.mark.parametrize("name,vocab_per_rank,indices_axis,weight_axis,out_axis,expected_comms", [
    ("column_parallel_weight", 8, None, 1, 2, []),
    ("batch_sharded_indices", 8, 0, None, 0, []),
    # A small table sharded on the vocabulary: gathering it moves fewer bytes than reducing the output.
    ("vocab_parallel_small_table_gathered", 8, None, 0, None, ["Allgather"]),
    # A large one stays sharded: masked local lookups, then one Allreduce of the output.
    ("vocab_parallel_masked_allreduce", 64, None, 0, None, ["Allreduce"]),
    ("vocab_parallel_masked_reduce_scatter", 64, None, 0, 0, ["ReduceScatter"]),
])
def test_embedding_sharded(multidevice_test, name, vocab_per_rank, indices_axis, weight_axis, out_axis,
                           expected_comms):
    d = multidevice_test.size
    batch, seq, vocab, dim = 2 * d, 5, vocab_per_rank * d, 4 * d
    full_idx = torch.randint(0, vocab, (batch, seq))
    full_w = torch.randn(vocab, dim)
    fd, idx, w, out = _embedding_program(d, batch, seq, vocab, dim, indices_axis, weight_axis, out_axis)
    inputs = [multidevice_test.shard_tensor(full_idx, idx), multidevice_test.shard_tensor(full_w, w)]
    (local,), comms = _communications(fd, inputs)
    assert comms == (expected_comms if d > 1 else [])
    expected = meshfuser.shard_tensor(F.embedding(full_idx, full_w), out, multidevice_test.rank)
    assert torch.equal(local.cpu(), expected)
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == (-1 if out_axis is None else out_axis)


def test_vocab_parallel_embedding_out_of_range_index_is_an_error(multidevice_test):
    d = multidevice_test.size
    fd, idx, w, out = _embedding_program(d, 2, 3, 64 * d, 4, None, 0, None)
    bad = torch.tensor([[0, 1, 64 * d], [2, 3, 4]]).to(multidevice_test.device)
    with pytest.raises(meshfuser.Error, match="indices must lie in"):
        fd.execute([bad, multidevice_test.shard_tensor(torch.randn(64 * d, 4), w)])

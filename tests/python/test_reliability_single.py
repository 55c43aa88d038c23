"""Issue 32, single process: meshes larger than the world, integers past int64, and the bound on
the definitions' caches."""
import gc

import pytest
import torch

import meshfuser
from meshfuser import DataType, DeviceMesh, FusionDefinition, ParallelType


def test_two_device_mesh_in_a_single_process_is_an_error_that_suggests_torchrun():
    mesh = DeviceMesh([0, 1])
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 3])
        fd.add_output(fd.ops.relu(x))
        x.set_device_mesh(mesh)
        x.outer_split(0, 2)
        x.axis(0).parallelize(ParallelType.mesh_x)
    with pytest.raises(meshfuser.Error) as e:
        fd.execute([torch.randn(4, 3)])
    msg = str(e.value)
    assert "mesh [0 1]" in msg or "mesh [0, 1]" in msg or "has 2 devices" in msg, msg
    assert "a world of 1 process" in msg and "torchrun --nproc_per_node=2" in msg, msg


def test_mesh_naming_a_rank_outside_a_world_of_one():
    with FusionDefinition() as fd:
        x = fd.define_tensor([8, 3])
        fd.add_output(fd.ops.relu(x))
        x.set_device_mesh(DeviceMesh([1]))
    with pytest.raises(meshfuser.Error, match=r"names rank 1, outside the world.*torchrun --nproc_per_node=2"):
        fd.execute([torch.randn(8, 3)])


def test_integer_scalar_past_int64_is_a_meshfuser_error():
    with FusionDefinition() as fd:
        x = fd.define_tensor([4])
        s = fd.define_scalar(dtype=DataType.Int)
        fd.add_output(fd.ops.mul(x, s))
    with pytest.raises(meshfuser.Error, match=r"input 1 is the integer 1180591620717411303424, outside the int64"):
        fd.execute([torch.ones(4), 2 ** 70])
    (out,) = fd.execute([torch.ones(4), -(2 ** 63)])
    assert out[0].item() == float(-(2 ** 63))


def test_dropped_definitions_do_not_accumulate():
    meshfuser._C.clear_caches()
    for k in range(400):
        with FusionDefinition() as fd:
            x = fd.define_tensor([k + 1])
            fd.add_output(fd.ops.relu(x))
        fd.execute([torch.randn(k + 1)])
        del fd
    gc.collect()
    assert meshfuser._C.num_cached_definitions() < 300  # 256 unused ones at most, plus those still alive
    # A definition still alive keeps its cache, however many others come and go.
    with FusionDefinition() as kept:
        x = kept.define_tensor([3, 3])
        kept.add_output(fd_neg(kept, x))
    kept.execute([torch.randn(3, 3)])
    for k in range(300):
        with FusionDefinition() as fd:
            x = fd.define_tensor([k + 1, 2])
            fd.add_output(fd.ops.relu(x))
        fd.execute([torch.randn(k + 1, 2)])
    built = kept._handle.executors_built()
    kept.execute([torch.randn(3, 3)])
    assert kept._handle.executors_built() == built  # not recompiled


def fd_neg(fd, x):
    return fd.ops.neg(x)

"""meshfuser inside PyTorch's tools: a torch DeviceMesh as a mesh, execute inside
torch.compile(fullgraph=True), dtensor.compile taking dtypes from its inputs, and
visualize_sharding."""
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import meshfuser
from meshfuser import FusionDefinition, ParallelType


def _column_parallel(mesh, d, name_x="x"):
    with FusionDefinition() as fd:
        x = fd.define_tensor([-1, 16], name=name_x)
        w = fd.define_tensor([4 * d, 16], name="w")
        y = fd.ops.relu(fd.ops.linear(x, w))
        fd.add_output(y)
        x.set_device_mesh(mesh)  # the output's sharding comes from propagation (column parallel)
        w.set_device_mesh(mesh)
        w.outer_split(0, d)
        w.axis(0).parallelize(ParallelType.mesh_x)
    return fd


def test_torch_device_mesh_is_accepted(multidevice_test):
    d = multidevice_test.size
    torch_mesh = init_device_mesh(multidevice_test.device.type, (d,))
    fd = _column_parallel(torch_mesh, d)
    x, w = torch.randn(3, 16), torch.randn(4 * d, 16)
    (out,) = fd.execute([x.to(multidevice_test.device), multidevice_test.shard_tensor(w, 0, meshfuser.DeviceMesh(range(d)))])
    expected = (x @ w.T).relu()
    torch.testing.assert_close(out, multidevice_test.shard_tensor(expected, 1, meshfuser.DeviceMesh(range(d))), rtol=1e-4, atol=1e-4)
    assert fd.get_output_shardings()[0].axis_sharded_on(ParallelType.mesh_x) == 1


def test_execute_inside_torch_compile_fullgraph(multidevice_test):
    d = multidevice_test.size
    mesh = meshfuser.DeviceMesh(range(d))
    fd = _column_parallel(mesh, d)
    x, w = torch.randn(3, 16), torch.randn(4 * d, 16)
    w_local = multidevice_test.shard_tensor(w, 0, mesh)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(a, b):
        (y,) = fd.execute([a * 2, b])
        return y + 1

    out = step(x.to(multidevice_test.device), w_local)
    expected = ((2 * x) @ w.T).relu() + 1
    torch.testing.assert_close(out, multidevice_test.shard_tensor(expected, 1, mesh), rtol=1e-4, atol=1e-4)


def test_dtensor_compile_takes_dtypes_from_inputs(multidevice_test):
    d = multidevice_test.size
    mesh = init_device_mesh("cpu", (d,))

    def define(fd):  # no dtype=: bfloat16 comes from the DTensors
        x = fd.define_tensor([-1, -1])
        w = fd.define_tensor([-1, -1])
        fd.add_output(fd.ops.linear(x, w))

    x, w = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(2 * d, 8, dtype=torch.bfloat16)
    out = meshfuser.dtensor.compile(define)(distribute_tensor(x, mesh, [Replicate()]),
                                            distribute_tensor(w, mesh, [Shard(0)]))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.full_tensor(), x @ w.T, rtol=2e-2, atol=2e-2)


def test_visualize_sharding_of_a_definition_and_a_dtensor(multidevice_test, capsys):
    d = multidevice_test.size
    mesh = meshfuser.DeviceMesh(range(d))
    fd = _column_parallel(mesh, d, name_x="tokens")
    text = meshfuser.visualize_sharding(fd)
    assert "input 0 T0 (tokens) [?, 16] Float on mesh" in text, text
    for r in range(d):
        assert f"  rank {r}: [{4 * r}:{4 * r + 4}, 0:16]" in text, text  # w's rows, block r
    assert capsys.readouterr().out.strip() == text.strip()
    assert f"[?, {4 * d}] Float: no mesh (sharding decided by propagation" in text, text
    x, w = torch.randn(3, 16), torch.randn(4 * d, 16)
    fd.execute([x.to(multidevice_test.device), multidevice_test.shard_tensor(w, 0, mesh)])
    text = meshfuser.visualize_sharding(fd)  # the output's sharding, as propagation chose it
    assert "(sharding chosen by propagation)" in text, text
    for r in range(d):
        assert f"  rank {r}: [:, {4 * r}:{4 * r + 4}]" in text, text
    dt = distribute_tensor(torch.randn(2 * d, 3), init_device_mesh("cpu", (d,)), [Shard(0)])
    text = meshfuser.visualize_sharding(dt)
    for r in range(d):
        assert f"  rank {r}: [{2 * r}:{2 * r + 2}, 0:3]" in text, text

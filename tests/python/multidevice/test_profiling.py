"""meshfuser.Profiler times, and torch.profiler ranges named after the host program's steps."""
import torch

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType


def _linear_reduce_scatter(d, e):
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([-1, d * e])
        w = fd.define_tensor([e, d * e])
        out = fd.ops.linear(inp, w)
        fd.add_output(out)
        for tv in [inp, w, out]:
            tv.set_device_mesh(mesh)
            tv.outer_split(-1, d)
            tv.axis(-2).parallelize(ParallelType.mesh_x)
        out.outer_split(0, d)
        out.axis(0).parallelize(ParallelType.mesh_x)
    return fd, mesh


def test_profiler_times_and_bytes(multidevice_test):
    d, e, rows = multidevice_test.size, 16, 8
    fd, mesh = _linear_reduce_scatter(d, e)
    x, w = torch.randn(rows * d, d * e), torch.randn(e, d * e)
    inputs = [multidevice_test.shard_tensor_1d(x, -1, mesh), multidevice_test.shard_tensor_1d(w, -1, mesh)]
    fd.execute(inputs)
    with meshfuser.Profiler() as prof:
        (out,) = fd.execute(inputs)
    torch.testing.assert_close(out, multidevice_test.shard_tensor_1d(x @ w.T, 0, mesh), rtol=1e-4, atol=1e-4)
    entries = prof.profile.kernel_profiles
    segments = [k for k in entries if k.scheduler != "communication"]
    assert segments and all(k.time_ms > 0 and k.host_time_ms > 0 for k in segments), entries
    comms = [k for k in entries if k.scheduler == "communication"]
    if d == 1:
        assert comms == []
        return
    assert len(comms) == 1 and comms[0].name.startswith("ReduceScatter"), entries
    assert comms[0].time_ms > 0 and comms[0].host_time_ms > 0
    assert comms[0].bytes_sent == rows * d * e * 4 * (d - 1) // d
    table = str(prof.profile)
    assert "ReduceScatter" in table and "total" in table


def test_torch_profiler_ranges_name_steps(multidevice_test):
    d, e, rows = multidevice_test.size, 16, 8
    fd, mesh = _linear_reduce_scatter(d, e)
    x, w = torch.randn(rows * d, d * e), torch.randn(e, d * e)
    inputs = [multidevice_test.shard_tensor_1d(x, -1, mesh), multidevice_test.shard_tensor_1d(w, -1, mesh)]
    fd.execute(inputs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fd.execute(inputs)
    names = [ev.name for ev in prof.events() if ev.name.startswith("meshfuser::")]
    assert names.count("meshfuser::execute") == 1, names
    segment = [n for n in names if n.startswith("meshfuser::segment")]
    assert segment and "linear" in segment[0] and f"[{rows * d}, {e}]" in segment[0], names
    if d > 1:
        comm = [n for n in names if n.startswith("meshfuser::ReduceScatter")]
        sent = rows * d * e * 4 * (d - 1) // d
        assert len(comm) == 1 and f"team={list(range(d))}" in comm[0] and f"sent {sent} B" in comm[0], names

"""MESHFUSER_DUMP output goes through Python's logging, with this rank in every line."""
import logging

import torch

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType


def test_dumps_are_log_records_with_the_rank(multidevice_test, caplog, monkeypatch):
    d = multidevice_test.size
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        x = fd.define_tensor([d * 2, 3])
        y = fd.ops.sum(x, [0])
        fd.add_output(y)
        x.set_device_mesh(mesh)
        y.set_device_mesh(mesh)
        x.outer_split(0, d)
        x.axis(0).parallelize(ParallelType.mesh_x)
    meshfuser._C.clear_caches()
    monkeypatch.setenv("MESHFUSER_DUMP", "host_program,communication")
    meshfuser._C.reload_options()
    try:
        with caplog.at_level(logging.INFO, logger="meshfuser"):
            (out,) = fd.execute([multidevice_test.shard_tensor_1d(torch.ones(d * 2, 3), 0, mesh)])
    finally:
        monkeypatch.delenv("MESHFUSER_DUMP")
        meshfuser._C.reload_options()
    torch.testing.assert_close(out.cpu(), torch.full((3,), 2.0 * d))
    records = [r for r in caplog.records if r.name.startswith("meshfuser.")]
    assert {r.name for r in records} >= {"meshfuser.host_program"}, records
    lines = [line for r in records for line in r.getMessage().splitlines()]
    assert lines and all(line.startswith(f"[meshfuser rank {multidevice_test.rank}] ") for line in lines), lines
    if d > 1:
        assert any("post Allreduce" in r.getMessage() for r in records if r.name == "meshfuser.communication"), lines


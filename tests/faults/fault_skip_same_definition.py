"""Issue 32: the last rank skips the second of three calls of one definition (FAULT_PROGRAM=gather:
an Allgather; stream_loop: an Allgather + linear run as a stream loop). Its third call pairs with
the others' second, which nothing can tell apart; but when it shuts down after two calls, the
others, in their third call, get a meshfuser.Error at once that says it finished after fewer calls,
and it reports that the others are in a call it never joins (with the shared-memory transport)."""
import os

import torch

import meshfuser
from common import done, expect_error, gather_program, init_user_group
from meshfuser import DeviceMesh, FusionDefinition, ParallelType

rank, d = init_user_group()
if os.environ.get("FAULT_PROGRAM") == "stream_loop":
    mesh = DeviceMesh(range(d))
    with FusionDefinition(overlap="chunked") as fd:
        x = fd.define_tensor([4 * d, 8])
        w = fd.define_tensor([6, 8])
        fd.add_output(fd.ops.linear(x, w))
        x.set_device_mesh(mesh)
        x.outer_split(0, d)
        x.axis(0).parallelize(ParallelType.mesh_x)
        w.set_device_mesh(mesh)
    inputs = [torch.randn(4, 8), torch.randn(6, 8)]
else:
    fd = gather_program(d)
    inputs = [torch.randn(4, 3)]
late = rank == d - 1
fd.execute(inputs)
if not late:
    fd.execute(inputs)  # pairs with the late rank's third call
    expect_error(lambda: fd.execute(inputs), f"rank {d - 1}: finished (shut meshfuser down) after 2 call(s)",
                 within_s=30)
    done(rank)
fd.execute(inputs)
assert meshfuser.Communicator.instance().control_transport() in ("shm", "gloo")
done(rank)  # the exit path says farewell

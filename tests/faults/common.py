"""Shared by the fault scripts: each runs as its own job (a fresh process group per fault, so a
broken group cannot spill into the next one); every rank checks what it must see and exits 0."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType


def init_user_group():
    """The user creates the default group, with a long timeout of its own."""
    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=1))
    comm = meshfuser.Communicator.instance()
    return comm.rank(), comm.size()


def gather_program(d, rows=None, op="set"):
    mesh = DeviceMesh(range(d))
    with FusionDefinition() as fd:
        inp = fd.define_tensor([rows or 4 * d, 3])
        out = fd.ops.set(inp) if op == "set" else fd.ops.relu(inp)
        fd.add_output(out)
        inp.set_device_mesh(mesh)
        inp.outer_split(0, d)
        inp.axis(0).parallelize(ParallelType.mesh_x)
        out.set_device_mesh(mesh)
    return fd


def expect_error(fn, *fragments, within_s=None):
    """fn() must raise meshfuser.Error (not any other error) whose message has every fragment."""
    start = time.monotonic()
    try:
        fn()
    except meshfuser.Error as e:
        took = time.monotonic() - start
        msg = str(e)
        missing = [f for f in fragments if f not in msg]
        assert not missing, f"rank {dist.get_rank()}: {missing} not in: {msg}"
        assert within_s is None or took <= within_s, f"the error took {took:.1f} s (limit {within_s} s): {msg}"
        print(f"rank {dist.get_rank()}: meshfuser.Error after {took:.1f} s: {msg[:300]}", flush=True)
        return msg
    raise AssertionError(f"rank {dist.get_rank()}: expected meshfuser.Error")


def user_all_gather_ok(rank, d):
    """The user's own collective on the default group sees the user's data only."""
    gathered = [None] * d
    dist.all_gather_object(gathered, ("user", rank))
    assert gathered == [("user", r) for r in range(d)], gathered


def done(rank):
    print(f"rank {rank}: OK", flush=True)
    sys.exit(0)  # the ordinary exit path, broken groups included (the job's timeout bounds it)

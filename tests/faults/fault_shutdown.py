"""Defect 10: the exit path. The user calls dist.destroy_process_group() at the end; the process
must exit (the runner runs this 20 times under a hard timeout)."""
import os

import torch
import torch.distributed as dist

import meshfuser
from common import gather_program

if os.environ.get("FAULT_USER_INIT") == "1":  # every other run the user creates the default group
    dist.init_process_group("gloo")
comm = meshfuser.Communicator.instance()
rank, d = comm.rank(), comm.size()
fd = gather_program(d)
for _ in range(3):
    (out,) = fd.execute([torch.full((4, 3), float(rank))])
assert out.shape == (4 * d, 3)
dist.destroy_process_group()

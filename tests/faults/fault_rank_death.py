"""Rank death: the last rank dies before (or, with the agreement disabled, during) a call. The
survivors end within the timeout with a meshfuser.Error that says a rank is gone or out of step."""
import os

import torch

import meshfuser
from common import done, expect_error, gather_program

comm = meshfuser.Communicator.instance()
rank, d = comm.rank(), comm.size()
fd = gather_program(d)
x = torch.randn(4, 3)
fd.execute([x])
if rank == d - 1:
    os._exit(3)
expect_error(lambda: fd.execute([x]), "rank", within_s=40)
expect_error(lambda: fd.execute([x]), "unusable", within_s=5)  # and it stays refused, at once
done(rank)

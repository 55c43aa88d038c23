"""Defect 9: with the per-call agreement disabled, a rank that skips a call leaves the others in a
data collective. MESHFUSER_PG_TIMEOUT_S bounds it although the user created the default group (with
a 1 h timeout), the error names the communication, and the user's collective is not matched against
meshfuser's pending one."""
import torch

from common import done, expect_error, gather_program, init_user_group, user_all_gather_ok

rank, d = init_user_group()
fd = gather_program(d)
x = torch.randn(4, 3)
fd.execute([x])
if rank != d - 1:
    expect_error(lambda: fd.execute([x]), "Allgather", "failed on rank", within_s=30)
user_all_gather_ok(rank, d)
done(rank)

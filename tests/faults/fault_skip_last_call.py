"""Defects 5, 7, 9: a rank skips the last execute and goes on to its own collective on the default
group. The others get a meshfuser.Error bounded by MESHFUSER_VALIDATION_TIMEOUT_S (not a raw
RuntimeError, not a match with the user's collective); the user's all_gather_object then sees the
user's data; later calls fail fast (or within the timeout) with a clear message on every rank."""
import torch

from common import done, expect_error, gather_program, init_user_group, user_all_gather_ok

rank, d = init_user_group()
fd = gather_program(d)
x = torch.randn(4, 3)
fd.execute([x])
if rank != d - 1:
    expect_error(lambda: fd.execute([x]), "did not complete with every rank", "out of step", within_s=30)
user_all_gather_ok(rank, d)
expect_error(lambda: fd.execute([x]), within_s=30)
done(rank)

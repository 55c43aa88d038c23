"""Defect 5: a rank skips one execute and runs the next program: every rank is told (the call
fingerprints differ) instead of exchanging data from different calls."""
import torch

from common import done, expect_error, gather_program, init_user_group, user_all_gather_ok

rank, d = init_user_group()
fd = gather_program(d)
g = gather_program(d, op="relu")
x = torch.randn(4, 3)
fd.execute([x])
late = rank == d - 1
if not late:
    expect_error(lambda: fd.execute([x]), f"rank(s) {d - 1} compiled a different program")
else:
    expect_error(lambda: g.execute([x]), f"rank(s) {d - 1} compiled a different program")
user_all_gather_ok(rank, d)
done(rank)

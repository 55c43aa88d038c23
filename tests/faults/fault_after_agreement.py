"""A rank fails after the ranks agreed on a call (MESHFUSER_INJECT_FAULT=<where>:<last rank>), the
way an out-of-memory error would.
  at_end (strict mode): every communication completed; the completion check tells the other ranks.
  after_agreement (default mode): the others wait in the Allgather the failed rank never posts; it
    is bounded by MESHFUSER_PG_TIMEOUT_S, and afterwards every rank is refused or told."""
import os

import torch

from common import done, expect_error, gather_program, init_user_group, user_all_gather_ok

rank, d = init_user_group()
where = os.environ["MESHFUSER_INJECT_FAULT"].split(":")[0]
fd = gather_program(d)
x = torch.randn(4, 3)
os.environ["MESHFUSER_INJECT_FAULT"] = "none"
fd.execute([x])
os.environ["MESHFUSER_INJECT_FAULT"] = f"{where}:{d - 1}"
if rank == d - 1:
    expect_error(lambda: fd.execute([x]), "fault injected", within_s=30)
elif where == "at_end":
    expect_error(lambda: fd.execute([x]), f"the call failed on rank(s) {d - 1} after the ranks agreed", within_s=30)
else:
    expect_error(lambda: fd.execute([x]), "Allgather", "failed on rank", within_s=30)
os.environ["MESHFUSER_INJECT_FAULT"] = "none"
user_all_gather_ok(rank, d)
if where == "at_end":  # nothing was left unmatched: the next call works everywhere
    (out,) = fd.execute([x])
    assert out.shape == (4 * d, 3)
else:  # the others' groups are broken: every rank gets an error, within the timeouts
    expect_error(lambda: fd.execute([x]), within_s=30)
done(rank)

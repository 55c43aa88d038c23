"""Seed 001 as a user writes it: a row-parallel linear whose output is reduce-scattered along the
sequence axis. Runs under torchrun; each rank checks its shard against unsharded PyTorch."""
import torch

import meshfuser
from meshfuser import DeviceMesh, FusionDefinition, ParallelType

comm = meshfuser.Communicator.instance()
d, rank = comm.size(), comm.rank()
use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= d
device = torch.device("cuda", comm.local_rank()) if use_cuda else torch.device("cpu")
mesh = DeviceMesh(range(d))
e = 64


class Model(FusionDefinition):
    def definition(self):
        self.inp = self.define_tensor([-1, -1, d * e])
        self.weight = self.define_tensor([e, d * e])
        self.out = self.ops.linear(self.inp, self.weight, None)
        self.add_output(self.out)

    def multidevice_schedule(self):
        for t in [self.inp, self.weight, self.out]:
            self.sched._set_device_mesh(t, mesh)
            self.sched.split(t, -1, d, False)
            self.sched.parallelize(t, -2, ParallelType.mesh_x)
            self.sched.set_allocation_as_loop(t)
        self.sched.split(self.out, 1, d, False)
        self.sched.parallelize(self.out, 1, ParallelType.mesh_x)


torch.manual_seed(0)
b, s = 2, 128
unsharded_inp, unsharded_weight = torch.randn(b, s, d * e), torch.randn(e, d * e)
inp = mesh.shard_tensor(unsharded_inp, -1, rank).to(device)
weight = mesh.shard_tensor(unsharded_weight, -1, rank).to(device)
fd = Model()
with meshfuser.Profiler() as prof:
    (out,), shardings = fd.execute([inp, weight])
expected = mesh.shard_tensor(torch.nn.functional.linear(unsharded_inp, unsharded_weight), 1, rank)
torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-3)
comms = [k.name for k in prof.profile.kernel_profiles if k.scheduler == "communication"]
if rank == 0:
    print(fd.host_program())
print(f"rank {rank}/{d} on {device}: output shard {tuple(out.shape)} (sharded on axis "
      f"{shardings[0].axis_sharded_on(ParallelType.mesh_x)}) matches unsharded PyTorch; "
      f"communications: {comms}", flush=True)

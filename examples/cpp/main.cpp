// Seed 001 from C++: linear with the contraction axis K sharded over d ranks, the output scattered
// along the sequence axis (one local partial product, then exactly one ReduceScatter).
//
// Run on d ranks under torchrun-style variables, e.g.
//   torchrun --nproc_per_node=2 --standalone --no-python ./seed001
// or without any Python:
//   for r in 0 1; do RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29531 ./seed001 & done; wait
//
// `./seed001 cuda` runs on cuda:LOCAL_RANK with NCCL instead of on CPUs with Gloo.
//
// Every rank computes the unsharded reference from the same seed and checks its own shard.
#include <meshfuser/meshfuser.h>

#include <iostream>
#include <string>

int main(int argc, char** argv) {
  using meshfuser::ParallelType;
  const std::string device_name = argc > 1 ? argv[1] : "cpu";
  if (device_name != "cpu" && device_name != "cuda") {
    std::cerr << "usage: seed001 [cpu|cuda]" << std::endl;
    return 2;
  }
  const bool cuda = device_name == "cuda";
  try {
    meshfuser::Communicator comm =
        meshfuser::Communicator::fromEnvironment(cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
    const at::Device device = cuda ? at::Device(at::kCUDA, comm.localRank()) : at::Device(at::kCPU);
    const int64_t d = comm.size(), rank = comm.rank();
    const int64_t e = 16, batch = 2, seq = 8 * d;
    auto mesh = meshfuser::DeviceMesh::range(d);

    meshfuser::Fusion fusion;
    auto inp = fusion.defineTensor({-1, -1, d * e});  // [batch, seq, K]; K = d * e
    auto weight = fusion.defineTensor({e, d * e});     // [N, K]
    auto out = meshfuser::ops::linear(inp, weight);   // [batch, seq, N, r{K}]
    fusion.addOutput(out);
    for (auto* tv : {&inp, &weight, &out}) {
      tv->setDeviceMesh(mesh).outerSplit(-1, d).parallelize(-2, ParallelType::MeshX).setAllocationAsLoop();
    }
    out.outerSplit(1, d).parallelize(1, ParallelType::MeshX);  // ...and scatter the sequence axis

    at::manual_seed(0);  // the same global tensors on every rank
    at::Tensor full_inp = at::randn({batch, seq, d * e});
    at::Tensor full_weight = at::randn({e, d * e});
    meshfuser::Executor executor(fusion, comm);
    std::vector<at::Tensor> outputs = executor.execute({full_inp.chunk(d, -1)[rank].contiguous().to(device),
                                                        full_weight.chunk(d, -1)[rank].contiguous().to(device)});
    outputs[0] = outputs[0].cpu();

    at::Tensor expected = at::linear(full_inp, full_weight).chunk(d, 1)[rank];
    double max_error = (outputs[0] - expected).abs().max().item<double>();
    bool ok = outputs[0].sizes() == expected.sizes() && at::allclose(outputs[0], expected, 1e-4, 1e-3);
    if (rank == 0) std::cout << executor.hostProgram();
    comm.barrier();
    std::cout << "rank " << rank << " of " << d << " (" << device << "): seed 001 output shard " << outputs[0].sizes()
              << (ok ? " matches" : " DOES NOT match") << " the unsharded reference (max abs error " << max_error
              << ")" << std::endl;
    comm.barrier();
    return ok ? 0 : 1;
  } catch (const meshfuser::Error& e) {
    std::cerr << "meshfuser error: " << e.what() << std::endl;
    return 2;
  }
}

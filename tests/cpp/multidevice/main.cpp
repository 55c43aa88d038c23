// gtest main for multi-rank C++ tests. Runs under `torchrun --no-python` (or alone as rank 0 of 1).
// torch.distributed is initialized from the launcher's environment through an embedded Python
// interpreter, because the CPU build of PyTorch ships no Gloo headers to construct a backend from
// C++; the tests then use the group through c10d from C++ only.
#include <gtest/gtest.h>
#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <string>

#include "multidevice/communicator.h"

namespace py = pybind11;

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  py::scoped_interpreter interpreter;
  int rc = 0;
  {
    py::module_ os = py::module_::import("os");
    py::object environ = os.attr("environ");
    if (!environ.attr("__contains__")("RANK").cast<bool>()) {
      environ["RANK"] = "0";
      environ["WORLD_SIZE"] = "1";
      environ["LOCAL_RANK"] = "0";
      environ["MASTER_ADDR"] = "127.0.0.1";
      py::module_ socket = py::module_::import("socket");
      py::object s = socket.attr("socket")();
      s.attr("bind")(py::make_tuple("127.0.0.1", 0));
      environ["MASTER_PORT"] = py::str(s.attr("getsockname")()[py::int_(1)]);
      s.attr("close")();
    }
    py::module_ torch = py::module_::import("torch");
    py::module_ dist = py::module_::import("torch.distributed");
    bool cuda = torch.attr("cuda").attr("is_available")().cast<bool>() &&
                std::string(std::getenv("MESHFUSER_TEST_DEVICE") ? std::getenv("MESHFUSER_TEST_DEVICE") : "cuda") == "cuda";
    int64_t rank = std::stoll(environ["RANK"].cast<std::string>());
    int64_t size = std::stoll(environ["WORLD_SIZE"].cast<std::string>());
    int64_t local_rank = std::stoll(py::str(environ.attr("get")("LOCAL_RANK", "0")).cast<std::string>());
    if (cuda) torch.attr("cuda").attr("set_device")(local_rank % torch.attr("cuda").attr("device_count")().cast<int64_t>());
    // MESHFUSER_CUDA_BACKEND=gloo: ranks sharing a GPU (scripts/test's shared-GPU runs).
    const char* cuda_backend = std::getenv("MESHFUSER_CUDA_BACKEND");
    std::string backend = std::string("cpu:gloo,cuda:") + (cuda_backend ? cuda_backend : "nccl");
    dist.attr("init_process_group")(py::arg("backend") = cuda ? backend : std::string("gloo"));
    std::string world = dist.attr("group").attr("WORLD").attr("group_name").cast<std::string>();
    mf::Communicator::instance().init(world, world, rank, size, local_rank, size);
    py::object new_group = dist.attr("new_group");
    auto* keep = new py::list();  // groups must outlive the tests
    mf::Communicator::instance().setTeamFactory([new_group, keep](const std::vector<int64_t>& team) {
      py::object g = new_group(py::cast(team));
      keep->append(g);
      return g.is_none() || !py::hasattr(g, "group_name") ? std::string() : g.attr("group_name").cast<std::string>();
    });
    py::gil_scoped_release release;
    rc = RUN_ALL_TESTS();
  }
  py::module_::import("torch.distributed").attr("destroy_process_group")();
  return rc;
}

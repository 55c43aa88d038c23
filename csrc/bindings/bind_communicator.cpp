// Communicator bindings. The team factory calls back into torch.distributed.new_group so that
// sub-groups come from c10d exactly as Python would make them.
#include <torch/csrc/utils/pybind.h>

#include "bindings/bind.h"
#include "multidevice/communicator.h"
#include "runtime/agreement.h"

namespace py = pybind11;

namespace mf {

void bindCommunicator(py::module& m) {
  // c10d::Work is returned as torch.distributed's own Work type (registered by torch; we share its
  // pybind11 headers and therefore its type registry), so .wait() behaves as users know it.
  py::module_::import("torch.distributed");
  auto comm = py::class_<Communicator, std::unique_ptr<Communicator, py::nodelete>>(m, "_Communicator");
  comm.def_static("instance", &Communicator::instance, py::return_value_policy::reference)
      // Without the GIL: the control transport's set-up exchanges go over Gloo.
      .def("init", &Communicator::init, py::arg("world_group"), py::arg("cpu_group"), py::arg("rank"), py::arg("size"),
           py::arg("local_rank"), py::arg("local_size"), py::call_guard<py::gil_scoped_release>())
      .def("control_transport", &Communicator::controlTransport)
      // One control round (tests and benchmarks of the transport): every rank's values, rank-major.
      .def("exchange", [](Communicator& c, const std::vector<int64_t>& v) { return c.exchange(v, "a Python exchange"); },
           py::arg("values"), py::call_guard<py::gil_scoped_release>())
      .def("farewell", [](Communicator& c) { return farewell(c); }, py::call_guard<py::gil_scoped_release>())
      .def("initialized", &Communicator::initialized)
      // Without the GIL: releasing a Gloo group joins its workers, which may need the GIL to free a
      // Python-owned tensor (holding it here hung dist.destroy_process_group() at exit).
      .def("shutdown", &Communicator::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("broken", &Communicator::broken)
      .def("rounds", &Communicator::rounds)
      .def("size", &Communicator::size)
      .def("rank", &Communicator::rank)
      .def("local_size", &Communicator::localSize)
      .def("local_rank", &Communicator::localRank)
      .def("barrier", &Communicator::barrier, py::call_guard<py::gil_scoped_release>())
      .def("set_team_factory",
           [](Communicator& c, py::function f) {
             // Leaked on purpose: the Communicator is a static that outlives the interpreter, and
             // destroying a Python object then would need the GIL.
             auto* fn = new py::function(std::move(f));
             c.setTeamFactory([fn](const std::vector<int64_t>& team) {
               py::gil_scoped_acquire gil;
               return (*fn)(team).cast<std::string>();
             });
           },
           py::arg("factory"))
      .def("create_teams", &Communicator::createTeams, py::arg("teams"), py::call_guard<py::gil_scoped_release>())
      // Posting releases the GIL: a c10d worker thread that drops the last reference to a tensor
      // with a Python object needs the GIL while holding the queue lock that posting takes.
      .def("allgather", &Communicator::allgather, py::arg("team"), py::arg("output"), py::arg("input"),
           py::call_guard<py::gil_scoped_release>())
      .def("reduce_scatter", &Communicator::reduceScatter, py::arg("team"), py::arg("output"), py::arg("input"),
           py::arg("op") = OpType::Sum, py::call_guard<py::gil_scoped_release>())
      .def("allreduce", &Communicator::allreduce, py::arg("team"), py::arg("tensor"), py::arg("op") = OpType::Sum,
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace mf

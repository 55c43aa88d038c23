// IR bindings: plain pybind11 (no torch headers, so this file compiles quickly).
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "ir/fusion.h"
#include "ir/ops.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "multidevice/sharding.h"
#include "passes/pass.h"

namespace py = pybind11;

namespace mf {

void bindIr(py::module& m) {
  py::enum_<DataType>(m, "DataType")
      .value("Float", DataType::Float)
      .value("Half", DataType::Half)
      .value("BFloat16", DataType::BFloat16)
      .value("Double", DataType::Double)
      .value("Int", DataType::Int)
      .value("Int32", DataType::Int32)
      .value("Bool", DataType::Bool);
  py::enum_<ParallelType>(m, "ParallelType")
      .value("mesh_x", ParallelType::DIDx)
      .value("mesh_y", ParallelType::DIDy)
      .value("mesh_z", ParallelType::DIDz)
      .value("stream", ParallelType::Stream)
      .value("serial", ParallelType::Serial)
      .value("block_x", ParallelType::BIDx)
      .value("thread_x", ParallelType::TIDx)
      .value("vectorize", ParallelType::Vectorize)
      .value("unroll", ParallelType::Unroll);

  py::class_<DeviceMesh>(m, "_DeviceMesh")
      .def(py::init<std::vector<int64_t>, std::vector<int64_t>>())
      .def_property_readonly("size", [](const DeviceMesh& d) { return d.size(); })
      .def_property_readonly("shape", [](const DeviceMesh& d) { return py::tuple(py::cast(d.shape())); })
      .def_property_readonly("devices", &DeviceMesh::devices)
      .def("slice", &DeviceMesh::slice, py::arg("rank"), py::arg("parallel_type"))
      .def("all_slices", &DeviceMesh::allSlices)
      .def("linear_index_of", &DeviceMesh::linearIndexOf)
      .def("coordinates_of", &DeviceMesh::coordinatesOf)
      .def("size_of", [](const DeviceMesh& d, ParallelType pt) { return d.size(pt); })
      .def("__eq__", [](const DeviceMesh& a, const DeviceMesh& b) { return a == b; })
      .def("__repr__", [](const DeviceMesh& d) { return "DeviceMesh(" + d.toString() + ")"; });

  py::class_<Val>(m, "Val").def("__repr__", &Val::toString).def_property_readonly("dtype", &Val::dtype);
  py::class_<Scalar, Val>(m, "Scalar");
  py::class_<TensorView, Val>(m, "TensorView")
      .def_property_readonly("ndim", &TensorView::nDims)
      .def_property_readonly("name", &TensorView::name)
      .def_property_readonly("shape",
                             [](const TensorView& tv) {
                               std::vector<int64_t> s;
                               for (IterDomain* id : tv.logicalNoReductions()) s.push_back(id->extent().value);
                               return s;
                             })
      .def("split", &TensorView::split, py::arg("axis"), py::arg("factor"), py::arg("inner_split") = true)
      .def("outer_split", [](TensorView& tv, int64_t axis, int64_t f) { tv.split(axis, f, false); })
      .def("inner_split", [](TensorView& tv, int64_t axis, int64_t f) { tv.split(axis, f, true); })
      // merge(axis): axis with the one after it, as in nvFuser's Python API.
      .def("merge", [](TensorView& tv, int64_t axis) { tv.merge(axis, axis + 1); }, py::arg("axis"))
      .def("reorder",
           [](TensorView& tv, const std::map<int64_t, int64_t>& m) {
             std::vector<std::pair<int64_t, int64_t>> v(m.begin(), m.end());
             tv.reorder(v);
           })
      .def("parallelize", &TensorView::parallelize)
      .def("set_device_mesh", &TensorView::setDeviceMesh)
      .def("has_device_mesh", &TensorView::hasMesh)
      .def_property_readonly("device_mesh", &TensorView::mesh)
      .def("set_allocation_as_loop", &TensorView::setAllocationAsLoop)
      .def("rfactor", &TensorView::rfactor, py::return_value_policy::reference)
      .def("axis_info",
           [](const TensorView& tv, int64_t i) {
             IterDomain* id = tv.axis(i);
             return py::make_tuple(id->extent().isConst() ? py::cast(id->extent().value) : py::cast(id->extent().symbol),
                                   id->parallelType(), id->isReduction(), id->toString());
           })
      .def("sharded_axis", [](const TensorView& tv, ParallelType pt) { return shardedAxis(&tv, pt); })
      .def("__str__", [](const TensorView& tv) { return printTensor(&tv); });

  py::class_<Fusion, std::shared_ptr<Fusion>>(m, "Fusion")
      .def(py::init<>())
      .def("define_tensor", &defineTensor, py::arg("shape"), py::arg("dtype"), py::arg("contiguity") = std::vector<bool>{},
           py::arg("stride_order") = std::vector<int64_t>{}, py::return_value_policy::reference_internal)
      .def("define_scalar", &defineScalar, py::return_value_policy::reference_internal)
      .def("add_output", &Fusion::addOutput)
      .def("num_inputs", [](const Fusion& f) { return f.inputs().size(); })
      .def("num_outputs", [](const Fusion& f) { return f.outputs().size(); })
      .def("input_is_tensor", [](const Fusion& f, size_t i) { return f.inputs().at(i)->isTensor(); })
      .def("input", [](const Fusion& f, size_t i) { return f.inputs().at(i); }, py::return_value_policy::reference_internal)
      .def("output", [](const Fusion& f, size_t i) { return f.outputs().at(i); }, py::return_value_policy::reference_internal)
      .def("version", &Fusion::version)
      .def("fingerprint", [](const Fusion& f) { return fingerprint(f); })
      .def("verify", [](const Fusion& f) { verifyFusion(f); })
      .def("__str__", [](const Fusion& f) { return printFusion(f); })
      .def("print_after_passes", [](const Fusion& f) {
        auto copy = f.clone();
        std::vector<std::pair<std::string, std::string>> trace;
        runPipeline(*copy, &trace);
        return trace;
      });

  // Ops (free functions; the Python `fd.ops` namespace forwards here).
  auto rv = py::return_value_policy::reference;
  py::module ops = m.def_submodule("ops");
  ops.def("unary", &unaryOp, rv);
  ops.def("cast", &castOp, rv);
  ops.def("binary", &binaryOp, rv);
  ops.def("where", &whereOp, rv);
  ops.def("reduction", &reductionOp, py::arg("op"), py::arg("x"), py::arg("dims"), py::arg("dtype") = py::none(), rv);
  ops.def("broadcast_in_dim", &broadcastInDim, rv);
  ops.def("squeeze", &squeeze, rv);
  ops.def("permute", &permute, rv);
  ops.def("reshape", &reshape, rv);
  ops.def("matmul", &matmul, rv);
  ops.def("linear", &linear, py::arg("x"), py::arg("w"), py::arg("bias") = nullptr, rv);
  ops.def("uniform", &uniform, py::arg("low"), py::arg("high"), py::arg("shape"), py::arg("dtype"), py::arg("seed"),
          py::arg("offset"), rv);
  ops.def("embedding_fwd", &embeddingFwd, py::arg("indices"), py::arg("weight"), py::arg("padding_idx") = py::none(), rv);
  py::enum_<OpType> op_type(m, "OpType");
  for (const OpInfo& info : allOps()) op_type.value(info.name, info.op);
  // The registry as Python sees it: fd.ops builds its plain unary and binary functions from it.
  ops.def("table", [] {
    static const char* kKinds[] = {"unary",  "binary", "ternary",   "layout",
                                   "source", "gather", "reduction", "contraction"};
    py::list rows;
    for (const OpInfo& info : allOps()) {
      rows.append(py::make_tuple(info.name, kKinds[static_cast<int>(info.kind)], info.attrs != kNoAttrs));
    }
    return rows;
  });
}

}  // namespace mf

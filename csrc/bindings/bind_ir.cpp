// IR bindings: plain pybind11 (no torch headers, so this file compiles quickly).
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "ir/fusion.h"
#include "ir/build_op.h"
#include "ir/ops.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "multidevice/sharding.h"
#include "passes/pass.h"
#include "support/error.h"

namespace py = pybind11;

namespace mf {
namespace {

// An attention option as the user may give it: None, a Python number or bool, or a constant scalar
// (fd.define_scalar(value)). A fusion-input scalar has no value yet: refused, by name.
std::optional<double> constantOption(const py::object& v, const char* op, const char* name) {
  if (v.is_none()) return std::nullopt;
  if (py::isinstance<Scalar>(v)) {
    const Scalar* s = v.cast<const Scalar*>();
    MF_USER_ARG_CHECK(s->value().has_value(), op, ": ", name, " must be known when the fusion is defined (a number ",
                      "or fd.define_scalar(value)); got the fusion input ", s->toString());
    return s->value();
  }
  MF_USER_ARG_CHECK(py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v), op, ": ", name,
                    " must be None, a number or a constant scalar; got ", py::type::handle_of(v).attr("__name__").cast<std::string>());
  return v.cast<double>();
}

AttentionOptions attentionOptions(const char* op, const py::object& dropout_p, const py::object& is_causal,
                                  const py::object& scale) {
  AttentionOptions o;
  o.dropout_p = constantOption(dropout_p, op, "dropout_p");
  if (auto c = constantOption(is_causal, op, "is_causal")) o.is_causal = *c != 0.0;
  o.scale = constantOption(scale, op, "scale");
  return o;
}

// A Val handed to Python keeps its Fusion's Python object alive: the Fusion owns the Val, and a
// result outliving its FusionDefinition was a dangling pointer (a segfault on first use).
py::object owned(Val* v) {
  py::object result = py::cast(v, py::return_value_policy::reference);
  if (v != nullptr) py::detail::keep_alive_impl(result, py::cast(v->fusion(), py::return_value_policy::reference));
  return result;
}

py::tuple tupleOf(const std::vector<TensorView*>& tvs) {
  py::tuple t(tvs.size());
  for (size_t i = 0; i < tvs.size(); ++i) t[i] = owned(tvs[i]);
  return t;
}

// An op binding whose result keeps its Fusion alive (see owned()).
template <typename R, typename... A>
auto keepsFusion(R (*fn)(A...)) {
  return [fn](A... args) -> py::object {
    if constexpr (std::is_same_v<R, std::vector<Scalar*>>) {
      py::list out;
      for (Scalar* v : fn(std::forward<A>(args)...)) out.append(owned(v));
      return std::move(out);
    } else {
      return owned(fn(std::forward<A>(args)...));
    }
  };
}

}  // namespace

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
      .value("serial", ParallelType::Serial);
  // The GPU kernel's own parallel types (threads, blocks, vectorize, unroll) are chosen by the
  // code generator, never by a schedule: not offered to users.

  py::class_<DeviceMesh>(m, "_DeviceMesh")
      .def(py::init<std::vector<int64_t>, std::vector<int64_t>>())
      .def_property_readonly("size", [](const DeviceMesh& d) { return d.size(); })
      .def_property_readonly("shape", [](const DeviceMesh& d) { return py::tuple(py::cast(d.shape())); })
      .def_property_readonly("devices", &DeviceMesh::devices)
      .def("slice", &DeviceMesh::slice, py::arg("rank"), py::arg("parallel_type"))
      .def("all_slices", &DeviceMesh::allSlices, py::arg("parallel_type"))
      .def("linear_index_of", &DeviceMesh::linearIndexOf, py::arg("rank"), "Position of `rank` in the mesh, or -1")
      .def("coordinates_of", &DeviceMesh::coordinatesOf, py::arg("rank"))
      .def("size_of", [](const DeviceMesh& d, ParallelType pt) { return d.size(pt); }, py::arg("parallel_type"),
           "How many devices the mesh has along `parallel_type`")
      .def("__eq__", [](const DeviceMesh& a, const DeviceMesh& b) { return a == b; })
      .def("__repr__", [](const DeviceMesh& d) { return "DeviceMesh(" + d.toString() + ")"; });

  py::class_<Val>(m, "Val").def("__repr__", &Val::toString).def_property_readonly("dtype", &Val::dtype);
  py::class_<Scalar, Val>(m, "Scalar")
      .def_property_readonly("is_extent", &Scalar::isExtent)
      .def_property_readonly("extent", &Scalar::extent);
  py::class_<TensorView, Val>(m, "TensorView")
      .def_property_readonly("ndim", &TensorView::nDims)
      .def_property_readonly(
          "name", [](const TensorView& tv) { return tv.userName().empty() ? tv.toString() : tv.userName(); },
          "The name given to define_tensor(name=...), or the IR's own (\"T3\")")
      .def("_set_name", &TensorView::setUserName, py::arg("name"))
      .def_property_readonly("shape",
                             [](const TensorView& tv) {
                               std::vector<int64_t> s;
                               for (IterDomain* id : tv.logicalNoReductions()) s.push_back(id->extent().value);
                               return s;
                             })
      .def("split", &TensorView::split, py::arg("axis"), py::arg("factor"), py::arg("inner_split") = true)
      .def("outer_split", [](TensorView& tv, int64_t axis, int64_t f) { tv.split(axis, f, false); }, py::arg("axis"),
           py::arg("factor"), "Splits loop axis `axis` into [factor, extent / factor] (sharding: factor = mesh size)")
      .def("inner_split", [](TensorView& tv, int64_t axis, int64_t f) { tv.split(axis, f, true); }, py::arg("axis"),
           py::arg("factor"), "Splits loop axis `axis` into [extent / factor, factor]")
      // merge(axis): axis with the one after it, as in nvFuser's Python API.
      .def("merge", [](TensorView& tv, int64_t axis) { tv.merge(axis, axis + 1); }, py::arg("axis"))
      .def("reorder",
           [](TensorView& tv, const std::map<int64_t, int64_t>& m) {
             std::vector<std::pair<int64_t, int64_t>> v(m.begin(), m.end());
             tv.reorder(v);
           },
           py::arg("old_to_new"), "Moves loop axes: {old position: new position}")
      .def("parallelize", &TensorView::parallelize, py::arg("axis"), py::arg("parallel_type"),
           "Runs loop axis `axis` on `parallel_type` (mesh_x/y/z: one device each; stream: chunks in a loop)")
      .def("swizzle1d", &TensorView::swizzle1d, py::arg("axis"), py::arg("parallel_type"))
      .def("set_device_mesh", &TensorView::setDeviceMesh)
      .def("has_device_mesh", &TensorView::hasMesh)
      .def_property_readonly("device_mesh", &TensorView::mesh)
      .def("set_allocation_as_loop", &TensorView::setAllocationAsLoop,
           "Lays the tensor out in memory in its loop order (device axes have extent 1 locally)")
      .def("_set_allocation_domain", &TensorView::setAllocationDomain, py::arg("axes"), py::arg("contiguity"))
      .def(
          "rfactor", [](TensorView& tv, const std::vector<int64_t>& axes) { return owned(tv.rfactor(axes)); },
          py::arg("axes"), "Splits this reduction in two: a partial over `axes` (returned), then the rest")
      .def("axis_info",
           [](const TensorView& tv, int64_t i) {
             IterDomain* id = tv.axis(i);
             return py::make_tuple(id->extent().isConst() ? py::cast(id->extent().value) : py::cast(id->extent().symbol),
                                   id->parallelType(), id->isReduction(), id->toString());
           },
           py::arg("axis"))
      .def("sharded_axis", [](const TensorView& tv, ParallelType pt) { return shardedAxis(&tv, pt); },
           py::arg("parallel_type"), "The logical axis sharded on `parallel_type`, or -1")
      .def("splits_are_blocked", [](const TensorView& tv) { return allSplitsBlocked(&tv); })
      .def("shard_positions",
           [](const TensorView& tv, int64_t axis, int64_t global_extent, int64_t rank) -> py::object {
             auto shards = shardsPerAxis(&tv);
             MF_USER_CHECK(axis >= 0 && axis < static_cast<int64_t>(shards.size()), tv.toString(), ": axis ", axis,
                           " out of range for ", shards.size(), " axes");
             if (!tv.hasMesh() || shards[static_cast<size_t>(axis)] == 1) return py::none();
             // A rank outside the mesh gets the first device's shard (what it would be sent).
             std::vector<int64_t> coords = tv.mesh().has(rank) ? tv.mesh().coordinatesOf(rank)
                                                               : std::vector<int64_t>(tv.mesh().rank(), 0);
             return py::cast(axisPositions(&tv, axis, global_extent, [&](ParallelType pt) {
               return coords.at(static_cast<size_t>(tv.mesh().axisOf(pt)));
             }));
           },
           py::arg("axis"), py::arg("global_extent"), py::arg("rank"),
           "The global positions along `axis` that `rank` holds, or None when the axis is not sharded")
      .def("__str__", [](const TensorView& tv) { return printTensor(&tv); });

  py::class_<Fusion, std::shared_ptr<Fusion>>(m, "Fusion")
      .def(py::init<>())
      .def("define_tensor", &defineTensor, py::arg("shape"), py::arg("dtype"), py::arg("contiguity") = std::vector<bool>{},
           py::arg("stride_order") = std::vector<int64_t>{}, py::return_value_policy::reference_internal)
      .def("define_scalar", &defineScalar, py::arg("dtype"), py::arg("value"), py::return_value_policy::reference_internal)
      .def("add_output", &Fusion::addOutput, py::arg("tv"))
      .def("num_inputs", [](const Fusion& f) { return f.inputs().size(); })
      .def("num_outputs", [](const Fusion& f) { return f.outputs().size(); })
      .def("input_is_tensor", [](const Fusion& f, size_t i) { return f.inputs().at(i)->isTensor(); }, py::arg("index"))
      .def("input", [](const Fusion& f, size_t i) { return f.inputs().at(i); }, py::arg("index"),
           py::return_value_policy::reference_internal)
      .def("output", [](const Fusion& f, size_t i) { return f.outputs().at(i); }, py::arg("index"),
           py::return_value_policy::reference_internal)
      .def("set_overlap", &Fusion::setOverlap, py::arg("mode"))
      .def("overlap", &Fusion::overlap)
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
  py::module ops = m.def_submodule("ops");
  ops.def("unary", keepsFusion(&unaryOp));
  ops.def("cast", keepsFusion(&castOp));
  ops.def("binary", keepsFusion(&binaryOp));
  ops.def("extent_arithmetic", keepsFusion(&extentArithmetic));
  ops.def("scalar_op", keepsFusion(&scalarOp), py::arg("op"), py::arg("operands"));
  ops.def("where", keepsFusion(&whereOp));
  ops.def("reduction", keepsFusion(&reductionOp), py::arg("op"), py::arg("x"), py::arg("dims"),
          py::arg("dtype") = py::none());
  ops.def("broadcast_in_dim", keepsFusion(&broadcastInDim));
  ops.def("broadcast_in_dim_vals", keepsFusion(&broadcastInDimExtents));
  ops.def("squeeze", keepsFusion(&squeeze));
  ops.def("permute", keepsFusion(&permute));
  ops.def("reshape", keepsFusion(&reshape));
  ops.def("reshape_vals", keepsFusion(&reshapeExtents));
  ops.def("size", keepsFusion(&size));
  ops.def("shape", keepsFusion(&shape));
  ops.def("slice", keepsFusion(&slice), py::arg("x"), py::arg("starts"), py::arg("ends"),
          py::arg("strides") = std::vector<int64_t>{}, py::arg("normalize") = true);
  ops.def("pad", keepsFusion(&pad), py::arg("x"), py::arg("pad_widths"), py::arg("value") = nullptr);
  ops.def("cat", keepsFusion(&cat));
  ops.def("stride_order", keepsFusion(&strideOrder));
  ops.def(
      "var_mean",
      [](TensorView* x, const std::vector<int64_t>& dims, double correction, bool keepdim) {
        auto [var, mean] = varMean(x, dims, correction, keepdim);
        return py::make_tuple(owned(var), owned(mean));
      },
      py::arg("x"), py::arg("dims"), py::arg("correction") = 1.0, py::arg("keepdim") = false);
  ops.def("matmul", keepsFusion(&matmul));
  ops.def("linear", keepsFusion(&linear), py::arg("x"), py::arg("w"), py::arg("bias") = nullptr);
  ops.def(
      "sdpfa_fwd",
      [](TensorView* q, TensorView* k, TensorView* v, py::object dropout_p, py::object is_causal, py::object scale) {
        return tupleOf(sdpfaFwd(q, k, v, attentionOptions("sdpfa_fwd", dropout_p, is_causal, scale)));
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dropout_p") = py::none(), py::arg("is_causal") = py::none(),
      py::arg("scale") = py::none());
  ops.def(
      "sdpfa_bwd",
      [](TensorView* grad_attn, TensorView* q, TensorView* k, TensorView* v, TensorView* attn, TensorView* logsumexp,
         py::object dropout_p, py::object is_causal, TensorView* seed, TensorView* offset, py::object scale) {
        return tupleOf(sdpfaBwd(grad_attn, q, k, v, attn, logsumexp, seed, offset,
                                attentionOptions("sdpfa_bwd", dropout_p, is_causal, scale)));
      },
      py::arg("grad_attn"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("attn"), py::arg("logsumexp"),
      py::arg("dropout_p"), py::arg("is_causal"), py::arg("seed"), py::arg("offset"), py::arg("scale") = py::none());
  ops.def("uniform", keepsFusion(&uniform), py::arg("low"), py::arg("high"), py::arg("shape"), py::arg("dtype"),
          py::arg("seed"), py::arg("offset"));
  ops.def("embedding_fwd", keepsFusion(&embeddingFwd), py::arg("indices"), py::arg("weight"),
          py::arg("padding_idx") = py::none());
  // Mixture of experts (Python's fd.ops adds the docstrings and nvFuser's spellings).
  ops.def("grouped_mm", keepsFusion(&groupedMm), py::arg("mat1"), py::arg("mat2"), py::arg("offsets") = nullptr);
  auto pairOf = [](std::pair<TensorView*, TensorView*> p) { return tupleOf({p.first, p.second}); };
  ops.def(
      "topk",
      [=](TensorView* x, int64_t k, int64_t dim, bool largest, bool sorted) {
        return pairOf(topk(x, k, dim, largest, sorted));
      },
      py::arg("x"), py::arg("k"), py::arg("dim") = -1, py::arg("largest") = true, py::arg("sorted") = true);
  ops.def(
      "sort",
      [=](TensorView* x, int64_t dim, bool descending, bool stable) {
        return pairOf(sort(x, dim, descending, stable));
      },
      py::arg("x"), py::arg("dim") = -1, py::arg("descending") = false, py::arg("stable") = false);
  ops.def("argsort", keepsFusion(&argsort), py::arg("x"), py::arg("dim") = -1, py::arg("descending") = false,
          py::arg("stable") = false);
  ops.def("index_select", keepsFusion(&indexSelect), py::arg("x"), py::arg("dim"), py::arg("index"));
  ops.def("gather", keepsFusion(&gather), py::arg("x"), py::arg("dim"), py::arg("index"),
          py::arg("exact_extents") = false);
  ops.def("scatter", keepsFusion(&scatter), py::arg("x"), py::arg("dim"), py::arg("index"), py::arg("src"));
  ops.def("scatter_reduce", keepsFusion(&scatterReduce), py::arg("x"), py::arg("dim"), py::arg("index"),
          py::arg("src"), py::arg("reduce"), py::arg("include_self") = true);
  ops.def("index_add", keepsFusion(&indexAdd), py::arg("x"), py::arg("dim"), py::arg("index"), py::arg("src"));
  ops.def("cumsum", keepsFusion(&cumsum), py::arg("x"), py::arg("dim"), py::arg("dtype") = py::none());
  ops.def("bincount", keepsFusion(&bincount), py::arg("x"), py::arg("minlength"));
  // Any registry op by name (fd.ops' functions for ops the registry defines alone): attributes
  // from Python values (bool, int, float, None, DataType, list of ints) by their declared names.
  ops.def(
      "build",
      [](const std::string& name, const std::vector<Val*>& operands, const py::dict& attrs) -> py::object {
        Attributes given;
        for (const auto& [key, value] : attrs) {
          const std::string k = py::str(key);
          if (py::isinstance<py::bool_>(value)) given.set(k, value.cast<bool>());
          else if (py::isinstance<py::int_>(value)) given.set(k, value.cast<int64_t>());
          else if (py::isinstance<py::float_>(value)) given.set(k, value.cast<double>());
          else if (value.is_none()) given.set(k, OptionalFloat());
          else if (py::isinstance<DataType>(value)) given.set(k, value.cast<DataType>());
          else if (py::isinstance<py::str>(value)) given.set(k, value.cast<std::string>());
          else given.set(k, value.cast<std::vector<int64_t>>());
        }
        std::vector<Val*> outs = buildOp(name, operands, given);
        if (outs.size() == 1) return owned(outs[0]);
        py::tuple t(outs.size());
        for (size_t i = 0; i < outs.size(); ++i) t[i] = owned(outs[i]);
        return t;
      },
      py::arg("name"), py::arg("operands"), py::arg("attrs"));
  // Expert parallelism (Python's fd.ops takes a mesh or a team size).
  ops.def(
      "all_to_all_dispatch",
      [=](TensorView* tokens, TensorView* counts, ParallelType mesh_axis, int64_t team_size) {
        return pairOf(allToAllDispatch(tokens, counts, mesh_axis, team_size));
      },
      py::arg("tokens"), py::arg("counts"), py::arg("mesh_axis"), py::arg("team_size"));
  ops.def("all_to_all_combine", keepsFusion(&allToAllCombine), py::arg("expert_out"), py::arg("counts"),
          py::arg("recv_counts"));
  py::enum_<OpType> op_type(m, "OpType");
  for (const OpInfo& info : allOps()) op_type.value(info.name, info.op);
  // The registry as Python sees it: fd.ops builds its plain unary and binary functions from it.
  ops.def("table", [] {
    static const char* kKinds[] = {"unary",  "binary", "ternary",   "layout",      "source",
                                   "gather", "reduction", "contraction", "attention", "routing", "exchange"};
    py::list rows;
    for (const OpInfo& info : allOps()) {
      rows.append(py::make_tuple(info.name, kKinds[static_cast<int>(info.kind)], !info.attributes.empty()));
    }
    return rows;
  });
}

}  // namespace mf

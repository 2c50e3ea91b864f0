// Collective ops over torch.distributed process groups: torch.ops.shardwise.*, the
// communication the rewritten stage modules call. Each op resolves its group by name
// (c10d::resolve_process_group: every torch.distributed group is registered, so a Python
// caller passes `group.group_name`) and runs the group's own backend: Gloo on CPU tensors,
// NCCL on CUDA tensors, one code path, no transport of our own.
//
// Ops (world = the group's size, rank = this process' rank in it), each with its autograd
// formula and a Meta kernel (FakeTensor and torch.export trace through them):
//
//   all_reduce(x, reduce_op, group)     forward: sum | avg | max | min over the ranks;
//                                       backward: identity (Megatron's `g`: reducing a
//                                       row-parallel product's partial sums, whose gradient
//                                       arrives replicated). Only sum and avg have one.
//   copy_to_group(x, group)             forward: identity; backward: sum all-reduce of the
//                                       gradient (Megatron's `f`: the replicated input of a
//                                       column-parallel product)
//   all_gather(x, dim, group)           forward: the ranks' x concatenated along dim in rank
//                                       order; backward: reduce-scatter (sum) along dim
//   reduce_scatter(x, dim, group)       forward: the sum over ranks, rank r keeping chunk r
//                                       of dim; backward: all-gather along dim
//   all_to_all(x, split_dim, concat_dim, group)
//                                       x cut in world chunks along split_dim, chunk j sent
//                                       to rank j, the chunks received concatenated along
//                                       concat_dim in rank order; backward: the reverse
//                                       exchange (concat_dim -> split_dim)
//
// Gloo with a tensor off the CPU (a CUDA tensor in a Gloo group: several ranks sharing one GPU,
// which NCCL refuses): the op runs on a host copy and its result is moved back to the
// tensor's device. Gloo has CUDA forms of some collectives and none of others (reduce-scatter,
// send / recv), and the forms it has copy through host memory themselves; one host path
// for every op keeps them alike (`on_host`).
//
// A complex tensor crosses as its real view (as_real, below), on every backend.
//
// Every op waits for its Work and returns a new tensor. Bad arguments raise ValueError
// naming the op, the group, this rank and the problem (an unknown group, a dim out of
// range, a size that does not split over the group, an unknown reduce_op).
//
// Why not torch's _c10d_functional ops: their autograd variants cover all-gather /
// reduce-scatter / all-to-all only, their group argument changed between releases (see
// TORCH-NOTES), and the tensor-parallel pairs (f, g) are not there; these ops are the
// contract the rewrite emits, so they live here.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <string>
#include <vector>

namespace shardwise::torchbridge {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

struct Group {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  int rank = 0;
  int world = 1;
  std::string name;
};

Group resolve(const char* op, const std::string& name) {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = c10d::resolve_process_group(name);
  } catch (const std::exception& e) {
    TORCH_CHECK_VALUE(false, "shardwise.", op, ": no process group named '", name,
                      "' (pass group.group_name of an initialised torch.distributed group): ", e.what());
  }
  TORCH_CHECK_VALUE(pg, "shardwise.", op, ": no process group named '", name, "'");
  return Group{pg, pg->getRank(), pg->getSize(), name};
}

int64_t check_dim(const char* op, const Group& g, const Tensor& x, int64_t dim) {
  const int64_t rank = x.dim();
  TORCH_CHECK_VALUE(rank > 0, "shardwise.", op, " on group '", g.name, "' (rank ", g.rank,
                    "): needs a tensor with at least one dim, got a scalar");
  TORCH_CHECK_VALUE(dim >= -rank && dim < rank, "shardwise.", op, " on group '", g.name, "' (rank ", g.rank,
                    "): dim ", dim, " out of range for a tensor of ", rank, " dims");
  return dim < 0 ? dim + rank : dim;
}

void check_splits(const char* op, const Group& g, const Tensor& x, int64_t dim) {
  TORCH_CHECK_VALUE(x.size(dim) % g.world == 0, "shardwise.", op, " on group '", g.name, "' (rank ", g.rank,
                    "): dim ", dim, " of size ", x.size(dim), " does not split over the group's ", g.world,
                    " ranks (shape ", x.sizes(), ")");
}

c10d::ReduceOp reduce_op(const char* op, const Group& g, const std::string& name) {
  if (name == "sum") return c10d::ReduceOp::SUM;
  if (name == "avg") return c10d::ReduceOp::AVG;
  if (name == "max") return c10d::ReduceOp::MAX;
  if (name == "min") return c10d::ReduceOp::MIN;
  TORCH_CHECK_VALUE(false, "shardwise.", op, " on group '", g.name, "' (rank ", g.rank, "): reduce_op '", name,
                    "' (known: sum, avg, max, min)");
}

void wait(const char* op, const Group& g, const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "shardwise.", op, " on group '", g.name, "' (rank ", g.rank, " of ", g.world,
                ") failed: ", e.what());
  }
}

// True when `g` runs `x`'s collectives with Gloo and `x` is not on the CPU: the op then works
// on a host copy (see the top of this file).
bool on_host(const Group& g, const Tensor& x) {
  if (x.is_cpu() || x.is_meta()) return false;
  try {
    return g.pg->getBackend(x.device().type())->getBackendName() == "gloo";
  } catch (const std::exception&) {
    return false;  // no backend for this device: the collective itself says so
  }
}

// Bytes and calls of every collective this process ran, per kind, in the cost model's units
// (csrc/cost/collective_cost.h: all-reduce the buffer, all-gather the gathered output,
// reduce-scatter the input, all-to-all each rank's buffer): what benchmarks hold against a
// plan's predicted collectives. Read and reset by the ops shardwise::traffic and
// shardwise::reset_traffic (python/shardwise/runtime/traffic.py).
enum TrafficKind : std::size_t { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kTrafficKinds };
std::array<std::atomic<int64_t>, 2 * kTrafficKinds> traffic_counts{};

void count(TrafficKind kind, const Tensor& buffer) {
  traffic_counts[2 * kind].fetch_add(static_cast<int64_t>(buffer.nbytes()));
  traffic_counts[2 * kind + 1].fetch_add(1);
}

std::vector<int64_t> traffic() {
  std::vector<int64_t> out;
  for (const auto& c : traffic_counts) out.push_back(c.load());
  return out;
}

void reset_traffic() {
  for (auto& c : traffic_counts) c.store(0);
}

// The deprecated names are the ones every supported torch has (2.11 through 2.13 at least;
// 2.13 adds *_single and keeps these as aliases).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

// A complex tensor travels as its real view (a trailing dim of 2: real, imaginary), as
// torch.distributed's own collectives send it: Gloo has no complex type ("Invalid scalar
// type"), and a sum or a concatenation of complex numbers is that of their parts. Dims are
// normalised against the complex tensor first, so the extra dim is never the one cut.
Tensor as_real(const Tensor& x) { return at::view_as_real(x.resolve_conj()); }
Tensor as_complex(const Tensor& real) { return at::view_as_complex(real.contiguous()); }

Tensor all_reduce_kernel(const Tensor& x, const std::string& op_name, const std::string& group) {
  const Group g = resolve("all_reduce", group);
  if (on_host(g, x)) return all_reduce_kernel(x.cpu(), op_name, group).to(x.device());
  c10d::AllreduceOptions options;
  options.reduceOp = reduce_op("all_reduce", g, op_name);
  if (x.is_complex()) {
    TORCH_CHECK_VALUE(options.reduceOp == c10d::ReduceOp::SUM || options.reduceOp == c10d::ReduceOp::AVG,
                      "shardwise.all_reduce on group '", g.name, "' (rank ", g.rank, "): reduce_op '", op_name,
                      "' of a complex tensor (complex numbers have no order: sum or avg only)");
    return as_complex(all_reduce_kernel(as_real(x), op_name, group));
  }
  // Gloo has no AVG: sum, then divide (NCCL has both; one path for all backends).
  const bool average = options.reduceOp == c10d::ReduceOp::AVG;
  if (average) options.reduceOp = c10d::ReduceOp::SUM;
  std::vector<Tensor> buffers{x.contiguous().clone()};
  count(kAllReduce, buffers[0]);
  wait("all_reduce", g, g.pg->allreduce(buffers, options));
  return average ? buffers[0].div_(g.world) : buffers[0];
}

Tensor all_gather_kernel(const Tensor& x, int64_t dim, const std::string& group) {
  const Group g = resolve("all_gather", group);
  if (on_host(g, x)) return all_gather_kernel(x.cpu(), dim, group).to(x.device());
  dim = check_dim("all_gather", g, x, dim);
  if (x.is_complex()) return as_complex(all_gather_kernel(as_real(x), dim, group));
  // The ranks' x gathered flat as rows of [world, *x.shape]; row r moved to just before dim and
  // merged with it is concatenation along dim. Only that merge copies (none along dim 0): moving
  // dim first on the way in would copy the input too.
  // (The process group wants the output as x's shape with dim 0 times world: the same bytes.)
  Tensor input = x.contiguous();
  std::vector<int64_t> flat = input.sizes().vec();
  flat[0] *= g.world;
  Tensor output = at::empty(flat, input.options());
  count(kAllGather, output);
  wait("all_gather", g, g.pg->_allgather_base(output, input));
  if (dim == 0) return output;
  return output.unflatten(0, {g.world, input.size(0)}).movedim(0, dim).flatten(dim, dim + 1);
}

Tensor reduce_scatter_kernel(const Tensor& x, int64_t dim, const std::string& group) {
  const Group g = resolve("reduce_scatter", group);
  if (on_host(g, x)) return reduce_scatter_kernel(x.cpu(), dim, group).to(x.device());
  dim = check_dim("reduce_scatter", g, x, dim);
  check_splits("reduce_scatter", g, x, dim);
  if (x.is_complex()) return as_complex(reduce_scatter_kernel(as_real(x), dim, group));
  // Rank r's chunk along dim made row r of [world, *chunk]: the one copy, on the way in. The
  // reduced row comes back in x's own layout, so nothing is moved on the way out.
  // (The process group wants the rows flat along dim 0, [world * chunk0, ...]: the same bytes.)
  Tensor rows = x.unflatten(dim, {g.world, x.size(dim) / g.world}).movedim(dim, 0).contiguous();
  Tensor input = rows.flatten(0, 1);
  Tensor output = at::empty(rows.sizes().slice(1), input.options());
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  count(kReduceScatter, input);
  wait("reduce_scatter", g, g.pg->_reduce_scatter_base(output, input, options));
  return output;
}

Tensor all_to_all_kernel(const Tensor& x, int64_t split_dim, int64_t concat_dim, const std::string& group) {
  const Group g = resolve("all_to_all", group);
  if (on_host(g, x)) return all_to_all_kernel(x.cpu(), split_dim, concat_dim, group).to(x.device());
  split_dim = check_dim("all_to_all", g, x, split_dim);
  concat_dim = check_dim("all_to_all", g, x, concat_dim);
  check_splits("all_to_all", g, x, split_dim);
  if (x.is_complex()) return as_complex(all_to_all_kernel(as_real(x), split_dim, concat_dim, group));
  // [world, chunk...]: row j goes to rank j; row j of the output came from rank j.
  Tensor input = at::stack(x.chunk(g.world, split_dim), 0).contiguous();
  Tensor output = at::empty_like(input);
  std::vector<int64_t> even;  // empty split sizes: equal rows
  count(kAllToAll, input);
  wait("all_to_all", g, g.pg->alltoall_base(output, input, even, even));
  return at::cat(output.unbind(0), concat_dim);
}

#pragma GCC diagnostic pop

// ---- Meta kernels: shapes only. They resolve the group for its size: tracing under a fake
// process group registers it like any other.

Tensor all_reduce_meta(const Tensor& x, const std::string&, const std::string&) { return at::empty_like(x); }

Tensor all_gather_meta(const Tensor& x, int64_t dim, const std::string& group) {
  const Group g = resolve("all_gather", group);
  dim = check_dim("all_gather", g, x, dim);
  std::vector<int64_t> shape = x.sizes().vec();
  shape[static_cast<std::size_t>(dim)] *= g.world;
  return at::empty(shape, x.options());
}

Tensor reduce_scatter_meta(const Tensor& x, int64_t dim, const std::string& group) {
  const Group g = resolve("reduce_scatter", group);
  dim = check_dim("reduce_scatter", g, x, dim);
  check_splits("reduce_scatter", g, x, dim);
  std::vector<int64_t> shape = x.sizes().vec();
  shape[static_cast<std::size_t>(dim)] /= g.world;
  return at::empty(shape, x.options());
}

Tensor all_to_all_meta(const Tensor& x, int64_t split_dim, int64_t concat_dim, const std::string& group) {
  const Group g = resolve("all_to_all", group);
  split_dim = check_dim("all_to_all", g, x, split_dim);
  concat_dim = check_dim("all_to_all", g, x, concat_dim);
  check_splits("all_to_all", g, x, split_dim);
  std::vector<int64_t> shape = x.sizes().vec();
  shape[static_cast<std::size_t>(split_dim)] /= g.world;
  shape[static_cast<std::size_t>(concat_dim)] *= g.world;
  return at::empty(shape, x.options());
}

Tensor copy_to_group_kernel(const Tensor& x, const std::string& group) {
  resolve("copy_to_group", group);  // the group must exist even though forward sends nothing
  return x.clone();
}

// ---- Autograd ----------------------------------------------------------------------------
// Each forward redispatches below Autograd (so the backend or Meta kernel runs), each
// backward calls the public op (so double backward and tracing see ops, not kernels).

Tensor call_all_reduce(const Tensor& x, const std::string& op, const std::string& group) {
  static auto handle = c10::Dispatcher::singleton().findSchemaOrThrow("shardwise::all_reduce", "").typed<Tensor(
      const Tensor&, const std::string&, const std::string&)>();
  return handle.call(x, op, group);
}
Tensor call_all_gather(const Tensor& x, int64_t dim, const std::string& group) {
  static auto handle = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("shardwise::all_gather", "")
                           .typed<Tensor(const Tensor&, int64_t, const std::string&)>();
  return handle.call(x, dim, group);
}
Tensor call_reduce_scatter(const Tensor& x, int64_t dim, const std::string& group) {
  static auto handle = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("shardwise::reduce_scatter", "")
                           .typed<Tensor(const Tensor&, int64_t, const std::string&)>();
  return handle.call(x, dim, group);
}
Tensor call_all_to_all(const Tensor& x, int64_t split_dim, int64_t concat_dim, const std::string& group) {
  static auto handle = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("shardwise::all_to_all", "")
                           .typed<Tensor(const Tensor&, int64_t, int64_t, const std::string&)>();
  return handle.call(x, split_dim, concat_dim, group);
}
Tensor call_copy_to_group(const Tensor& x, const std::string& group) {
  static auto handle = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("shardwise::copy_to_group", "")
                           .typed<Tensor(const Tensor&, const std::string&)>();
  return handle.call(x, group);
}

class AllReduceFn : public torch::autograd::Function<AllReduceFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const std::string& op, const std::string& group) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["op"] = op;
    return call_all_reduce(x, op, group);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const std::string op = ctx->saved_data["op"].toStringRef();
    TORCH_CHECK(op == "sum" || op == "avg", "shardwise.all_reduce: no gradient for reduce_op '", op,
                "' (only sum and avg are differentiable)");
    // Every rank's output is the reduction; each rank's input contributed once (avg: 1/world
    // of it, but the gradient of a replicated loss is replicated too, so the identity is
    // what keeps a tensor-parallel step equal to the single-device one in both cases).
    return {grads[0], Tensor(), Tensor()};
  }
};

class CopyToGroupFn : public torch::autograd::Function<CopyToGroupFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const std::string& group) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["group"] = group;
    return call_copy_to_group(x, group);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {call_all_reduce(grads[0], "sum", ctx->saved_data["group"].toStringRef()), Tensor()};
  }
};

using DimCollective = Tensor (*)(const Tensor&, int64_t, const std::string&);

// A collective along one dim whose gradient is another along the same dim and group:
// all_gather's is reduce_scatter, and reduce_scatter's all_gather. `Self` is the concrete
// class, so each autograd node keeps its own name.
template <typename Self, DimCollective Forward, DimCollective Backward>
class DimCollectiveFn : public torch::autograd::Function<Self> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, int64_t dim, const std::string& group) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["group"] = group;
    return Forward(x, dim, group);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {Backward(grads[0], ctx->saved_data["dim"].toInt(), ctx->saved_data["group"].toStringRef()), Tensor(),
            Tensor()};
  }
};

class AllGatherFn : public DimCollectiveFn<AllGatherFn, call_all_gather, call_reduce_scatter> {};
class ReduceScatterFn : public DimCollectiveFn<ReduceScatterFn, call_reduce_scatter, call_all_gather> {};

class AllToAllFn : public torch::autograd::Function<AllToAllFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, int64_t split_dim, int64_t concat_dim,
                        const std::string& group) {
    at::AutoDispatchBelowADInplaceOrView guard;
    ctx->saved_data["split_dim"] = split_dim;
    ctx->saved_data["concat_dim"] = concat_dim;
    ctx->saved_data["group"] = group;
    return call_all_to_all(x, split_dim, concat_dim, group);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    return {call_all_to_all(grads[0], ctx->saved_data["concat_dim"].toInt(), ctx->saved_data["split_dim"].toInt(),
                            ctx->saved_data["group"].toStringRef()),
            Tensor(), Tensor(), Tensor()};
  }
};

Tensor all_reduce_autograd(const Tensor& x, const std::string& op, const std::string& group) {
  return AllReduceFn::apply(x, op, group);
}
Tensor copy_to_group_autograd(const Tensor& x, const std::string& group) { return CopyToGroupFn::apply(x, group); }
Tensor all_gather_autograd(const Tensor& x, int64_t dim, const std::string& group) {
  return AllGatherFn::apply(x, dim, group);
}
Tensor reduce_scatter_autograd(const Tensor& x, int64_t dim, const std::string& group) {
  return ReduceScatterFn::apply(x, dim, group);
}
Tensor all_to_all_autograd(const Tensor& x, int64_t split_dim, int64_t concat_dim, const std::string& group) {
  return AllToAllFn::apply(x, split_dim, concat_dim, group);
}

// One dispatch key's implementations of the ops TORCH_LIBRARY declares, registered by
// impl_collectives under their names: every key implements all five.
struct CollectiveKernels {
  Tensor (*all_reduce)(const Tensor&, const std::string&, const std::string&);
  Tensor (*copy_to_group)(const Tensor&, const std::string&);
  DimCollective all_gather;
  DimCollective reduce_scatter;
  Tensor (*all_to_all)(const Tensor&, int64_t, int64_t, const std::string&);
};

void impl_collectives(torch::Library& m, const CollectiveKernels& k) {
  m.impl("all_reduce", k.all_reduce);
  m.impl("copy_to_group", k.copy_to_group);
  m.impl("all_gather", k.all_gather);
  m.impl("reduce_scatter", k.reduce_scatter);
  m.impl("all_to_all", k.all_to_all);
}

}  // namespace

TORCH_LIBRARY(shardwise, m) {
  m.def("all_reduce(Tensor x, str reduce_op, str group) -> Tensor");
  m.def("copy_to_group(Tensor x, str group) -> Tensor");
  m.def("all_gather(Tensor x, int dim, str group) -> Tensor");
  m.def("reduce_scatter(Tensor x, int dim, str group) -> Tensor");
  m.def("all_to_all(Tensor x, int split_dim, int concat_dim, str group) -> Tensor");
  // [bytes, calls] per kind: all_reduce, all_gather, reduce_scatter, all_to_all.
  m.def("traffic() -> int[]", &traffic);
  m.def("reset_traffic() -> ()", &reset_traffic);
}

// CPU and CUDA tensors alike: the group's backend does the work.
TORCH_LIBRARY_IMPL(shardwise, CompositeExplicitAutograd, m) {
  impl_collectives(m, {.all_reduce = all_reduce_kernel, .copy_to_group = copy_to_group_kernel,
                       .all_gather = all_gather_kernel, .reduce_scatter = reduce_scatter_kernel,
                       .all_to_all = all_to_all_kernel});
}

TORCH_LIBRARY_IMPL(shardwise, Meta, m) {
  impl_collectives(m, {.all_reduce = all_reduce_meta,
                       .copy_to_group = [](const Tensor& x, const std::string&) { return at::empty_like(x); },
                       .all_gather = all_gather_meta, .reduce_scatter = reduce_scatter_meta,
                       .all_to_all = all_to_all_meta});
}

TORCH_LIBRARY_IMPL(shardwise, Autograd, m) {
  impl_collectives(m, {.all_reduce = all_reduce_autograd, .copy_to_group = copy_to_group_autograd,
                       .all_gather = all_gather_autograd, .reduce_scatter = reduce_scatter_autograd,
                       .all_to_all = all_to_all_autograd});
}

}  // namespace shardwise::torchbridge

#include "recorder/dispatched_collective.h"

#include <ATen/core/ivalue_inl.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "formats/collective_op.h"

namespace moerr::recorder {
namespace {

// Where a c10d op keeps what the recorder needs: argument indices, -1 for
// none. Read from the schemas of torch 2.11 (`torch._C.
// _jit_get_schemas_for_operator("c10d::allreduce_")`, ...).
struct Layout {
  const char* op;
  const char* kind;  // the trace's name for it (formats/collective_op.h)
  int sent, written;  // a Tensor, Tensor[] or Tensor[][]
  int group;          // the ProcessGroup
  int root;           // root_rank: a group rank
  int send_splits, recv_splits;  // all_to_all: int[], empty for equal rows
  bool in_place;      // `written` is `sent`: the result replaces what was sent
};

constexpr Layout kLayouts[] = {
    {"c10d::allreduce_", "all_reduce", 0, 0, 1, -1, -1, -1, true},
    {"c10d::allreduce_coalesced_", "all_reduce", 0, 0, 1, -1, -1, -1, true},
    {"c10d::broadcast_", "broadcast", 0, 0, 1, 2, -1, -1, true},
    {"c10d::reduce_", "reduce", 0, 0, 1, 3, -1, -1, true},
    {"c10d::alltoall_base_", "all_to_all", 1, 0, 2, -1, 4, 3, false},
    {"c10d::allgather_", "all_gather", 1, 0, 2, -1, -1, -1, false},
    {"c10d::_allgather_base_", "all_gather", 1, 0, 2, -1, -1, -1, false},
    {"c10d::allgather_into_tensor_coalesced_", "all_gather", 1, 0, 2, -1, -1, -1, false},
    {"c10d::reduce_scatter_", "reduce_scatter", 1, 0, 2, -1, -1, -1, false},
    {"c10d::_reduce_scatter_base_", "reduce_scatter", 1, 0, 2, -1, -1, -1, false},
    {"c10d::reduce_scatter_tensor_coalesced_", "reduce_scatter", 1, 0, 2, -1, -1, -1, false},
    {"c10d::barrier", "barrier", -1, -1, 1, -1, -1, -1, false},
};

// c10d ops that write nothing the step reads: not recorded, harmless.
constexpr const char* kWriteNothing[] = {"c10d::send", "c10d::monitored_barrier_"};

const Layout* LayoutOf(const char* op_name) {
  for (const Layout& l : kLayouts) {
    if (std::strcmp(l.op, op_name) == 0) return &l;
  }
  return nullptr;
}

int64_t Rows(const at::Tensor& t) { return t.dim() > 0 ? t.size(0) : 0; }

// The tensors of a Tensor, Tensor[] or Tensor[][] argument, in order.
void AppendTensors(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    out.push_back(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) out.push_back(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) AppendTensors(e, out);
  }
}

// Rows per group rank: the given splits, or equal ones when none are given.
std::vector<int64_t> Split(const c10::IValue& splits, const at::Tensor& t, int64_t size) {
  std::vector<int64_t> rows = splits.isIntList() ? splits.toIntVector() : std::vector<int64_t>();
  if (rows.empty()) rows.assign(size, Rows(t) / size);
  return rows;
}

absl::StatusOr<DispatchedCollective> Read(const Layout* l, const char* op_name, c10::ArrayRef<c10::IValue> args) {
  const auto arg = [&](int i) -> const c10::IValue& {
    static const c10::IValue none;
    return i >= 0 && static_cast<size_t>(i) < args.size() ? args[i] : none;
  };
  if (!arg(l->group).isCustomClass()) {
    return absl::InvalidArgumentError(absl::StrCat(op_name, ": argument ", l->group, " is no ProcessGroup"));
  }
  const auto pg = arg(l->group).toCustomClass<c10d::ProcessGroup>();
  DispatchedCollective d;
  d.in_place = l->in_place;
  CollectiveCall& call = d.call;
  call.kind = l->kind;
  call.group = pg->getGroupName();
  call.group_rank = pg->getRank();
  call.group_size = pg->getSize();
  if (arg(l->root).isInt()) call.root = arg(l->root).toInt();
  AppendTensors(arg(l->sent), d.inputs);
  AppendTensors(arg(l->written), d.outputs);
  if (l->send_splits >= 0) {
    if (d.inputs.size() != 1 || d.outputs.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(op_name, ": one input and one output expected"));
    }
    call.send_rows = Split(arg(l->send_splits), d.inputs[0], call.group_size);
    call.recv_rows = Split(arg(l->recv_splits), d.outputs[0], call.group_size);
    if (static_cast<int64_t>(call.send_rows.size()) != call.group_size ||
        static_cast<int64_t>(call.recv_rows.size()) != call.group_size ||
        !formats::SplitsRows(call.send_rows, Rows(d.inputs[0])) ||
        !formats::SplitsRows(call.recv_rows, Rows(d.outputs[0]))) {
      return absl::InvalidArgumentError(absl::StrCat(op_name, ": the splits do not cover dim 0"));
    }
  }
  if (call.group_rank < 0 || call.group_rank >= call.group_size || call.root >= call.group_size) {
    return absl::InvalidArgumentError(absl::StrCat(op_name, ": group rank or root outside the group"));
  }
  for (const std::vector<at::Tensor>* ts : {&d.inputs, &d.outputs}) {
    for (const at::Tensor& t : *ts) {
      if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(op_name, ": an undefined tensor"));
    }
  }
  return d;
}

}  // namespace

bool IsDispatchedCollective(const char* op_name) { return std::strncmp(op_name, "c10d::", 6) == 0; }

absl::StatusOr<DispatchedCollective> ReadDispatchedCollective(const char* op_name,
                                                              c10::ArrayRef<c10::IValue> args) {
  const Layout* l = LayoutOf(op_name);
  if (l == nullptr) {
    for (const char* harmless : kWriteNothing) {
      if (std::strcmp(harmless, op_name) == 0) return absl::NotFoundError(absl::StrCat(op_name, " writes nothing"));
    }
    return absl::UnimplementedError(absl::StrCat(
        op_name, " is not recorded, and what it writes would leave the record wrong; use all_reduce, "
                 "all_to_all_single, all_gather, broadcast, reduce, or send and recv through torch.distributed"));
  }
  try {  // the ProcessGroup's methods may refuse (a group without a name)
    return Read(l, op_name, args);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(op_name, ": ", e.what_without_backtrace()));
  }
}

c10::intrusive_ptr<c10::ivalue::Future> FutureOfWork(c10::ArrayRef<c10::IValue> outputs) {
  if (outputs.empty() || !outputs.back().isCustomClass()) return {};
  try {
    return outputs.back().toCustomClass<c10d::Work>()->getFuture();
  } catch (const c10::Error&) {  // "Work::getFuture not implemented" (Gloo's send and recv)
    return {};
  }
}

}  // namespace moerr::recorder

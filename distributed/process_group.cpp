#include "distributed/process_group.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <array>
#include <chrono>
#include <cstdlib>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "support/check.h"
#include "support/status.h"

namespace moerr::distributed {
namespace {

using Millis = std::chrono::milliseconds;

const char* GroupName(moe::CommGroup g) {
  switch (g) {
    case moe::CommGroup::kWorld: return "world";
    case moe::CommGroup::kExpertParallel: return "expert-parallel";
    case moe::CommGroup::kExpertReplicas: return "expert-replica";
  }
  return "?";
}

class GlooParallel : public moe::Parallel {
 public:
  GlooParallel(moe::ParallelLayout layout, double timeout_s) : layout_(layout), timeout_s_(timeout_s) {}

  const moe::ParallelLayout& layout() const override { return layout_; }

  void AllReduceSum(at::Tensor& t, moe::CommGroup group) override {
    MOERR_CHECK(t.is_contiguous()) << "all_reduce of a contiguous tensor";
    // A bf16 sum is made in fp32 and rounded once at the end (Gloo would
    // round after every rank's addend), so N ranks match one process's
    // fp32-accumulated reduction up to order.
    const bool bf16 = t.scalar_type() == at::kBFloat16;
    std::vector<at::Tensor> tensors{bf16 ? t.to(at::kFloat).view({-1}) : t.view({-1})};
    Run(Call("all_reduce"), group, tensors, tensors, true,
        [&](c10d::Backend& pg) { return pg.allreduce(tensors); });
    if (bf16) t.copy_(tensors[0].view_as(t));
  }

  at::Tensor AllToAll(const at::Tensor& input, const std::vector<int64_t>& send_rows,
                      const std::vector<int64_t>& recv_rows) override;

  void Broadcast(at::Tensor& t, moe::CommGroup group, int64_t root) override {
    std::vector<at::Tensor> tensors{t};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    recorder::CollectiveCall call = Call("broadcast");
    call.root = root;
    Run(std::move(call), group, tensors, tensors, true,
        [&](c10d::Backend& pg) { return pg.broadcast(tensors, options); });
  }

  // The all_to_all itself, without autograd: rows of `input` by send_rows,
  // received by recv_rows.
  at::Tensor RawAllToAll(const at::Tensor& input, const std::vector<int64_t>& send_rows,
                         const std::vector<int64_t>& recv_rows) {
    at::Tensor in = input.contiguous();
    std::vector<int64_t> shape = in.sizes().vec();
    shape[0] = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
    at::Tensor out = at::empty(shape, in.options());
    std::vector<int64_t> send = send_rows, recv = recv_rows;
    recorder::CollectiveCall call = Call("all_to_all");
    call.send_rows = send_rows;
    call.recv_rows = recv_rows;
    Run(std::move(call), moe::CommGroup::kExpertParallel, {in}, {out}, false,
        [&](c10d::Backend& pg) { return pg.alltoall_base(out, in, recv, send); });
    return out;
  }

  void set_group(moe::CommGroup g, c10::intrusive_ptr<c10d::ProcessGroupGloo> pg) { groups_[Index(g)] = std::move(pg); }

 private:
  static size_t Index(moe::CommGroup g) { return static_cast<size_t>(g); }

  static recorder::CollectiveCall Call(const char* kind) {
    recorder::CollectiveCall call;
    call.kind = kind;
    return call;
  }

  // Starts a collective on `group` and waits for it, between the observers'
  // calls (`inputs` what this rank sends, `outputs` what it receives;
  // `in_place`: the same tensors). Gloo applies the group's timeout; a
  // failure becomes a c10::Error that says which collective of which group
  // it was.
  template <typename Start>
  void Run(recorder::CollectiveCall call, moe::CommGroup group, const std::vector<at::Tensor>& inputs,
           const std::vector<at::Tensor>& outputs, bool in_place, Start&& start) {
    c10d::ProcessGroupGloo& pg = *groups_[Index(group)];
    call.group = GroupName(group);
    call.seq = seq_[Index(group)]++;
    call.group_rank = pg.getRank();
    call.group_size = pg.getSize();
    for (recorder::CollectiveObserver* o : observers()) o->OnCollectiveStart(call, inputs, in_place);
    std::string failure;
    bool failed = false;
    try {
      // Nothing Gloo does on this thread is an op of the step.
      at::DisableRecordFunctionGuard untraced;
      c10::intrusive_ptr<c10d::Work> work = start(pg);
      work->wait();
    } catch (const c10::Error& e) {
      failed = true, failure = e.what_without_backtrace();
    } catch (const std::exception& e) {
      failed = true, failure = e.what();
    }
    if (failed) {
      for (recorder::CollectiveObserver* o : observers()) o->OnCollectiveFailed(call, failure);
      TORCH_CHECK(false, "rank ", layout_.rank, ": ", call.kind, " #", call.seq, " in the ", call.group,
                  " group failed (collective timeout ", timeout_s_, " s): ", failure);
    }
    for (recorder::CollectiveObserver* o : observers()) o->OnCollectiveEnd(call, outputs);
  }

  moe::ParallelLayout layout_;
  double timeout_s_;
  std::array<c10::intrusive_ptr<c10d::ProcessGroupGloo>, 3> groups_;
  std::array<int64_t, 3> seq_{0, 0, 0};  // collectives issued per group
};

// all_to_all as an autograd function: the backward sends each received
// row's gradient back to its sender (the same exchange, reversed).
struct AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, int64_t self,
                            std::vector<int64_t> send_rows, std::vector<int64_t> recv_rows) {
    ctx->saved_data["self"] = self;
    ctx->saved_data["send"] = send_rows;
    ctx->saved_data["recv"] = recv_rows;
    return reinterpret_cast<GlooParallel*>(self)->RawAllToAll(input, send_rows, recv_rows);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* self = reinterpret_cast<GlooParallel*>(ctx->saved_data["self"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    return {self->RawAllToAll(grads[0], recv, send), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor GlooParallel::AllToAll(const at::Tensor& input, const std::vector<int64_t>& send_rows,
                                  const std::vector<int64_t>& recv_rows) {
  MOERR_CHECK(static_cast<int64_t>(send_rows.size()) == layout_.ep_size &&
              static_cast<int64_t>(recv_rows.size()) == layout_.ep_size)
      << "one split per EP rank";
  return AllToAllFunction::apply(input, reinterpret_cast<int64_t>(this), send_rows, recv_rows);
}

absl::Status ParseEnvInt(const char* name, int64_t& out, bool required) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    return required ? absl::InvalidArgumentError(absl::StrFormat("RANK is set but %s is not", name)) : absl::OkStatus();
  }
  if (!absl::SimpleAtoi(v, &out) || out < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s=\"%s\" is not a non-negative integer", name, v));
  }
  return absl::OkStatus();
}

std::shared_ptr<::gloo::transport::Device> GlooDevice(const RankEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  const bool local = env.master_addr.empty() || env.master_addr == "127.0.0.1" || env.master_addr == "localhost";
  return local ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
               : c10d::ProcessGroupGloo::createDefaultDevice();
}

class TcpStoreServer : public StoreServer {
 public:
  explicit TcpStoreServer(c10::intrusive_ptr<c10d::TCPStore> store) : store_(std::move(store)) {}
  int64_t port() const override { return store_->getPort(); }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
};

}  // namespace

absl::StatusOr<std::optional<RankEnv>> RankFromEnvironment() {
  if (std::getenv("RANK") == nullptr) return std::optional<RankEnv>();
  RankEnv env;
  absl::Status s = ParseEnvInt("RANK", env.rank, true);
  if (s.ok()) s = ParseEnvInt("WORLD_SIZE", env.world_size, true);
  if (s.ok()) s = ParseEnvInt("LOCAL_RANK", env.local_rank, false);
  if (!s.ok()) return s;
  if (env.world_size < 1 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RANK=%d is not below WORLD_SIZE=%d", env.rank, env.world_size));
  }
  if (const char* path = std::getenv("MOERR_STORE")) env.file_store = path;
  if (env.file_store.empty()) {
    const char* addr = std::getenv("MASTER_ADDR");
    if (addr == nullptr) return absl::InvalidArgumentError("RANK is set but neither MASTER_ADDR nor MOERR_STORE is");
    env.master_addr = addr;
    MOERR_RETURN_IF_ERROR(ParseEnvInt("MASTER_PORT", env.master_port, true));
    if (env.master_port < 1 || env.master_port > 65535) {
      return absl::InvalidArgumentError(absl::StrFormat("MASTER_PORT=%d is not a port (1 to 65535)", env.master_port));
    }
    const char* server = std::getenv("MOERR_STORE_SERVER");
    env.launcher_hosts_store = server != nullptr && std::string(server) == "launcher";
  }
  return std::optional<RankEnv>(env);
}

absl::StatusOr<std::unique_ptr<moe::Parallel>> JoinWorld(const RankEnv& env, const WorldOptions& options) {
  moe::ParallelLayout layout{env.rank, env.world_size, options.ep_size};
  if (options.ep_size < 1 || env.world_size % options.ep_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--ep %d must divide the number of ranks (%d)", options.ep_size, env.world_size));
  }
  if (!(options.collective_timeout_s > 0)) return absl::InvalidArgumentError("--collective-timeout must be > 0");
  const Millis timeout(static_cast<int64_t>(options.collective_timeout_s * 1000));
  try {
    c10::intrusive_ptr<c10d::Store> store;
    if (!env.file_store.empty()) {
      store = c10::make_intrusive<c10d::FileStore>(env.file_store, static_cast<int>(env.world_size));
    } else {
      c10d::TCPStoreOptions tcp;
      tcp.port = static_cast<uint16_t>(env.master_port);
      tcp.isServer = env.rank == 0 && !env.launcher_hosts_store;
      tcp.numWorkers = static_cast<size_t>(env.world_size);
      tcp.waitWorkers = false;
      tcp.timeout = timeout;
      store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, tcp);
    }
    store->setTimeout(timeout);
    auto parallel = std::make_unique<GlooParallel>(layout, options.collective_timeout_s);
    const std::shared_ptr<::gloo::transport::Device> device = GlooDevice(env);
    // Each group on its own key prefix; every member creates it, in the same
    // order on every rank (world, EP group, replicas), so none waits in a cycle.
    auto make = [&](moe::CommGroup g, const std::string& prefix, int64_t rank, int64_t size) {
      auto gloo = c10d::ProcessGroupGloo::Options::create(timeout);
      gloo->devices.push_back(device);
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
      parallel->set_group(g, c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, static_cast<int>(rank),
                                                                          static_cast<int>(size), gloo));
    };
    make(moe::CommGroup::kWorld, "world", env.rank, env.world_size);
    make(moe::CommGroup::kExpertParallel, absl::StrFormat("ep%d", layout.ep_group()), layout.ep_rank(),
         layout.ep_size);
    make(moe::CommGroup::kExpertReplicas, absl::StrFormat("replicas%d", layout.ep_rank()), layout.ep_group(),
         layout.replicas());
    return std::unique_ptr<moe::Parallel>(std::move(parallel));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrFormat("rank %d of %d: joining the world failed: %s", env.rank,
                                                  env.world_size, e.what()));
  }
}

absl::StatusOr<std::unique_ptr<StoreServer>> HostTcpStore(int64_t world_size, double timeout_s) {
  try {
    c10d::TCPStoreOptions tcp;
    tcp.port = 0;  // a free port, chosen by the system
    tcp.isServer = true;
    tcp.numWorkers = static_cast<size_t>(world_size);
    tcp.waitWorkers = false;
    tcp.timeout = Millis(static_cast<int64_t>(timeout_s * 1000));
    return std::unique_ptr<StoreServer>(
        std::make_unique<TcpStoreServer>(c10::make_intrusive<c10d::TCPStore>("127.0.0.1", tcp)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrFormat("cannot host a TCPStore on 127.0.0.1: %s", e.what()));
  }
}

}  // namespace moerr::distributed

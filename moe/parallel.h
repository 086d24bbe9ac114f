// How the reference model and trainer reach collectives without depending
// on a transport. moe/ defines this small interface in plain C++ over
// tensors; distributed/ (above moe/ and formats/, below replayer/ and
// tools/) implements it with c10d process groups. moe/ never includes c10d,
// so the model and its tests build the same with or without distributed/
// (and in the sanitizer suite, which leaves distributed/ out).
//
// Layout (Megatron-Core's, with expert parallelism carved out of data
// parallelism): world ranks 0..N-1 form N/E expert-parallel (EP) groups of E
// consecutive ranks; EP rank r of every group hosts experts
// [r*X/E, (r+1)*X/E) of every MoE layer (X experts, E divides X). The ranks
// with the same EP rank across groups hold replicas of the same experts.
// Every rank trains on its own slice of the global batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "recorder/hooks/collective_hook.h"

namespace moerr::moe {

struct ParallelLayout {
  int64_t rank = 0;        // world rank
  int64_t world_size = 1;
  int64_t ep_size = 1;     // ranks per expert-parallel group; divides world_size

  int64_t ep_rank() const { return rank % ep_size; }
  int64_t ep_group() const { return rank / ep_size; }
  int64_t replicas() const { return world_size / ep_size; }  // copies of each expert
  // The experts of a layer with `experts` experts that this rank hosts: [first, first + count).
  int64_t first_local_expert(int64_t experts) const { return ep_rank() * (experts / ep_size); }
  int64_t local_experts(int64_t experts) const { return experts / ep_size; }
  int64_t host_of(int64_t expert, int64_t experts) const { return expert / (experts / ep_size); }  // EP rank
};

// Marks the collectives a thread issues while it generates (the rollout,
// which the recorder leaves out of the step): observers that count a step's
// collectives (the multi-rank faults) count the training ones.
class RolloutScope {
 public:
  RolloutScope() { ++Depth(); }
  ~RolloutScope() { --Depth(); }
  RolloutScope(const RolloutScope&) = delete;
  RolloutScope& operator=(const RolloutScope&) = delete;
  static bool Active() { return Depth() > 0; }

 private:
  static int& Depth() {
    thread_local int depth = 0;
    return depth;
  }
};

enum class CommGroup {
  kWorld,           // every rank
  kExpertParallel,  // this rank's EP group (E ranks)
  kExpertReplicas,  // the ranks holding the same experts (N/E ranks)
};

// Every call is a collective: every rank of the group makes the same calls
// in the same order. A call that does not complete within the collective
// timeout throws c10::Error naming the collective, its group and sequence
// number.
class Parallel {
 public:
  virtual ~Parallel() = default;
  virtual const ParallelLayout& layout() const = 0;

  // Sums `t` (contiguous) in place over `group`. Not differentiable.
  virtual void AllReduceSum(at::Tensor& t, CommGroup group) = 0;

  // all_to_all over the EP group: rows [sum(send_rows), ...] of `input`, the
  // first send_rows[0] to EP rank 0 and so on; returns [sum(recv_rows), ...]
  // with EP rank 0's rows first. Differentiable: its backward is the
  // reverse all_to_all of the gradient (recv and send swapped).
  virtual at::Tensor AllToAll(const at::Tensor& input, const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows) = 0;

  // Copies every tensor from `root`'s copy over `group` (a group rank).
  virtual void Broadcast(at::Tensor& t, CommGroup group, int64_t root) = 0;

  // Observers of every collective (a recorder, a fault), called in the order
  // added, on the thread that runs the collective. Not owned; an observer
  // is removed before it is destroyed.
  void AddObserver(recorder::CollectiveObserver* o) { observers_.push_back(o); }
  void RemoveObserver(recorder::CollectiveObserver* o) {
    observers_.erase(std::remove(observers_.begin(), observers_.end(), o), observers_.end());
  }

 protected:
  const std::vector<recorder::CollectiveObserver*>& observers() const { return observers_; }

 private:
  std::vector<recorder::CollectiveObserver*> observers_;
};

}  // namespace moerr::moe

// Tensor identity (docs/TRACE.md, "Tensor identity"): which recorded id a
// tensor the op tracer sees stands for. The same id means the same bytes:
//
//  1. the same TensorImpl at the same version (a weak reference guards
//     against a freed address reused by a new tensor);
//  2. otherwise the same storage, view geometry and dtype as a recorded
//     tensor at the same version: autograd unpacks saved tensors as new
//     variables over the same storage. `.data()` views have a version
//     counter of their own; they match while the recorded tensor is still
//     at its recorded version;
//  3. otherwise a different view of a storage a recorded tensor lives in,
//     at the same version: a new id, a view of that one; only where replay
//     lays that storage out as the program did (KnownStorage::mirrors).
//
// Ids are handed out here, growing across steps; each step starts with an
// empty table, so whatever a step reads from an earlier one is new to it.
// Not thread-safe: the tracer calls it under its lock.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"

namespace moerr::recorder {

// Whether `t` is its whole storage from offset 0, every byte once: a value
// replay can lay out as the program had it.
bool CoversItsStorage(const at::Tensor& t);

class TensorIdentities {
 public:
  // What an op's input resolves to: the id it has (rules 1 and 2), or else
  // the id of the recorded tensor whose storage it views (rule 3), or
  // neither (both 0): nothing recorded this step produced these values.
  struct Input {
    uint64_t id = 0;
    uint64_t view_of = 0;
  };
  // `written`: the op's schema marks the argument as written (in place,
  // out=), so the op does not read it.
  Input ResolveInput(const at::Tensor& t, bool written);
  // The id of `t`'s TensorImpl at its current version (rule 1 only), or 0:
  // what an op output has when the op returned an input unchanged.
  uint64_t SameTensor(const at::Tensor& t) const;
  // Gives `t` a new id and remembers it. `is_view`: `t` views another id's
  // storage (rule 3), so it does not stand for that storage itself.
  // `standalone`: replay makes its value on a storage of its own (a leaf
  // read from the bundle, an output served from the record), not by
  // re-executing what made it.
  uint64_t Add(const at::Tensor& t, bool is_view, bool standalone = false);
  // The id the next Add gives (for names like "leaf/<id>").
  uint64_t next_id() const { return next_id_; }
  bool InThisStep(uint64_t id) const { return id >= step_first_id_; }
  // Forgets the tensors of earlier steps (ids keep growing).
  void NewStep();

  // An output of an op that allocates without filling (`empty`...): if a
  // recorded op reads it before any recorded op writes it, something
  // outside the ops filled it (Python's torch.tensor(0.) is an empty plus a
  // memcpy), and its values are new (ResolveInput resolves it to nothing).
  void MarkUnfilled(uint64_t id) { unfilled_.insert(id); }

  // Parameter names, by TensorImpl (kept across steps).
  void SetName(const at::Tensor& t, std::string name) { names_[t.unsafeGetTensorImpl()] = std::move(name); }
  // `t`'s name, or null.
  const std::string* NameOf(const at::Tensor& t) const;

 private:
  struct Known {
    c10::weak_intrusive_ptr<c10::TensorImpl> impl;
    uint32_t version = 0;
    uint64_t id = 0;
  };
  // Rule 2's key: storage, view geometry and dtype; the weak storage
  // reference in KnownAlias guards against reuse.
  struct AliasKey {
    const void* storage;
    int64_t offset;
    absl::InlinedVector<int64_t, 6> sizes, strides;  // inline: no allocation per lookup
    int dtype;
    bool operator==(const AliasKey& o) const {
      return storage == o.storage && offset == o.offset && sizes == o.sizes && strides == o.strides && dtype == o.dtype;
    }
    template <typename H>
    friend H AbslHashValue(H h, const AliasKey& k) {
      return H::combine(std::move(h), k.storage, k.offset, k.sizes, k.strides, k.dtype);
    }
  };
  struct KnownAlias {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    c10::weak_intrusive_ptr<c10::TensorImpl> impl;  // the tensor recorded under `id`
    uint32_t version = 0;
    uint64_t id = 0;
  };
  // Rule 3: storage -> a tensor id over it. `mirrors`: that id's replayed
  // value lies in a storage laid out as the program's (it, or what it was
  // made from, covers the storage from offset 0), so a view of the storage
  // can be rebuilt from it at the program's offsets. Otherwise (a slot of a
  // larger buffer, captured on its own) another view is a value of its own.
  struct KnownStorage {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    uint32_t version = 0;
    uint64_t id = 0;
    bool mirrors = false;
  };
  static AliasKey AliasOf(const at::Tensor& t);
  // The id `t` already has (rules 1 and 2), or 0.
  uint64_t KnownId(const at::Tensor& t) const;

  uint64_t next_id_ = 1;
  uint64_t step_first_id_ = 1;  // ids below belong to earlier steps
  absl::flat_hash_map<const c10::TensorImpl*, Known> known_;
  absl::flat_hash_map<AliasKey, KnownAlias> aliases_;
  absl::flat_hash_map<const void*, KnownStorage> storages_;
  size_t inserts_since_prune_ = 0;
  absl::flat_hash_set<uint64_t> unfilled_;  // MarkUnfilled ids no recorded op has read yet
  absl::flat_hash_map<const c10::TensorImpl*, std::string> names_;
};

}  // namespace moerr::recorder

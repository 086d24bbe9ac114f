#include "recorder/tensor_identities.h"

namespace moerr::recorder {

TensorIdentities::AliasKey TensorIdentities::AliasOf(const at::Tensor& t) {
  return AliasKey{t.storage().unsafeGetStorageImpl(), t.storage_offset(),
                  absl::InlinedVector<int64_t, 6>(t.sizes().begin(), t.sizes().end()),
                  absl::InlinedVector<int64_t, 6>(t.strides().begin(), t.strides().end()),
                  static_cast<int>(t.scalar_type())};
}

uint64_t TensorIdentities::SameTensor(const at::Tensor& t) const {
  auto it = known_.find(t.unsafeGetTensorImpl());
  if (it != known_.end() && !it->second.impl.expired() && it->second.version == static_cast<uint32_t>(t._version())) {
    return it->second.id;
  }
  return 0;
}

uint64_t TensorIdentities::KnownId(const at::Tensor& t) const {
  if (const uint64_t id = SameTensor(t)) return id;
  if (!t.has_storage()) return 0;
  auto alias = aliases_.find(AliasOf(t));
  if (alias == aliases_.end() || alias->second.storage.expired()) return 0;
  const uint32_t version = static_cast<uint32_t>(t._version());
  if (alias->second.version == version) return alias->second.id;  // a shared version counter
  // `.data()`-style aliases have a version counter of their own: the values
  // are the recorded ones while the recorded tensor is at its version.
  const c10::intrusive_ptr<c10::TensorImpl> recorded = alias->second.impl.lock();
  if (recorded && recorded->version_counter().current_version() == alias->second.version) return alias->second.id;
  return 0;
}

TensorIdentities::Input TensorIdentities::ResolveInput(const at::Tensor& t, bool written) {
  if (const uint64_t known = KnownId(t)) {
    // An unfilled buffer read before any recorded op wrote it: new values.
    if (written || unfilled_.erase(known) == 0) return Input{known, 0};
    return Input{};
  }
  if (!t.has_storage()) return Input{};
  // Another view of a storage a recorded tensor lives in, unchanged since.
  auto it = storages_.find(t.storage().unsafeGetStorageImpl());
  if (it != storages_.end() && it->second.mirrors && !it->second.storage.expired() &&
      it->second.version == static_cast<uint32_t>(t._version())) {
    return Input{0, it->second.id};
  }
  return Input{};
}

bool CoversItsStorage(const at::Tensor& t) {
  return t.has_storage() && t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
         t.nbytes() == t.storage().nbytes();
}

uint64_t TensorIdentities::Add(const at::Tensor& t, bool is_view, bool standalone) {
  const uint64_t id = next_id_++;
  const uint32_t version = static_cast<uint32_t>(t._version());
  known_.insert_or_assign(t.unsafeGetTensorImpl(),
                          Known{c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), version, id});
  if (t.has_storage()) {
    auto weak = t.storage().getWeakStorageImpl();
    aliases_.insert_or_assign(
        AliasOf(t), KnownAlias{weak, c10::weak_intrusive_ptr<c10::TensorImpl>(t.getIntrusivePtr()), version, id});
    if (!is_view) {
      // Replay rebuilds the storage's layout when this tensor covers it, or
      // when it is re-executed over a storage replay already laid out so (a
      // view or an in-place write of what was there).
      const bool covers = CoversItsStorage(t);
      auto [it, inserted] =
          storages_.try_emplace(t.storage().unsafeGetStorageImpl(), KnownStorage{weak, version, id, covers});
      if (!inserted) {
        const bool mirrored = !standalone && it->second.mirrors && !it->second.storage.expired();
        it->second = KnownStorage{std::move(weak), version, id, covers || mirrored};
      }
    }
  }
  // Entries of freed tensors are dead weight until the step ends; a long
  // step drops them now and then.
  if (++inserts_since_prune_ > 100000) {
    absl::erase_if(known_, [](const auto& kv) { return kv.second.impl.expired(); });
    absl::erase_if(aliases_, [](const auto& kv) { return kv.second.storage.expired(); });
    absl::erase_if(storages_, [](const auto& kv) { return kv.second.storage.expired(); });
    inserts_since_prune_ = 0;
  }
  return id;
}

void TensorIdentities::NewStep() {
  step_first_id_ = next_id_;
  // The maps keep the size the last step reached: clear() frees a large
  // table, and growing it back rehashes every entry a dozen times a step.
  const size_t known = known_.size(), aliases = aliases_.size(), storages = storages_.size();
  known_.clear();
  aliases_.clear();
  storages_.clear();
  known_.reserve(known);
  aliases_.reserve(aliases);
  storages_.reserve(storages);
  unfilled_.clear();
}

const std::string* TensorIdentities::NameOf(const at::Tensor& t) const {
  auto it = names_.find(t.unsafeGetTensorImpl());
  return it == names_.end() ? nullptr : &it->second;
}

}  // namespace moerr::recorder

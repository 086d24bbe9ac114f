#include "formats/bundle_copy.h"

#include "support/status.h"

namespace moerr::formats {
namespace {

absl::Status CopyTensors(const BundleReader& from, BundleWriter& to) {
  for (const TensorInfo& t : from.index().tensors) {
    MOERR_ASSIGN_OR_RETURN(const OwnedTensor value, from.ReadBlob(t.blob));
    MOERR_RETURN_IF_ERROR(to.PutTensor(t.name, t.role, t.step, value.view()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyBundle(const BundleReader& from, BundleWriter& to) {
  bool tensors_copied = false;
  for (const RecordRef& ref : from.index().records) {
    const auto kind = static_cast<RecordKind>(ref.kind);
    if (kind == RecordKind::kBlob || kind == RecordKind::kTensor) continue;  // PutTensor writes them
    if (!tensors_copied && kind != RecordKind::kStepBegin) {
      MOERR_RETURN_IF_ERROR(CopyTensors(from, to));
      tensors_copied = true;
    }
    switch (kind) {
      case RecordKind::kStepBegin:
        MOERR_RETURN_IF_ERROR(to.BeginStep(ref.step));
        if (!tensors_copied) MOERR_RETURN_IF_ERROR(CopyTensors(from, to));
        tensors_copied = true;
        break;
      case RecordKind::kStepEnd: MOERR_RETURN_IF_ERROR(to.EndStep(ref.step)); break;
      default: {
        MOERR_ASSIGN_OR_RETURN(const Record record, from.ReadRecord(ref));
        MOERR_RETURN_IF_ERROR(to.AppendRecord(record));
      }
    }
  }
  if (!tensors_copied) MOERR_RETURN_IF_ERROR(CopyTensors(from, to));
  return absl::OkStatus();
}

}  // namespace moerr::formats

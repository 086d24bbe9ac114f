#include "formats/bundle_index.h"

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "formats/bundle.capnp.h"
#include "formats/chunk_codec.h"
#include "formats/frame.h"
#include "formats/kj_boundary.h"
#include "formats/op_arg_codec.h"
#include "support/status.h"
#define XXH_STATIC_LINKING_ONLY
#include "xxhash.h"
#include "zstd.h"

namespace moerr::formats {
namespace {

// ---- encoding ---------------------------------------------------------------

void SetBlob(const BlobInfo& in, schema::Blob::Builder out) {
  out.setHashLow(in.hash.low);
  out.setHashHigh(in.hash.high);
  out.setDtype(static_cast<schema::DType>(in.dtype));
  auto shape = out.initShape(in.shape.size());
  for (size_t i = 0; i < in.shape.size(); ++i) shape.set(i, in.shape[i]);
  out.setRawSize(in.raw_size);
  auto chunks = out.initChunks(in.chunks.size());
  for (size_t i = 0; i < in.chunks.size(); ++i) {
    const ChunkInfo& c = in.chunks[i];
    auto b = chunks[i];
    b.setOffset(c.offset);
    b.setStoredSize(c.stored_size);
    b.setRawSize(c.raw_size);
    b.setCodec(static_cast<schema::Codec>(c.codec));
    b.setShuffle(c.shuffle);
  }
}

void SetTensor(const TensorInfo& in, schema::Tensor::Builder out) {
  out.setName(capnp::Text::Reader(in.name.data(), in.name.size()));
  out.setRole(static_cast<schema::Role>(in.role));
  out.setStep(in.step);
  out.setBlob(in.blob);
}

void SetValue(const llvm::json::Value& in, schema::Value::Builder out) {
  switch (in.kind()) {
    case llvm::json::Value::Null: out.setNull(); break;
    case llvm::json::Value::Boolean: out.setBoolean(*in.getAsBoolean()); break;
    case llvm::json::Value::Number:
      if (auto i = in.getAsInteger()) {
        out.setInteger(*i);
      } else {
        out.setNumber(*in.getAsNumber());
      }
      break;
    case llvm::json::Value::String: {
      const llvm::StringRef text = *in.getAsString();
      out.setText(capnp::Text::Reader(text.data(), text.size()));
      break;
    }
    case llvm::json::Value::Array: {
      const auto& arr = *in.getAsArray();
      auto list = out.initList(arr.size());
      for (size_t i = 0; i < arr.size(); ++i) SetValue(arr[i], list[i]);
      break;
    }
    case llvm::json::Value::Object: {
      const auto& obj = *in.getAsObject();
      // Sorted keys: the encoding of a value is deterministic.
      std::vector<std::string> keys;
      for (const auto& kv : obj) keys.push_back(kv.first.str());
      std::sort(keys.begin(), keys.end());
      auto fields = out.initObject(keys.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        fields[i].setKey(capnp::Text::Reader(keys[i].data(), keys[i].size()));
        SetValue(*obj.get(keys[i]), fields[i].initValue());
      }
      break;
    }
  }
}

void SetFingerprint(const Fingerprint& in, schema::Fingerprint::Builder out) {
  out.setNumel(in.numel);
  out.setMin(in.min);
  out.setMax(in.max);
  out.setMean(in.mean);
  out.setAbsMax(in.abs_max);
  out.setL2(in.l2);
  out.setNan(in.nan);
  out.setPosInf(in.pos_inf);
  out.setNegInf(in.neg_inf);
  out.setBeyondF16(in.beyond_f16);
  out.setBeyondBf16(in.beyond_bf16);
  out.setHash(in.hash);
  out.setUnknown(in.unknown);
  out.setChecksum(in.checksum);
  out.setChecksumKind(static_cast<uint8_t>(in.checksum_kind));
}

void SetOpBatch(const OpBatch& in, schema::OpBatch::Builder out) {
  auto ops = out.initOps(in.ops.size());
  for (size_t i = 0; i < in.ops.size(); ++i) {
    const OpEvent& op = in.ops[i];
    auto b = ops[i];
    b.setSeq(op.seq);
    b.setThread(op.thread);
    b.setPhase(static_cast<schema::Phase>(op.phase));
    b.setName(TextOf(op.name));
    b.setOverload(TextOf(op.overload));
    b.setSequenceNr(op.sequence_nr);
    b.setForwardSeq(op.forward_seq);
    b.setModule(TextOf(op.module));
    auto args = b.initArgs(op.args.size());
    for (size_t a = 0; a < op.args.size(); ++a) SetArg(op.args[a], args[a]);
    SetList(b.initOutputs(op.outputs.size()), op.outputs);
    b.setAutocast(op.autocast);
    b.setDevice(TextOf(op.device));
    b.setScope(op.scope);
  }
  auto tensors = out.initTensors(in.tensors.size());
  for (size_t i = 0; i < in.tensors.size(); ++i) {
    const TensorMeta& t = in.tensors[i];
    auto b = tensors[i];
    b.setId(t.id);
    b.setDtype(static_cast<schema::DType>(t.dtype));
    SetList(b.initShape(t.shape.size()), t.shape);
    SetList(b.initStrides(t.strides.size()), t.strides);
    b.setStorageOffset(t.storage_offset);
    SetFingerprint(t.fingerprint, b.initFingerprint());
    b.setProducer(t.producer);
    b.setLeaf(TextOf(t.leaf));
    b.setViewOf(t.view_of);
  }
}

std::vector<std::byte> ToBytes(capnp::MessageBuilder& message) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  std::vector<std::byte> out(bytes.size());
  std::memcpy(out.data(), bytes.begin(), bytes.size());
  return out;
}

// ---- decoding ---------------------------------------------------------------

absl::StatusOr<BlobInfo> GetBlob(schema::Blob::Reader in) {
  BlobInfo out;
  out.hash = {in.getHashLow(), in.getHashHigh()};
  const auto dtype = DTypeFromRaw(static_cast<uint16_t>(in.getDtype()));
  if (!dtype) return absl::DataLossError(absl::StrFormat("dtype %d is unknown", int(in.getDtype())));
  out.dtype = *dtype;
  auto shape = in.getShape();
  out.shape.reserve(shape.size());
  for (int64_t d : shape) out.shape.push_back(d);
  out.raw_size = in.getRawSize();
  auto chunks = in.getChunks();
  out.chunks.reserve(chunks.size());
  for (auto c : chunks) {
    const auto codec = static_cast<uint16_t>(c.getCodec());
    if (codec > static_cast<uint16_t>(Codec::kZstd)) {
      return absl::DataLossError(absl::StrFormat("chunk at offset %d: codec %d is unknown", c.getOffset(), codec));
    }
    out.chunks.push_back(ChunkInfo{c.getOffset(), c.getStoredSize(), c.getRawSize(), static_cast<Codec>(codec),
                                   c.getShuffle()});
  }
  return out;
}

absl::StatusOr<TensorInfo> GetTensor(schema::Tensor::Reader in) {
  TensorInfo out;
  out.name = std::string(View(in.getName()));
  const auto role = static_cast<uint16_t>(in.getRole());
  if (role >= kNumRoles) return absl::DataLossError(absl::StrFormat("role %d is unknown", role));
  out.role = static_cast<Role>(role);
  out.step = in.getStep();
  out.blob = in.getBlob();
  return out;
}

llvm::json::Value GetValue(schema::Value::Reader in) {
  switch (in.which()) {
    case schema::Value::NULL_: return nullptr;
    case schema::Value::BOOLEAN: return in.getBoolean();
    case schema::Value::INTEGER: return in.getInteger();
    case schema::Value::NUMBER: return in.getNumber();
    case schema::Value::TEXT: return std::string(View(in.getText()));
    case schema::Value::LIST: {
      llvm::json::Array arr;
      for (auto v : in.getList()) arr.push_back(GetValue(v));
      return arr;
    }
    case schema::Value::OBJECT: {
      llvm::json::Object obj;
      for (auto f : in.getObject()) obj[std::string(View(f.getKey()))] = GetValue(f.getValue());
      return obj;
    }
  }
  return nullptr;  // a newer writer's kind: read as null
}

Fingerprint GetFingerprint(schema::Fingerprint::Reader in) {
  Fingerprint f;
  f.numel = in.getNumel();
  f.min = in.getMin();
  f.max = in.getMax();
  f.mean = in.getMean();
  f.abs_max = in.getAbsMax();
  f.l2 = in.getL2();
  f.nan = in.getNan();
  f.pos_inf = in.getPosInf();
  f.neg_inf = in.getNegInf();
  f.beyond_f16 = in.getBeyondF16();
  f.beyond_bf16 = in.getBeyondBf16();
  f.hash = in.getHash();
  f.unknown = in.getUnknown();
  f.checksum = in.getChecksum();
  const uint8_t kind = in.getChecksumKind();
  f.checksum_kind = kind <= static_cast<uint8_t>(Fingerprint::Checksum::kXor64) ? static_cast<Fingerprint::Checksum>(kind)
                                                                                 : Fingerprint::Checksum::kNone;
  return f;
}

absl::StatusOr<OpBatch> GetOpBatch(schema::OpBatch::Reader in) {
  OpBatch out;
  auto ops = in.getOps();
  out.ops.reserve(ops.size());
  for (auto b : ops) {
    OpEvent op;
    op.seq = b.getSeq();
    op.thread = b.getThread();
    const auto phase = static_cast<uint16_t>(b.getPhase());
    op.phase = phase <= static_cast<uint16_t>(Phase::kOther) ? static_cast<Phase>(phase) : Phase::kOther;
    op.name = std::string(View(b.getName()));
    op.overload = std::string(View(b.getOverload()));
    op.sequence_nr = b.getSequenceNr();
    op.forward_seq = b.getForwardSeq();
    op.module = std::string(View(b.getModule()));
    for (auto a : b.getArgs()) op.args.push_back(GetArg(a));
    op.outputs = GetList<uint64_t>(b.getOutputs());
    op.autocast = b.getAutocast();
    op.device = std::string(View(b.getDevice()));
    op.scope = b.getScope();
    out.ops.push_back(std::move(op));
  }
  auto tensors = in.getTensors();
  out.tensors.reserve(tensors.size());
  for (auto b : tensors) {
    TensorMeta t;
    t.id = b.getId();
    const auto dtype = DTypeFromRaw(static_cast<uint16_t>(b.getDtype()));
    if (!dtype) return absl::DataLossError(absl::StrFormat("tensor %d: dtype %d is unknown", t.id, int(b.getDtype())));
    t.dtype = *dtype;
    t.shape = GetList<int64_t>(b.getShape());
    t.strides = GetList<int64_t>(b.getStrides());
    t.storage_offset = b.getStorageOffset();
    t.fingerprint = GetFingerprint(b.getFingerprint());
    t.producer = b.getProducer();
    t.leaf = std::string(View(b.getLeaf()));
    t.view_of = b.getViewOf();
    out.tensors.push_back(std::move(t));
  }
  return out;
}

// Checks the segment table before Cap'n Proto sees the message, so its errors
// name the field and the limit, and decoding never sizes anything from it.
absl::Status CheckSegmentTable(absl::Span<const std::byte> payload, uint64_t offset, const Limits& limits) {
  if (payload.size() < 8 || payload.size() % 8 != 0) {
    return absl::DataLossError(absl::StrFormat(
        "Cap'n Proto message at offset %d: %d bytes is not a whole number of words", offset, payload.size()));
  }
  uint32_t count_minus_one;
  std::memcpy(&count_minus_one, payload.data(), 4);
  const uint64_t count = uint64_t{count_minus_one} + 1;
  if (count > limits.max_segments) {
    return absl::DataLossError(absl::StrFormat(
        "Cap'n Proto message at offset %d: segment count %d exceeds the limit %d", offset, count,
        limits.max_segments));
  }
  const uint64_t table_bytes = PaddedLength(4 + 4 * count);
  if (table_bytes > payload.size()) {
    return absl::DataLossError(absl::StrFormat(
        "Cap'n Proto message at offset %d: segment table (%d bytes) is longer than the message (%d)", offset,
        table_bytes, payload.size()));
  }
  uint64_t words = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t size;
    std::memcpy(&size, payload.data() + 4 + 4 * i, 4);
    words += size;
  }
  if (table_bytes + 8 * words > payload.size()) {
    return absl::DataLossError(absl::StrFormat(
        "Cap'n Proto message at offset %d: segments declare %d bytes, the message has %d", offset,
        table_bytes + 8 * words, payload.size()));
  }
  return absl::OkStatus();
}

// Runs `decode(reader)` over `payload` inside the kj boundary.
template <typename T, typename Fn>
absl::StatusOr<T> DecodeMessage(absl::Span<const std::byte> payload, uint64_t offset, const Limits& limits,
                                absl::string_view what, Fn&& decode) {
  MOERR_RETURN_IF_ERROR(CheckSegmentTable(payload, offset, limits));
  // Cap'n Proto reads words in place and needs them 8-byte aligned; a
  // misaligned buffer (a fuzzer's, say) is copied once.
  kj::Array<capnp::word> copy;
  const capnp::word* words = reinterpret_cast<const capnp::word*>(payload.data());
  if (reinterpret_cast<uintptr_t>(payload.data()) % 8 != 0) {
    copy = kj::heapArray<capnp::word>(payload.size() / 8);
    std::memcpy(copy.begin(), payload.data(), payload.size());
    words = copy.begin();
  }
  capnp::ReaderOptions options;
  options.traversalLimitInWords = std::max<uint64_t>(1024, payload.size() / 8 * limits.traversal_factor);
  options.nestingLimit = limits.nesting_limit;
  absl::StatusOr<T> result = absl::UnknownError("not decoded");
  const absl::Status status =
      CatchKj(absl::StrFormat("%s at offset %d", what, offset), [&]() -> absl::Status {
        capnp::FlatArrayMessageReader reader(kj::arrayPtr(words, payload.size() / 8), options);
        result = decode(reader);
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  if (!result.ok()) return Annotate(result.status(), absl::StrFormat("%s at offset %d", what, offset));
  return result;
}

template <typename T>
void AddOrDie(absl::StatusOr<T> value, std::vector<T>& to, absl::Status& status) {
  if (!value.ok()) {
    if (status.ok()) status = value.status();
    return;
  }
  to.push_back(*std::move(value));
}

}  // namespace

absl::string_view RoleName(Role role) {
  static constexpr absl::string_view kNames[kNumRoles] = {"other",    "parameter",  "optimizer-state",
                                                         "batch",    "leaf",       "activation",
                                                         "gradient", "rng",        "received"};
  const int i = static_cast<int>(role);
  return i < kNumRoles ? kNames[i] : "unknown";
}

absl::string_view RecordKindName(uint16_t kind) {
  static constexpr absl::string_view kNames[] = {"blob",       "tensor", "step-begin", "step-end",
                                                 "annotation", "ops",    "routing"};
  return kind < std::size(kNames) ? kNames[kind] : "unknown";
}

BlobHash ComputeBlobHash(DType dtype, absl::Span<const int64_t> shape, absl::Span<const std::byte> bytes) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, bytes.data(), bytes.size());
  const uint8_t d = static_cast<uint8_t>(dtype);
  XXH3_128bits_update(&state, &d, 1);
  XXH3_128bits_update(&state, shape.data(), shape.size() * sizeof(int64_t));
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlobHash{h.low64, h.high64};
}

uint64_t BlobInfo::StoredSize() const {
  uint64_t total = 0;
  for (const ChunkInfo& c : chunks) total += c.stored_size;
  return total;
}

std::vector<std::byte> EncodeIndex(const IndexData& index) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<schema::Index>();
  root.setRequiredFeatures(index.required_features);
  root.setWriter(TextOf(index.writer));
  auto blobs = root.initBlobs(index.blobs.size());
  for (size_t i = 0; i < index.blobs.size(); ++i) SetBlob(index.blobs[i], blobs[i]);
  auto tensors = root.initTensors(index.tensors.size());
  for (size_t i = 0; i < index.tensors.size(); ++i) SetTensor(index.tensors[i], tensors[i]);
  auto records = root.initRecords(index.records.size());
  for (size_t i = 0; i < index.records.size(); ++i) {
    const RecordRef& r = index.records[i];
    records[i].setKind(r.kind);
    records[i].setStep(r.step);
    records[i].setOffset(r.offset);
    records[i].setLength(r.length);
  }
  return ToBytes(message);
}

std::vector<std::byte> EncodeRecord(const Record& record) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<schema::Record>();
  root.setStep(record.step);
  switch (static_cast<RecordKind>(record.kind)) {
    case RecordKind::kBlob: SetBlob(record.blob, root.initBlob()); break;
    case RecordKind::kTensor: SetTensor(record.tensor, root.initTensor()); break;
    case RecordKind::kStepBegin: root.setStepBegin(); break;
    case RecordKind::kStepEnd: root.setStepEnd(); break;
    case RecordKind::kAnnotation: {
      auto field = root.initAnnotation();
      field.setKey(capnp::Text::Reader(record.key.data(), record.key.size()));
      SetValue(record.value, field.initValue());
      break;
    }
    case RecordKind::kOps: SetOpBatch(record.ops, root.initOps()); break;
    case RecordKind::kRouting: {
      const RoutingRecord& r = record.routing;
      auto b = root.initRouting();
      b.setLayer(r.layer);
      b.setMicroBatch(r.micro_batch);
      b.setTopkIds(TextOf(r.topk_ids));
      b.setTopkWeights(TextOf(r.topk_weights));
      b.setLogits(TextOf(r.logits));
      SetList(b.initTokenCounts(r.token_counts.size()), r.token_counts);
      break;
    }
  }
  return ToBytes(message);
}

absl::StatusOr<IndexData> DecodeIndex(absl::Span<const std::byte> payload, uint64_t offset,
                                      const Limits& limits) {
  return DecodeMessage<IndexData>(
      payload, offset, limits, "index", [&](capnp::MessageReader& reader) -> absl::StatusOr<IndexData> {
        auto root = reader.getRoot<schema::Index>();
        IndexData out;
        out.required_features = root.getRequiredFeatures();
        out.writer = std::string(View(root.getWriter()));
        auto blobs = root.getBlobs();
        auto tensors = root.getTensors();
        auto records = root.getRecords();
        // Counts are checked before anything is reserved from them.
        if (blobs.size() > limits.max_blobs || tensors.size() > limits.max_tensors ||
            records.size() > limits.max_records) {
          return absl::DataLossError(absl::StrFormat(
              "%d blobs, %d tensors, %d records exceed the limits %d, %d, %d", blobs.size(), tensors.size(),
              records.size(), limits.max_blobs, limits.max_tensors, limits.max_records));
        }
        absl::Status status;
        out.blobs.reserve(blobs.size());
        for (size_t i = 0; i < blobs.size() && status.ok(); ++i) {
          AddOrDie(GetBlob(blobs[i]), out.blobs, status);
          if (!status.ok()) return Annotate(status, absl::StrFormat("blob %d", i));
        }
        out.tensors.reserve(tensors.size());
        for (size_t i = 0; i < tensors.size(); ++i) {
          AddOrDie(GetTensor(tensors[i]), out.tensors, status);
          if (!status.ok()) return Annotate(status, absl::StrFormat("tensor %d", i));
        }
        out.records.reserve(records.size());
        for (auto r : records) {
          out.records.push_back(RecordRef{r.getKind(), r.getStep(), r.getOffset(), r.getLength()});
        }
        return out;
      });
}

absl::StatusOr<Record> DecodeRecord(absl::Span<const std::byte> payload, uint64_t offset, const Limits& limits) {
  return DecodeMessage<Record>(
      payload, offset, limits, "record", [&](capnp::MessageReader& reader) -> absl::StatusOr<Record> {
        auto root = reader.getRoot<schema::Record>();
        Record out;
        out.step = root.getStep();
        out.kind = static_cast<uint16_t>(root.which());
        switch (root.which()) {
          case schema::Record::BLOB: {
            MOERR_ASSIGN_OR_RETURN(out.blob, GetBlob(root.getBlob()));
            break;
          }
          case schema::Record::TENSOR: {
            MOERR_ASSIGN_OR_RETURN(out.tensor, GetTensor(root.getTensor()));
            break;
          }
          case schema::Record::STEP_BEGIN:
          case schema::Record::STEP_END: break;
          case schema::Record::ANNOTATION: {
            auto field = root.getAnnotation();
            out.key = std::string(View(field.getKey()));
            out.value = GetValue(field.getValue());
            break;
          }
          case schema::Record::OPS: {
            MOERR_ASSIGN_OR_RETURN(out.ops, GetOpBatch(root.getOps()));
            break;
          }
          case schema::Record::ROUTING: {
            auto r = root.getRouting();
            out.routing.layer = r.getLayer();
            out.routing.micro_batch = r.getMicroBatch();
            out.routing.topk_ids = std::string(View(r.getTopkIds()));
            out.routing.topk_weights = std::string(View(r.getTopkWeights()));
            out.routing.logits = std::string(View(r.getLogits()));
            out.routing.token_counts = GetList<int64_t>(r.getTokenCounts());
            break;
          }
        }
        return out;
      });
}

std::vector<std::byte> EncodeRecordFrame(const Record& record, uint32_t* flags) {
  constexpr size_t kMinCompressed = 4096;
  std::vector<std::byte> bytes = EncodeRecord(record);
  *flags = 0;
  if (bytes.size() < kMinCompressed) return bytes;
  thread_local ChunkEncoder encoder;  // not thread-safe: one per thread
  EncodedChunk chunk;
  encoder.Encode(bytes, /*item_size=*/1, chunk);
  if (chunk.codec != Codec::kZstd) return bytes;
  *flags = kRecordZstd;
  chunk.buffer.resize(chunk.payload.size());  // the payload is the buffer's start
  return std::move(chunk.buffer);
}

absl::StatusOr<Record> DecodeRecordFrame(absl::Span<const std::byte> payload, uint32_t flags, uint64_t offset,
                                         const Limits& limits) {
  if ((flags & ~kRecordZstd) != 0) {
    return absl::DataLossError(absl::StrFormat("record at offset %d: unknown frame flags 0x%x", offset, flags));
  }
  if (flags == 0) return DecodeRecord(payload, offset, limits);
  // The size is checked before anything is allocated from it.
  const unsigned long long size = ZSTD_getFrameContentSize(payload.data(), payload.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN) {
    return absl::DataLossError(absl::StrFormat("record at offset %d: not a zstd frame with its content size", offset));
  }
  if (size % sizeof(capnp::word) != 0 || size > limits.max_record_bytes) {
    return absl::DataLossError(absl::StrFormat("record at offset %d: decompressed size %d is not whole words up to %d",
                                               offset, size, limits.max_record_bytes));
  }
  // Cap'n Proto reads words: decompress into word-aligned memory.
  std::vector<capnp::word> words(size / sizeof(capnp::word));
  const absl::Span<std::byte> bytes(reinterpret_cast<std::byte*>(words.data()), size);
  if (absl::Status s = DecodeChunk(payload, Codec::kZstd, /*shuffle=*/1, bytes); !s.ok()) {
    return absl::DataLossError(absl::StrFormat("record at offset %d: %s", offset, s.message()));
  }
  return DecodeRecord(bytes, offset, limits);
}

}  // namespace moerr::formats

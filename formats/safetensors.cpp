#include "formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

#include "absl/strings/str_format.h"
#include "formats/file_sink.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "support/check.h"
#include "support/status.h"

namespace moerr::formats {

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buffer) return absl::NotFoundError(absl::StrFormat("cannot open %s: %s", path, buffer.getError().message()));
  auto file = ParseSafetensors(std::shared_ptr<llvm::MemoryBuffer>(std::move(*buffer)));
  if (!file.ok()) return Annotate(file.status(), path);
  return file;
}

namespace {

// A tensor of the file and the bytes [begin, end) of the data area it spans.
struct TensorSpan {
  uint64_t begin, end;
  std::string name;
  TensorView view;
};

// The decoded text of a JSON string `literal` (quotes included), which the
// JSON parser has already accepted.
std::string DecodeKey(llvm::StringRef literal) {
  if (!literal.contains('\\')) return literal.substr(1, literal.size() - 2).str();
  auto decoded = llvm::json::parse(literal);
  if (!decoded || !decoded->getAsString()) {
    llvm::consumeError(decoded.takeError());
    return literal.str();
  }
  return decoded->getAsString()->str();
}

// The parser keeps the last of two equal keys of an object silently, so a
// header naming a tensor twice would lose one entry unseen. This walk over
// the text (already valid JSON) rejects any object, at any depth, with a key
// twice (keys compared decoded, so an escaped spelling of a key is the same key).
absl::Status CheckNoDuplicateKeys(llvm::StringRef text) {
  struct Frame {
    bool object;
    bool expect_key;
    std::set<std::string> keys;
  };
  std::vector<Frame> stack;
  std::string top_key;  // the top-level key whose value is being walked
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '{' || c == '[') {
      stack.push_back(Frame{c == '{', c == '{', {}});
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
    } else if (c == ',') {
      if (!stack.empty() && stack.back().object) stack.back().expect_key = true;
    } else if (c == ':') {
      if (!stack.empty()) stack.back().expect_key = false;
    } else if (c == '"') {
      size_t end = i + 1;
      while (end < text.size() && text[end] != '"') end += text[end] == '\\' ? 2 : 1;
      const llvm::StringRef literal = text.slice(i, end + 1);
      i = end;
      if (stack.empty() || !stack.back().object || !stack.back().expect_key) continue;
      std::string key = DecodeKey(literal);
      if (stack.size() == 1) top_key = key;
      if (!stack.back().keys.insert(key).second) {
        if (stack.size() == 1) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "safetensors: the header names \"%s\" twice (a JSON parser would keep only the last)", key));
        }
        return absl::InvalidArgumentError(
            absl::StrFormat("safetensors: the header entry \"%s\" has the key \"%s\" twice", top_key, key));
      }
    }
  }
  return absl::OkStatus();
}

// The JSON header: an 8-byte little-endian size, then that many bytes of a
// JSON object. `header_size` is set to that size.
absl::StatusOr<llvm::json::Value> ParseHeader(const std::byte* bytes, uint64_t size, uint64_t& header_size) {
  if (size < 8) return absl::InvalidArgumentError("safetensors: file shorter than its 8-byte header size");
  std::memcpy(&header_size, bytes, 8);
  if (header_size > kMaxSafetensorsHeader) {
    return absl::InvalidArgumentError(
        absl::StrFormat("safetensors: header of %d bytes exceeds the cap of %d", header_size, kMaxSafetensorsHeader));
  }
  if (header_size > size - 8) {
    return absl::InvalidArgumentError(
        absl::StrFormat("safetensors: header of %d bytes runs past the end of the file (%d bytes)", header_size, size));
  }
  const llvm::StringRef text(reinterpret_cast<const char*>(bytes + 8), header_size);
  auto json = llvm::json::parse(text);
  if (!json) return absl::InvalidArgumentError("safetensors: header: " + llvm::toString(json.takeError()));
  if (json->getAsObject() == nullptr) return absl::InvalidArgumentError("safetensors: header is not a JSON object");
  MOERR_RETURN_IF_ERROR(CheckNoDuplicateKeys(text));
  return std::move(*json);
}

// "__metadata__": an object of strings.
absl::Status ReadMetadata(const llvm::json::Value& value, std::map<std::string, std::string>& metadata) {
  const auto* meta = value.getAsObject();
  if (meta == nullptr) return absl::InvalidArgumentError("safetensors: __metadata__ is not an object");
  for (const auto& [k, v] : *meta) {
    auto str = v.getAsString();
    if (!str) return absl::InvalidArgumentError(absl::StrFormat("safetensors: __metadata__.%s is not a string", k.str()));
    metadata[k.str()] = str->str();
  }
  return absl::OkStatus();
}

// "F64, F32, BF16, ...": the safetensors dtypes moerr reads.
std::string SupportedSafetensorsDTypes() {
  std::string out;
  for (int d = 0; d < kNumDTypes; ++d) {
    if (d > 0) out += ", ";
    out += std::string(SafetensorsDTypeName(static_cast<DType>(d)));
  }
  return out;
}

// The header entry of tensor `name`: its dtype, shape and data offsets,
// which must span shape x itemsize bytes inside the data area `data` of
// `data_size` bytes (owned by `buffer`).
absl::StatusOr<TensorSpan> ReadTensorEntry(const std::string& name, const llvm::json::Value& value,
                                           const std::byte* data, uint64_t data_size,
                                           const std::shared_ptr<llvm::MemoryBuffer>& buffer) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat("safetensors: tensor \"%s\": %s", name, why));
  };
  const auto* entry = value.getAsObject();
  if (entry == nullptr) return bad("entry is not an object");
  auto dtype_name = entry->getString("dtype");
  if (!dtype_name) return bad("no dtype");
  auto dtype = DTypeFromSafetensorsName(dtype_name->str());
  if (!dtype) {
    return bad(absl::StrFormat("dtype %s is not supported by moerr (it reads %s)", dtype_name->str(),
                               SupportedSafetensorsDTypes()));
  }
  const auto* shape_json = entry->getArray("shape");
  const auto* offsets = entry->getArray("data_offsets");
  if (shape_json == nullptr || offsets == nullptr || offsets->size() != 2) return bad("needs shape and data_offsets [begin, end]");
  TensorView view;
  view.dtype = *dtype;
  if (shape_json->size() > 64) return bad("rank above 64");
  for (const auto& d : *shape_json) {
    auto dim = d.getAsInteger();
    if (!dim || *dim < 0) return bad("shape has a dimension that is not a non-negative integer");
    view.shape.push_back(*dim);
  }
  auto begin = (*offsets)[0].getAsUINT64();
  auto end = (*offsets)[1].getAsUINT64();
  if (!begin || !end || *begin > *end) return bad("data_offsets are not 0 <= begin <= end");
  auto nbytes = CheckedNumel(view.shape, ItemSize(view.dtype));
  if (!nbytes.ok()) return bad(nbytes.status().message());
  if (*end - *begin != static_cast<uint64_t>(*nbytes)) {
    return bad(absl::StrFormat("data_offsets span %d bytes, shape x itemsize is %d", *end - *begin, *nbytes));
  }
  if (*end > data_size) return bad(absl::StrFormat("data_offsets end %d is past the buffer (%d bytes)", *end, data_size));
  view.data = data + *begin;
  view.owner = buffer;
  return TensorSpan{*begin, *end, name, std::move(view)};
}

// The tensors, sorted by offset, tile the data area of `data_size` bytes:
// no gap, no overlap. An empty tensor sorts before a non-empty one at the
// same offset (the safetensors library writes [k, k] beside [k, k + n]).
absl::Status CheckContiguous(std::vector<TensorSpan>& spans, uint64_t data_size) {
  std::sort(spans.begin(), spans.end(), [](const TensorSpan& a, const TensorSpan& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (const TensorSpan& s : spans) {
    if (s.begin != expected) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "safetensors: tensor \"%s\" starts at %d, expected %d: offsets must be contiguous and not overlap", s.name,
          s.begin, expected));
    }
    expected = s.end;
  }
  if (expected != data_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("safetensors: tensors cover %d bytes of a %d-byte buffer", expected, data_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsFile> ParseSafetensors(std::shared_ptr<llvm::MemoryBuffer> buffer) {
  const auto* bytes = reinterpret_cast<const std::byte*>(buffer->getBufferStart());
  const uint64_t size = buffer->getBufferSize();
  uint64_t header_size = 0;
  MOERR_ASSIGN_OR_RETURN(const llvm::json::Value json, ParseHeader(bytes, size, header_size));
  SafetensorsFile out;
  const std::byte* data = bytes + 8 + header_size;
  const uint64_t data_size = size - 8 - header_size;
  std::vector<TensorSpan> spans;
  for (const auto& [key, value] : *json.getAsObject()) {
    const std::string name = key.str();
    if (name == "__metadata__") {
      MOERR_RETURN_IF_ERROR(ReadMetadata(value, out.metadata));
      continue;
    }
    MOERR_ASSIGN_OR_RETURN(TensorSpan span, ReadTensorEntry(name, value, data, data_size, buffer));
    spans.push_back(std::move(span));
  }
  MOERR_RETURN_IF_ERROR(CheckContiguous(spans, data_size));
  for (TensorSpan& s : spans) out.tensors.emplace_back(std::move(s.name), std::move(s.view));
  out.buffer = std::move(buffer);
  return out;
}

std::string SafetensorsHeader(absl::Span<const TensorEntry> entries, absl::Span<const uint64_t> nbytes,
                              const std::map<std::string, std::string>& metadata) {
  MOERR_CHECK(entries.size() == nbytes.size());
  llvm::json::Object header;
  if (!metadata.empty()) {
    llvm::json::Object meta;
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    llvm::json::Array shape;
    for (int64_t d : entries[i].shape) shape.push_back(d);
    header[entries[i].name] = llvm::json::Object{{"dtype", std::string(SafetensorsDTypeName(entries[i].dtype))},
                                                 {"shape", std::move(shape)},
                                                 {"data_offsets", llvm::json::Array{offset, offset + nbytes[i]}}};
    offset += nbytes[i];
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(header));
  os.flush();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const uint64_t size = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &size, 8);
  return out + text;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                              const std::map<std::string, std::string>& metadata, bool overwrite) {
  std::vector<TensorEntry> entries;
  std::vector<uint64_t> sizes;
  std::set<std::string> names;
  for (const auto& [name, view] : tensors) {
    MOERR_ASSIGN_OR_RETURN(const int64_t nbytes, CheckedNumel(view.shape, ItemSize(view.dtype)));
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrFormat("safetensors: tensor \"%s\" given twice", name));
    }
    entries.push_back(TensorEntry{name, view.dtype, view.shape});
    sizes.push_back(static_cast<uint64_t>(nbytes));
  }
  const std::string header = SafetensorsHeader(entries, sizes, metadata);

  MOERR_ASSIGN_OR_RETURN(auto sink, FileSink::Create(path, overwrite));
  MOERR_RETURN_IF_ERROR(
      sink->Write(absl::MakeConstSpan(reinterpret_cast<const std::byte*>(header.data()), header.size())));
  std::vector<std::byte> scratch;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& view = tensors[i].second;
    if (view.IsContiguous()) {
      MOERR_RETURN_IF_ERROR(sink->Write(absl::MakeConstSpan(view.data, sizes[i])));
    } else {
      scratch.resize(sizes[i]);
      CopyToContiguous(view, scratch.data());
      MOERR_RETURN_IF_ERROR(sink->Write(scratch));
    }
  }
  return sink->Finish(/*sync=*/true);
}

}  // namespace moerr::formats

// libFuzzer target: any bytes through the msprobe dump.json and
// construct.json parsers and the statistics-to-fingerprint mapping
// (importers/msprobe_dump.h, importers/dump_stats.h). Must never crash,
// leak or hang; bad input is an error status.
#include <cstddef>
#include <cstdint>

#include "importers/dump_stats.h"
#include "formats/tensor_view.h"
#include "importers/msprobe_dump.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moerr::importers;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto dump = ParseDumpJson(text, "dump.json");
  if (dump.ok()) {
    for (const DumpEntry& e : dump->entries) {
      for (const auto* values : {&e.inputs, &e.outputs}) {
        for (const DumpValue& v : *values) {
          const auto dtype = v.tensor ? DTypeFromDumpName(v.dtype) : std::nullopt;
          auto numel = moerr::formats::CheckedNumel(v.shape);
          if (dtype && numel.ok()) (void)FingerprintFromStats(v, *dtype, static_cast<uint64_t>(*numel));
        }
      }
    }
  }
  (void)ParseConstructJson(text, "construct.json");
  return 0;
}

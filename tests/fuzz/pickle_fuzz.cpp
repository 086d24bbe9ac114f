// libFuzzer target: any bytes through the restricted unpickler in both its
// modes (importers/torch_unpickler.h) and the Flight Recorder dump parser,
// pickle and JSON (importers/flight_recorder_dump.h). Must never crash, leak
// or hang; bad input is an error status.
#include <cstddef>
#include <cstdint>

#include "importers/flight_recorder_dump.h"
#include "importers/torch_unpickler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moerr::importers;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (bool plain : {false, true}) {
    TorchUnpickler unpickler(plain);
    size_t pos = 0;
    (void)unpickler.Load(bytes, pos);
  }
  (void)ParseFlightRecorderDump(bytes, "nccl_trace_rank_0");
  return 0;
}

// The node agent's only reader of a container's shared region (hook/common/region_snapshot.h): a tenant can
// write any bytes there. The input is laid over a fresh region's first 16 KiB (header and GPU table), so that
// most inputs get past the magic and the layout checks and exercise the GPU table. Whatever it holds, the
// parse must not read beyond the copy, crash, or accept a UUID the metrics could not print.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_util.h"
#include "hook/common/region.h"
#include "hook/common/region_snapshot.h"

namespace {

template <typename T>
void Put(std::vector<unsigned char>* b, size_t offset, T v) {
  std::memcpy(b->data() + offset, &v, sizeof(v));
}

// A fresh region's header, field by field at the offsets of docs/hook-abi.md.
std::vector<unsigned char> FreshHeader() {
  namespace h = tessera::hook;
  std::vector<unsigned char> b(h::kRegionSnapshotBytes, 0);
  Put<uint64_t>(&b, 0, h::kRegionMagic);
  Put<uint32_t>(&b, 8, h::kRegionVersion);
  Put<uint32_t>(&b, 12, static_cast<uint32_t>(h::kRegionHeaderBytes));
  Put<uint32_t>(&b, 16, static_cast<uint32_t>(h::kRegionDeviceBytes));
  Put<uint32_t>(&b, 20, static_cast<uint32_t>(h::kMaxDevices));
  Put<uint32_t>(&b, 24, static_cast<uint32_t>(h::kRegionSlotBytes));
  Put<uint32_t>(&b, 28, h::kRegionSlots);
  Put<uint64_t>(&b, 32, h::kRegionDevicesOffset);
  Put<uint64_t>(&b, 40, h::kRegionSlotsOffset);
  Put<uint64_t>(&b, 48, h::kRegionBytes);
  return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<unsigned char> fresh = FreshHeader();
  // The first byte picks the frame: 0-127 over a valid header (past the magic), else the raw bytes alone.
  tessera::hook::RegionSnapshot snap;
  tessera::hook::Error error;
  bool ok = false;
  if (size > 0 && data[0] < 128) {
    std::vector<unsigned char> image = fresh;
    const size_t at = 64;  // keep magic, version and the sizes; overwrite from the header's lock onwards
    std::memcpy(image.data() + at, data + 1, std::min(size - 1, image.size() - at));
    ok = tessera::hook::ParseRegionSnapshot(image.data(), image.size(), &snap, &error);
  } else {
    // Exactly `size` bytes on the heap, so ASan sees any read past them.
    std::vector<unsigned char> raw(data, data + size);
    ok = tessera::hook::ParseRegionSnapshot(raw.data(), raw.size(), &snap, &error);
  }
  if (!ok) {
    if (error.empty() || snap.device_count != 0) abort();  // refused: a message, and nothing half-filled
    return 0;
  }
  if (snap.device_count < 0 || snap.device_count > tessera::hook::kMaxDevices) abort();
  for (int i = 0; i < snap.device_count; ++i) {
    const tessera::hook::RegionDeviceReport& d = snap.devices[i];
    const size_t n = strnlen(d.uuid, sizeof(d.uuid));
    if (n == 0 || n == sizeof(d.uuid)) abort();
    for (size_t k = 0; k < n; ++k) {
      if (d.uuid[k] <= ' ' || d.uuid[k] > '~' || d.uuid[k] == '"' || d.uuid[k] == '\\') abort();
    }
    if (d.own_util_ppm > tessera::hook::kPpm) abort();
    if (snap.Find(d.uuid) != &d) abort();  // no GPU twice
  }
  return 0;
}

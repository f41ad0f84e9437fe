// Which physical GPU (NVML index, UUID) is which CUDA device ordinal under CUDA_VISIBLE_DEVICES, without
// initializing CUDA (nvidia-smi and other NVML-only programs never call cuInit). CUDA_VISIBLE_DEVICES lists
// NVML indices ("0,2"), UUIDs or unique UUID prefixes ("GPU-5d3c,GPU-8a1f"); the list stops at the first
// entry that names no GPU, as the driver does. Unset: every GPU, in NVML order.
//
//   int ordinal = CudaOrdinalForGpu(getenv("CUDA_VISIBLE_DEVICES"), nvml_index, uuid);  // -1: not visible
//
// Thread-safety: pure.
#ifndef TESSERA_HOOK_CUDA_VISIBLE_DEVICES_H_
#define TESSERA_HOOK_CUDA_VISIBLE_DEVICES_H_

namespace tessera::cuda_hook {

// The CUDA ordinal of the GPU with this NVML index and UUID, or -1 when CUDA does not see it. `visible` may be
// null (unset). Entries that are neither an index nor a UUID prefix (MIG names) end the list.
int CudaOrdinalForGpu(const char* visible, unsigned nvml_index, const char* uuid);

}  // namespace tessera::cuda_hook

#endif  // TESSERA_HOOK_CUDA_VISIBLE_DEVICES_H_

// Memory: every OpenCL call that creates device memory (buffers, images, pipes, SVM) is charged to the
// container before the runtime is asked (reserve-then-commit; OpenCL allocates lazily, so creation is the
// only point where the size is known), and given back at the object's last release. Sub-buffers and images
// made from a buffer take no new memory and are not charged. clGetDeviceInfo reports the limit.
#include <string.h>

#include "hook/common/record_table.h"

#include "hook/opencl/hook.h"

namespace tessera::opencl_hook {

// ---------------------------------------------------------------------------------------------------------
// The records (hook/common/record_table.h, shared with the CUDA library): one kind, keyed by the handle. Only
// memory calls use them, never the launch path.

namespace {
hook::RecordTable<MemRecord> g_records;
constexpr uint32_t kMemKind = 1;
}  // namespace

void RecordMem(uint64_t key, const MemRecord& record) {
  if (key == 0) return;
  g_records.Put(kMemKind, key, record);  // overwrites a handle the runtime reused after a release we did not see
}

bool RetainMem(uint64_t key) {
  return g_records.Update(kMemKind, key, [](MemRecord* r) {
    ++r->refs;
    return true;
  });
}

bool ReleaseMem(uint64_t key, MemRecord* out) {
  bool last = false;
  g_records.Update(kMemKind, key, [&](MemRecord* r) {
    if (--r->refs > 0) return true;
    *out = *r;
    last = true;
    return false;  // removed
  });
  return last;
}

bool TakeMem(uint64_t key, MemRecord* out) {
  return g_records.Take(kMemKind, key, out);
}

void ResetMemTableInChild() {
  g_records.ResetInChild();
}

namespace {

int IndexOf(const HookDevice* d) {
  return d == nullptr ? -1 : static_cast<int>(d - g_state.devices);
}
HookDevice* DeviceByIndex(int i) {
  return i < 0 || i >= g_state.device_count.load(std::memory_order_acquire) ? nullptr : &g_state.devices[i];
}

void SetError(cl_int* errcode_ret, cl_int value) {
  if (errcode_ret != nullptr) *errcode_ret = value;
}

// Charges `bytes` to the context's device, runs `call` (which returns the new object and its error code),
// records the object, or gives the charge back when the runtime fails. `too_big` is the error the call's
// specification names for a single object larger than CL_DEVICE_MAX_MEM_ALLOC_SIZE (which reports the limit),
// or CL_SUCCESS when it names none (then it is an allocation failure like any other).
template <typename Call>
auto ChargedCreate(cl_context context, uint64_t bytes, cl_int too_big, cl_int* errcode_ret, Call call)
    -> decltype(call(errcode_ret)) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) {
    SetError(errcode_ret, CL_OUT_OF_RESOURCES);
    return nullptr;
  }
  if (mode != Mode::kLimited || bytes == 0) return call(errcode_ret);
  HookDevice* d = ContextDevice(context);
  if (d == nullptr || d->region_index < 0) return call(errcode_ret);
  const uint64_t limit = g_state.session.region.Limit(d->region_index);
  if (too_big != CL_SUCCESS && d->has_limits && limit != 0 && bytes > limit) {
    SetError(errcode_ret, too_big);
    return nullptr;
  }
  const cl_int charged = ChargeBefore(d, bytes);
  if (charged != CL_SUCCESS) {
    SetError(errcode_ret, charged);
    return nullptr;
  }
  cl_int err = CL_SUCCESS;
  auto object = call(&err);
  SetError(errcode_ret, err);
  if (object == nullptr) {
    Uncharge(d, bytes);
    return object;
  }
  MemRecord rec;
  rec.bytes = bytes;
  rec.device = IndexOf(d);
  rec.refs = 1;
  RecordMem(reinterpret_cast<uint64_t>(object), rec);
  return object;
}

uint64_t ChannelCount(cl_channel_order order) {
  switch (order) {
    case CL_RG:
    case CL_RA:
    case CL_Rx:
      return 2;
    case CL_RGB:
    case CL_RGx:
    case CL_sRGB:
      return 3;
    case CL_RGBA:
    case CL_BGRA:
    case CL_ARGB:
    case CL_ABGR:
    case CL_RGBx:
    case CL_sRGBA:
    case CL_sBGRA:
    case CL_sRGBx:
      return 4;
    default:
      return 1;  // CL_R, CL_A, CL_INTENSITY, CL_LUMINANCE, CL_DEPTH, CL_DEPTH_STENCIL
  }
}

// Bytes per pixel; packed types hold every channel in one element.
uint64_t ElementBytes(const cl_image_format* f) {
  if (f == nullptr) return 4;
  switch (f->image_channel_data_type) {
    case CL_SNORM_INT8:
    case CL_UNORM_INT8:
    case CL_SIGNED_INT8:
    case CL_UNSIGNED_INT8:
      return ChannelCount(f->image_channel_order);
    case CL_SNORM_INT16:
    case CL_UNORM_INT16:
    case CL_SIGNED_INT16:
    case CL_UNSIGNED_INT16:
    case CL_HALF_FLOAT:
      return 2 * ChannelCount(f->image_channel_order);
    case CL_UNORM_SHORT_565:
    case CL_UNORM_SHORT_555:
      return 2;
    case CL_UNORM_INT_101010:
    case CL_UNORM_INT_101010_2:
    case CL_UNORM_INT24:
      return 4;
    default:
      return 4 * ChannelCount(f->image_channel_order);  // 32-bit channels (and the most any format takes)
  }
}

uint64_t AtLeast1(size_t v) {
  return v == 0 ? 1 : static_cast<uint64_t>(v);
}

// An image's footprint from its descriptor (the runtime's tiled layouts are not visible; this counts the
// pixels). Images over a buffer use the buffer's memory: 0.
uint64_t ImageBytes(const cl_image_format* format, const cl_image_desc* desc) {
  if (desc == nullptr || desc->mem_object != nullptr) return 0;
  const uint64_t e = ElementBytes(format);
  const uint64_t w = AtLeast1(desc->image_width);
  switch (desc->image_type) {
    case CL_MEM_OBJECT_IMAGE1D:
      return w * e;
    case CL_MEM_OBJECT_IMAGE1D_ARRAY:
      return w * AtLeast1(desc->image_array_size) * e;
    case CL_MEM_OBJECT_IMAGE2D:
      return w * AtLeast1(desc->image_height) * e;
    case CL_MEM_OBJECT_IMAGE2D_ARRAY:
      return w * AtLeast1(desc->image_height) * AtLeast1(desc->image_array_size) * e;
    case CL_MEM_OBJECT_IMAGE3D:
      return w * AtLeast1(desc->image_height) * AtLeast1(desc->image_depth) * e;
    default:
      return 0;  // CL_MEM_OBJECT_IMAGE1D_BUFFER: the buffer's memory
  }
}

void ReleaseRecord(const MemRecord& rec) {
  Uncharge(DeviceByIndex(rec.device), rec.bytes);
}

// A runtime without the entry point (an older ICD loader): the call is invalid, as the loader would say.
#define TS_REQUIRE_REAL(sym, errcode_ret)          \
  do {                                             \
    EnsureInit();                                  \
    if (g_cl.sym == nullptr) {                     \
      SetError(errcode_ret, CL_INVALID_OPERATION); \
      return nullptr;                              \
    }                                              \
  } while (0)

}  // namespace

}  // namespace tessera::opencl_hook

using namespace tessera::opencl_hook;  // NOLINT: the exported C entry points below

extern "C" TS_EXPORT cl_mem CL_API_CALL clCreateBuffer(cl_context context, cl_mem_flags flags, size_t size,
                                                       void* host_ptr, cl_int* errcode_ret) {
  TS_REQUIRE_REAL(clCreateBuffer, errcode_ret);
  return ChargedCreate(context, size, CL_INVALID_BUFFER_SIZE, errcode_ret,
                       [&](cl_int* err) { return g_cl.clCreateBuffer(context, flags, size, host_ptr, err); });
}

extern "C" TS_EXPORT cl_mem CL_API_CALL clCreateBufferWithProperties(cl_context context,
                                                                     const cl_mem_properties* properties,
                                                                     cl_mem_flags flags, size_t size,
                                                                     void* host_ptr, cl_int* errcode_ret) {
  TS_REQUIRE_REAL(clCreateBufferWithProperties, errcode_ret);
  return ChargedCreate(context, size, CL_INVALID_BUFFER_SIZE, errcode_ret, [&](cl_int* err) {
    return g_cl.clCreateBufferWithProperties(context, properties, flags, size, host_ptr, err);
  });
}

extern "C" TS_EXPORT cl_mem CL_API_CALL clCreateImage(cl_context context, cl_mem_flags flags,
                                                      const cl_image_format* image_format,
                                                      const cl_image_desc* image_desc, void* host_ptr,
                                                      cl_int* errcode_ret) {
  TS_REQUIRE_REAL(clCreateImage, errcode_ret);
  return ChargedCreate(context, ImageBytes(image_format, image_desc), CL_SUCCESS, errcode_ret,
                       [&](cl_int* err) {
                         return g_cl.clCreateImage(context, flags, image_format, image_desc, host_ptr, err);
                       });
}

extern "C" TS_EXPORT cl_mem CL_API_CALL clCreateImageWithProperties(cl_context context,
                                                                    const cl_mem_properties* properties,
                                                                    cl_mem_flags flags,
                                                                    const cl_image_format* image_format,
                                                                    const cl_image_desc* image_desc,
                                                                    void* host_ptr, cl_int* errcode_ret) {
  TS_REQUIRE_REAL(clCreateImageWithProperties, errcode_ret);
  return ChargedCreate(context, ImageBytes(image_format, image_desc), CL_SUCCESS, errcode_ret,
                       [&](cl_int* err) {
                         return g_cl.clCreateImageWithProperties(context, properties, flags, image_format,
                                                                 image_desc, host_ptr, err);
                       });
}

extern "C" TS_EXPORT cl_mem CL_API_CALL clCreateImage2D(cl_context context, cl_mem_flags flags,
                                                        const cl_image_format* image_format,
                                                        size_t image_width, size_t image_height,
                                                        size_t image_row_pitch, void* host_ptr,
                                                        cl_int* errcode_ret) {
  TS_REQUIRE_REAL(clCreateImage2D, errcode_ret);
  cl_image_desc desc;
  memset(&desc, 0, sizeof(desc));
  desc.image_type = CL_MEM_OBJECT_IMAGE2D;
  desc.image_width = image_width;
  desc.image_height = image_height;
  return ChargedCreate(context, ImageBytes(image_format, &desc), CL_SUCCESS, errcode_ret, [&](cl_int* err) {
    return g_cl.clCreateImage2D(context, flags, image_format, image_width, image_height, image_row_pitch,
                                host_ptr, err);
  });
}

extern "C" TS_EXPORT cl_mem CL_API_CALL clCreateImage3D(cl_context context, cl_mem_flags flags,
                                                        const cl_image_format* image_format,
                                                        size_t image_width, size_t image_height,
                                                        size_t image_depth, size_t image_row_pitch,
                                                        size_t image_slice_pitch, void* host_ptr,
                                                        cl_int* errcode_ret) {
  TS_REQUIRE_REAL(clCreateImage3D, errcode_ret);
  cl_image_desc desc;
  memset(&desc, 0, sizeof(desc));
  desc.image_type = CL_MEM_OBJECT_IMAGE3D;
  desc.image_width = image_width;
  desc.image_height = image_height;
  desc.image_depth = image_depth;
  return ChargedCreate(context, ImageBytes(image_format, &desc), CL_SUCCESS, errcode_ret, [&](cl_int* err) {
    return g_cl.clCreateImage3D(context, flags, image_format, image_width, image_height, image_depth,
                                image_row_pitch, image_slice_pitch, host_ptr, err);
  });
}

extern "C" TS_EXPORT cl_mem CL_API_CALL clCreatePipe(cl_context context, cl_mem_flags flags,
                                                     cl_uint pipe_packet_size, cl_uint pipe_max_packets,
                                                     const cl_pipe_properties* properties,
                                                     cl_int* errcode_ret) {
  TS_REQUIRE_REAL(clCreatePipe, errcode_ret);
  const uint64_t bytes = static_cast<uint64_t>(pipe_packet_size) * pipe_max_packets;
  return ChargedCreate(context, bytes, CL_SUCCESS, errcode_ret, [&](cl_int* err) {
    return g_cl.clCreatePipe(context, flags, pipe_packet_size, pipe_max_packets, properties, err);
  });
}

extern "C" TS_EXPORT cl_int CL_API_CALL clRetainMemObject(cl_mem memobj) {
  EnsureInit();
  if (g_cl.clRetainMemObject == nullptr) return CL_INVALID_MEM_OBJECT;
  const cl_int r = g_cl.clRetainMemObject(memobj);
  if (r == CL_SUCCESS && CurrentMode() == Mode::kLimited) RetainMem(reinterpret_cast<uint64_t>(memobj));
  return r;
}

extern "C" TS_EXPORT cl_int CL_API_CALL clReleaseMemObject(cl_mem memobj) {
  EnsureInit();
  if (g_cl.clReleaseMemObject == nullptr) return CL_INVALID_MEM_OBJECT;
  const cl_int r = g_cl.clReleaseMemObject(memobj);
  MemRecord rec;
  if (r == CL_SUCCESS && CurrentMode() == Mode::kLimited &&
      ReleaseMem(reinterpret_cast<uint64_t>(memobj), &rec)) {
    ReleaseRecord(rec);
  }
  return r;
}

extern "C" TS_EXPORT void* CL_API_CALL clSVMAlloc(cl_context context, cl_svm_mem_flags flags, size_t size,
                                                  cl_uint alignment) {
  const Mode mode = EnsureInit();
  if (g_cl.clSVMAlloc == nullptr || mode == Mode::kFailClosed) return nullptr;
  if (mode != Mode::kLimited || size == 0) return g_cl.clSVMAlloc(context, flags, size, alignment);
  HookDevice* d = ContextDevice(context);
  if (d == nullptr || d->region_index < 0) return g_cl.clSVMAlloc(context, flags, size, alignment);
  if (ChargeBefore(d, size) != CL_SUCCESS) return nullptr;  // clSVMAlloc reports failure as NULL
  void* p = g_cl.clSVMAlloc(context, flags, size, alignment);
  if (p == nullptr) {
    Uncharge(d, size);
    return nullptr;
  }
  MemRecord rec;
  rec.bytes = size;
  rec.device = IndexOf(d);
  RecordMem(reinterpret_cast<uint64_t>(p), rec);
  return p;
}

extern "C" TS_EXPORT void CL_API_CALL clSVMFree(cl_context context, void* svm_pointer) {
  EnsureInit();
  if (g_cl.clSVMFree == nullptr) return;
  MemRecord rec;
  const bool known = svm_pointer != nullptr && TakeMem(reinterpret_cast<uint64_t>(svm_pointer), &rec);
  g_cl.clSVMFree(context, svm_pointer);
  if (known) ReleaseRecord(rec);
}

extern "C" TS_EXPORT cl_int CL_API_CALL
clEnqueueSVMFree(cl_command_queue queue, cl_uint num_svm_pointers, void* svm_pointers[],
                 void(CL_CALLBACK* pfn_free_func)(cl_command_queue, cl_uint, void*[], void*), void* user_data,
                 cl_uint num_events_in_wait_list, const cl_event* event_wait_list, cl_event* event) {
  EnsureInit();
  if (g_cl.clEnqueueSVMFree == nullptr) return CL_INVALID_OPERATION;
  const cl_int r = g_cl.clEnqueueSVMFree(queue, num_svm_pointers, svm_pointers, pfn_free_func, user_data,
                                         num_events_in_wait_list, event_wait_list, event);
  // Without a callback the runtime frees the pointers itself (not through clSVMFree): give them back now.
  // With one, the application's callback frees them, through clSVMFree.
  if (r == CL_SUCCESS && pfn_free_func == nullptr && svm_pointers != nullptr) {
    for (cl_uint i = 0; i < num_svm_pointers; ++i) {
      MemRecord rec;
      if (svm_pointers[i] != nullptr && TakeMem(reinterpret_cast<uint64_t>(svm_pointers[i]), &rec)) {
        ReleaseRecord(rec);
      }
    }
  }
  return r;
}

extern "C" TS_EXPORT cl_int CL_API_CALL clGetDeviceInfo(cl_device_id device, cl_device_info param_name,
                                                        size_t param_value_size, void* param_value,
                                                        size_t* param_value_size_ret) {
  const Mode mode = EnsureInit();
  if (g_cl.clGetDeviceInfo == nullptr) return CL_INVALID_DEVICE;
  const cl_int r =
      g_cl.clGetDeviceInfo(device, param_name, param_value_size, param_value, param_value_size_ret);
  if (r != CL_SUCCESS || mode != Mode::kLimited || param_value == nullptr) return r;
  constexpr cl_device_info kGlobalFreeMemoryAmd = 0x4039;  // cl_amd_device_attribute_query: size_t[2] in KiB
  if (param_name != CL_DEVICE_GLOBAL_MEM_SIZE && param_name != CL_DEVICE_MAX_MEM_ALLOC_SIZE &&
      param_name != kGlobalFreeMemoryAmd) {
    return r;
  }
  HookDevice* d = FindDevice(device);
  if (d == nullptr || d->region_index < 0) return r;
  const uint64_t limit = g_state.session.region.Limit(d->region_index);
  if (limit == 0) return r;
  if (param_name == kGlobalFreeMemoryAmd) {
    if (param_value_size < 2 * sizeof(size_t)) return r;
    const uint64_t used = g_state.session.region.Used(d->region_index);
    const uint64_t free_kib = (used >= limit ? 0 : limit - used) / 1024;
    size_t* v = static_cast<size_t*>(param_value);
    if (v[0] > free_kib) v[0] = free_kib;
    if (v[1] > free_kib) v[1] = free_kib;
    return r;
  }
  if (param_value_size < sizeof(cl_ulong)) return r;
  cl_ulong value;
  memcpy(&value, param_value, sizeof(value));
  if (value > limit) value = limit;
  memcpy(param_value, &value, sizeof(value));
  return r;
}

#include "verify/memory.hpp"

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/status.hpp"
#include "verify/host_data.hpp"

#ifdef RATTN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace raggedattn {
namespace verify {
namespace {

class HostMemory : public Memory {
 public:
  Status alloc(size_t bytes, void** ptr) override {
    buffers_.emplace_back(bytes);
    *ptr = buffers_.back().data();
    return Status::Ok();
  }
  Status upload(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status download(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status zero(void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
    return Status::Ok();
  }
  Status time(const std::function<Status()>& fn, double* ms) override {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = fn();
    const auto t1 = std::chrono::steady_clock::now();
    *ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    return s;
  }
  const char* name() const override { return "host"; }

 private:
  std::vector<HostBuffer> buffers_;
};

#ifdef RATTN_WITH_CUDA

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(RATTN_ERROR_CUDA, std::string("raggedattn verify: ") + what + ": " +
                                      cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

class DeviceMemory : public Memory {
 public:
  ~DeviceMemory() override {
    for (void* p : allocs_) cudaFree(p);
    if (start_) cudaEventDestroy(start_);
    if (stop_) cudaEventDestroy(stop_);
  }
  Status alloc(size_t bytes, void** ptr) override {
    *ptr = nullptr;
    if (bytes == 0) return Status::Ok();
    Status s = cuda_status(cudaMalloc(ptr, bytes), "cudaMalloc");
    if (s.ok()) allocs_.push_back(*ptr);
    return s;
  }
  Status upload(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return Status::Ok();
    return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  Status download(void* dst, const void* src, size_t bytes) override {
    // Synchronizing copy: also surfaces errors of kernels still in flight.
    if (!bytes) return cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return cuda_status(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }
  Status zero(void* dst, size_t bytes) override {
    if (!bytes) return Status::Ok();
    return cuda_status(cudaMemsetAsync(dst, 0, bytes, nullptr), "cudaMemsetAsync");
  }
  Status time(const std::function<Status()>& fn, double* ms) override {
    if (!start_) {
      RATTN_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&start_), "cudaEventCreate"));
      RATTN_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&stop_), "cudaEventCreate"));
    }
    RATTN_RETURN_IF_ERROR(cuda_status(cudaEventRecord(start_, nullptr), "cudaEventRecord"));
    Status s = fn();
    if (!s.ok()) return s;
    RATTN_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "kernel launch"));
    RATTN_RETURN_IF_ERROR(cuda_status(cudaEventRecord(stop_, nullptr), "cudaEventRecord"));
    RATTN_RETURN_IF_ERROR(cuda_status(cudaEventSynchronize(stop_), "running the kernels"));
    float elapsed = 0.f;
    RATTN_RETURN_IF_ERROR(
        cuda_status(cudaEventElapsedTime(&elapsed, start_, stop_), "cudaEventElapsedTime"));
    *ms = double(elapsed);
    return Status::Ok();
  }
  bool read_sensors(GpuReading* out) override {
    if (!sensors_tried_) {  // opened on first use, for the current device
      sensors_tried_ = true;
      int dev = 0;
      char bus[32] = {};
      if (cudaGetDevice(&dev) == cudaSuccess &&
          cudaDeviceGetPCIBusId(bus, int(sizeof(bus)), dev) == cudaSuccess) {
        sensors_ = open_gpu_sensors(bus);
      }
    }
    return sensors_ && sensors_->read(out);
  }
  const char* name() const override { return "cuda"; }

 private:
  std::vector<void*> allocs_;
  bool sensors_tried_ = false;
  std::unique_ptr<GpuSensors> sensors_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

#endif  // RATTN_WITH_CUDA

}  // namespace

std::unique_ptr<Memory> host_memory() {
  return std::make_unique<HostMemory>();
}

std::unique_ptr<Memory> device_memory() {
#ifdef RATTN_WITH_CUDA
  return std::make_unique<DeviceMemory>();
#else
  return nullptr;
#endif
}

std::string device_name(int device) {
#ifdef RATTN_WITH_CUDA
  cudaDeviceProp prop;
  if (device >= 0 && cudaGetDeviceProperties(&prop, device) == cudaSuccess) return prop.name;
#else
  (void)device;
#endif
  return "";
}

}  // namespace verify
}  // namespace raggedattn

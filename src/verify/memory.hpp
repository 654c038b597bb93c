// Where a case's tensors live while the backend under test runs: host memory for the CPU path,
// CUDA device memory for the CUDA paths. The runner is written once against this interface.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "raggedattn/raggedattn.hpp"
#include "verify/gpu_sensors.hpp"

namespace raggedattn {
namespace verify {

class Memory {
 public:
  virtual ~Memory() = default;
  // Allocations live as long as this object.
  virtual Status alloc(size_t bytes, void** ptr) = 0;
  virtual Status upload(void* dst, const void* host_src, size_t bytes) = 0;
  virtual Status download(void* host_dst, const void* src, size_t bytes) = 0;
  // Sets `bytes` bytes at dst to zero, ordered before what runs next (on the device: queued on
  // the default stream, not waited for).
  virtual Status zero(void* dst, size_t bytes) = 0;
  // Runs fn and returns the milliseconds it took where the work runs: wall clock on the host,
  // CUDA events around it on the default stream (fn only enqueues there).
  virtual Status time(const std::function<Status()>& fn, double* ms) = 0;
  // The device's SM clock and power now (gpu_sensors.hpp); false where there is nothing to read
  // (host memory, no NVML).
  virtual bool read_sensors(GpuReading* /*out*/) { return false; }
  virtual const char* name() const = 0;
};

std::unique_ptr<Memory> host_memory();
// CUDA device memory; nullptr in a build without CUDA.
std::unique_ptr<Memory> device_memory();

// The CUDA device's name ("NVIDIA H200"), for reports; "" where it cannot be read (no CUDA in
// this build, no such device). The library's DeviceCaps hold no name.
std::string device_name(int device);

}  // namespace verify
}  // namespace raggedattn

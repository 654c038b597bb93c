#include "verify/gpu_sensors.hpp"

#include <dlfcn.h>

#include <chrono>
#include <utility>

namespace raggedattn {
namespace verify {
namespace {

// The few NVML entry points used, with their C signatures (nvml.h): nvmlReturn_t is an int
// (0: success), nvmlDevice_t an opaque pointer, NVML_CLOCK_SM is 1.
using NvmlDevice = void*;
using InitFn = int (*)();
using ByPciFn = int (*)(const char*, NvmlDevice*);
using ClockFn = int (*)(NvmlDevice, int, unsigned int*);
using PowerFn = int (*)(NvmlDevice, unsigned int*);
constexpr int kNvmlClockSm = 1;

class NvmlSensors final : public GpuSensors {
 public:
  // The library stays loaded for the process (never closed): NVML keeps its own state, and a
  // later open in the same process reuses it.
  NvmlSensors(NvmlDevice dev, ClockFn clock, PowerFn power)
      : dev_(dev), clock_(clock), power_(power) {}
  bool read(GpuReading* out) override {
    unsigned int mhz = 0, milliwatts = 0;
    if (clock_(dev_, kNvmlClockSm, &mhz) != 0 || power_(dev_, &milliwatts) != 0) return false;
    out->sm_mhz = int(mhz);
    out->watts = milliwatts * 1e-3;
    return true;
  }

 private:
  NvmlDevice dev_;
  ClockFn clock_;
  PowerFn power_;
};

}  // namespace

std::unique_ptr<GpuSensors> open_gpu_sensors(const std::string& pci_bus_id) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return nullptr;
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
  auto by_pci = reinterpret_cast<ByPciFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto clock = reinterpret_cast<ClockFn>(dlsym(lib, "nvmlDeviceGetClockInfo"));
  auto power = reinterpret_cast<PowerFn>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
  NvmlDevice dev = nullptr;
  if (!init || !by_pci || !clock || !power || init() != 0 ||
      by_pci(pci_bus_id.c_str(), &dev) != 0) {
    return nullptr;
  }
  return std::make_unique<NvmlSensors>(dev, clock, power);
}

SensorSampler::SensorSampler(std::function<bool(GpuReading*)> read, std::vector<GpuReading>* out)
    : read_(std::move(read)), out_(out) {
  GpuReading g;
  if (!read_(&g)) return;
  samples_.push_back(g);
  thread_ = std::thread([this] {
    while (!stop_.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      GpuReading r;
      if (read_(&r)) samples_.push_back(r);
    }
  });
}

void SensorSampler::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_relaxed);
  thread_.join();
  out_->insert(out_->end(), samples_.begin(), samples_.end());
}

}  // namespace verify
}  // namespace raggedattn

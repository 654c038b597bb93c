// The GPU's SM clock and power draw, read in-process through NVML (libnvidia-ml, the driver's own
// library, opened at run time: no build dependency, and absent on a machine without the driver,
// where reading reports nothing). The timing loop samples them while each direction's timed calls
// run (SensorSampler), so a benchmark can tell a slower GPU from a slower kernel (nvidia-smi's few
// samples a second over a whole process mostly see the GPU idle: docs/PERFORMANCE.md item 58).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace raggedattn {
namespace verify {

struct GpuReading {
  int sm_mhz = 0;    // the SM clock now
  double watts = 0;  // the board's power draw now where the driver reports it (NVML's instant
                     // field), else its average over about a second
  bool instant_watts = false;  // which of the two `watts` is
  // Why the clock is below its maximum now (NVML's clock event reasons; 0 where unread): the bits
  // below. A GPU that slows under its power limit shows kPowerCap, not always a lower clock.
  uint64_t slowdown = 0;
};

// The bits of GpuReading::slowdown (nvmlClocksEventReason*: nvml.h).
constexpr uint64_t kSlowdownIdle = 0x1;
constexpr uint64_t kSlowdownPowerCap = 0x4;       // software power cap
constexpr uint64_t kSlowdownHw = 0x8;             // hardware slowdown (power or thermal)
constexpr uint64_t kSlowdownSwThermal = 0x20;     // software thermal slowdown
constexpr uint64_t kSlowdownHwThermal = 0x40;     // hardware thermal slowdown
constexpr uint64_t kSlowdownHwPowerBrake = 0x80;  // hardware power brake
// The reasons that take clock cycles from a busy GPU (not idling, not a clock setting).
constexpr uint64_t kSlowdownThrottling = kSlowdownPowerCap | kSlowdownHw | kSlowdownSwThermal |
                                         kSlowdownHwThermal | kSlowdownHwPowerBrake;
// "power cap+hw slowdown" for the reasons in `bits` among kSlowdownThrottling's; "" for none.
std::string slowdown_names(uint64_t bits);

// The median: the middle value, or the mean of the two middle values of an even count (0 for
// none). The one definition for the timings (runner.cpp) and the sensor summaries below.
double median(std::vector<double> v);

// A direction's GPU readings: the median SM clock and its range, the median power, and the share
// of samples whose clock was held down by power or temperature (with the reasons seen).
struct Sensed {
  int mhz = 0, mhz_min = 0, mhz_max = 0;
  double watts = 0;
  bool instant_watts = false;
  double throttled = 0;  // share of samples with a kSlowdownThrottling reason
  uint64_t reasons = 0;  // those reasons, over all samples
  // The board's energy per FLOP of the direction: median power times median call time over the
  // call's FLOPs. Under sustained load the GPU runs at its power cap, and this, not the clock, is
  // what a kernel can still lower (docs/PERFORMANCE.md item 60).
  double pj_per_flop = 0;
};
Sensed sensed(const std::vector<GpuReading>& rs, double flops, double median_ms);

class GpuSensors {
 public:
  virtual ~GpuSensors() = default;
  // false where the reading failed (the values are then unset).
  virtual bool read(GpuReading* out) = 0;
};

// The sensors of the GPU at PCI bus id `pci_bus_id` (cudaDeviceGetPCIBusId's form,
// "0000:3B:00.0"), or nullptr where NVML or that GPU cannot be opened.
std::unique_ptr<GpuSensors> open_gpu_sensors(const std::string& pci_bus_id);

// Calls `read` on a thread of its own about every millisecond from construction to stop() (or
// destruction) and appends what it read to `out` at stop(): the timing loop samples the GPU while
// a direction's timed calls run, so that reading adds nothing between the calls (a gap there
// would idle the GPU and could change its clock). The first read happens in the constructor, on
// the caller's thread (it may open the sensors); where it fails, no thread starts and nothing is
// appended.
class SensorSampler {
 public:
  SensorSampler(std::function<bool(GpuReading*)> read, std::vector<GpuReading>* out);
  SensorSampler(const SensorSampler&) = delete;
  SensorSampler& operator=(const SensorSampler&) = delete;
  ~SensorSampler() { stop(); }
  void stop();

 private:
  std::function<bool(GpuReading*)> read_;
  std::vector<GpuReading>* out_;
  std::vector<GpuReading> samples_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace verify
}  // namespace raggedattn

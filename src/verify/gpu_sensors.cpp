#include "verify/gpu_sensors.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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
using ReasonsFn = int (*)(NvmlDevice, unsigned long long*);
constexpr int kNvmlClockSm = 1;

// nvmlFieldValue_t and nvmlDeviceGetFieldValues, for the one field read: NVML_FI_DEV_POWER_INSTANT
// (milliwatts now; nvmlDeviceGetPowerUsage averages over about a second, longer than a
// direction's timed calls on the short workloads).
struct NvmlFieldValue {
  unsigned int field_id;
  unsigned int scope_id;
  long long timestamp;
  long long latency_usec;
  int value_type;  // nvmlValueType_t: 1 unsigned int, 2 unsigned long, 3 unsigned long long
  int nvml_return;
  union {
    double d;
    unsigned int ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
    int si;
    unsigned short us;
  } value;
};
static_assert(sizeof(NvmlFieldValue) == 40, "nvmlFieldValue_t's layout");
using FieldsFn = int (*)(NvmlDevice, int, NvmlFieldValue*);
constexpr unsigned int kNvmlFieldPowerInstant = 186;

class NvmlSensors final : public GpuSensors {
 public:
  // The library stays loaded for the process (never closed): NVML keeps its own state, and a
  // later open in the same process reuses it. `fields` and `reasons` may be null (an older
  // driver): the average power is read instead, and no reasons.
  NvmlSensors(NvmlDevice dev, ClockFn clock, PowerFn power, FieldsFn fields, ReasonsFn reasons)
      : dev_(dev), clock_(clock), power_(power), fields_(fields), reasons_(reasons) {}
  bool read(GpuReading* out) override {
    unsigned int mhz = 0;
    if (clock_(dev_, kNvmlClockSm, &mhz) != 0) return false;
    out->sm_mhz = int(mhz);
    double milliwatts = -1;
    if (fields_) {
      NvmlFieldValue f{};
      f.field_id = kNvmlFieldPowerInstant;
      if (fields_(dev_, 1, &f) == 0 && f.nvml_return == 0) {
        switch (f.value_type) {
          case 1:
            milliwatts = f.value.ui;
            break;
          case 2:
            milliwatts = double(f.value.ul);
            break;
          case 3:
            milliwatts = double(f.value.ull);
            break;
          default:
            break;
        }
      }
      if (milliwatts < 0) fields_ = nullptr;  // not reported here: the average from now on
    }
    out->instant_watts = milliwatts >= 0;
    if (milliwatts < 0) {
      unsigned int mw = 0;
      if (power_(dev_, &mw) != 0) return false;
      milliwatts = mw;
    }
    out->watts = milliwatts * 1e-3;
    unsigned long long bits = 0;
    out->slowdown = reasons_ && reasons_(dev_, &bits) == 0 ? uint64_t(bits) : 0;
    return true;
  }

 private:
  NvmlDevice dev_;
  ClockFn clock_;
  PowerFn power_;
  FieldsFn fields_;
  ReasonsFn reasons_;
};

}  // namespace

std::unique_ptr<GpuSensors> open_gpu_sensors(const std::string& pci_bus_id) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return nullptr;
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
  auto by_pci = reinterpret_cast<ByPciFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto clock = reinterpret_cast<ClockFn>(dlsym(lib, "nvmlDeviceGetClockInfo"));
  auto power = reinterpret_cast<PowerFn>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
  auto fields = reinterpret_cast<FieldsFn>(dlsym(lib, "nvmlDeviceGetFieldValues"));
  // The clock event reasons; drivers before 535 name them throttle reasons (same bits).
  auto reasons = reinterpret_cast<ReasonsFn>(dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"));
  if (!reasons) {
    reasons = reinterpret_cast<ReasonsFn>(dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons"));
  }
  NvmlDevice dev = nullptr;
  if (!init || !by_pci || !clock || !power || init() != 0 ||
      by_pci(pci_bus_id.c_str(), &dev) != 0) {
    return nullptr;
  }
  return std::make_unique<NvmlSensors>(dev, clock, power, fields, reasons);
}

std::string slowdown_names(uint64_t bits) {
  static const std::pair<uint64_t, const char*> kNames[] = {
      {kSlowdownPowerCap, "power cap"},
      {kSlowdownHw, "hw slowdown"},
      {kSlowdownSwThermal, "sw thermal"},
      {kSlowdownHwThermal, "hw thermal"},
      {kSlowdownHwPowerBrake, "hw power brake"}};
  std::string s;
  for (const auto& [bit, name] : kNames) {
    if (bits & bit) s += (s.empty() ? "" : "+") + std::string(name);
  }
  return s;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Sensed sensed(const std::vector<GpuReading>& rs, double flops, double median_ms) {
  Sensed s;
  if (rs.empty()) return s;
  std::vector<double> m, w;
  int throttled = 0;
  s.instant_watts = true;
  for (const GpuReading& r : rs) {
    m.push_back(r.sm_mhz);
    w.push_back(r.watts);
    s.instant_watts = s.instant_watts && r.instant_watts;
    const uint64_t bits = r.slowdown & kSlowdownThrottling;
    throttled += bits != 0;
    s.reasons |= bits;
  }
  const auto [lo, hi] = std::minmax_element(m.begin(), m.end());
  s.mhz_min = int(*lo);
  s.mhz_max = int(*hi);
  s.mhz = int(std::lround(median(m)));
  s.watts = median(w);
  s.throttled = double(throttled) / double(rs.size());
  s.pj_per_flop = flops > 0 ? s.watts * (median_ms * 1e-3) / flops * 1e12 : 0.0;
  return s;
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

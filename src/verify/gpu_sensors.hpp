// The GPU's SM clock and power draw, read in-process through NVML (libnvidia-ml, the driver's own
// library, opened at run time: no build dependency, and absent on a machine without the driver,
// where reading reports nothing). The timing loop reads them after each timed call, so a
// benchmark can tell a slower GPU from a slower kernel call by call (nvidia-smi's few samples a
// second over a whole process mostly see the GPU idle: docs/PERFORMANCE.md item 58).
#pragma once

#include <memory>
#include <string>

namespace raggedattn {
namespace verify {

struct GpuReading {
  int sm_mhz = 0;    // the SM clock now
  double watts = 0;  // the board's power draw (NVML averages it over about a second)
};

class GpuSensors {
 public:
  virtual ~GpuSensors() = default;
  // false where the reading failed (the values are then unset).
  virtual bool read(GpuReading* out) = 0;
};

// The sensors of the GPU at PCI bus id `pci_bus_id` (cudaDeviceGetPCIBusId's form,
// "0000:3B:00.0"), or nullptr where NVML or that GPU cannot be opened.
std::unique_ptr<GpuSensors> open_gpu_sensors(const std::string& pci_bus_id);

}  // namespace verify
}  // namespace raggedattn

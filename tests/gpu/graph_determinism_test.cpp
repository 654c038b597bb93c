// Properties that need the tensors in hand rather than a report: the deterministic backward is
// bitwise identical over 20 runs; forward + backward captured in a CUDA graph (no allocation,
// no host synchronization inside) replay to the same bytes as direct calls; and calls from a
// thread that has made no CUDA call yet (no current context) give the same bytes too.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_util.hpp"
#include "verify/case_spec.hpp"
#include "verify/host_data.hpp"
#include "verify/memory.hpp"

namespace raggedattn {
namespace {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x
#define RATTN_OK(x)                       \
  do {                                    \
    const Status _s = (x);                \
    ASSERT_TRUE(_s.ok()) << _s.message(); \
  } while (0)

struct DeviceTensor {
  void* ptr = nullptr;
  size_t bytes = 0;
  ~DeviceTensor() { cudaFree(ptr); }
};

// One case's device tensors, uploaded from fresh host data.
class Fixture : public ::testing::Test {
 protected:
  void Prepare(const verify::CaseSpec& spec) {
    const uint64_t seed = gpu_test::run_seed();
    layout_ = verify::make_layout(spec, seed);
    const Problem problem = verify::make_problem(spec, layout_);
    const Status s = make_plan(problem, query_device(-1), &plan_);
    ASSERT_TRUE(s.ok()) << s.message();
    inputs_ = verify::make_inputs(spec, layout_, seed + 1);
    outputs_ = verify::make_outputs(spec, layout_, spec.dtype);
    Upload(inputs_.q, &q_);
    Upload(inputs_.k, &k_);
    Upload(inputs_.v, &v_);
    Upload(inputs_.d_o, &do_);
    Upload(outputs_.o, &o_);
    Upload(outputs_.lse, &lse_);
    Upload(outputs_.dq, &dq_);
    Upload(outputs_.dk, &dk_);
    Upload(outputs_.dv, &dv_);
    UploadInts(layout_.cu_q, &cu_q_);
    UploadInts(layout_.cu_kv, &cu_kv_);
    UploadInts(layout_.off_q, &off_q_);
    UploadInts(layout_.off_kv, &off_kv_);
    // Each direction's workspace as the plan sizes it (the persistent Hopper forward keeps its
    // work counter in the forward's).
    ws_.bytes = plan_.workspace_bytes(Direction::Backward);
    CUDA_OK(cudaMalloc(&ws_.ptr, ws_.bytes));
    fwd_ws_.bytes = plan_.workspace_bytes(Direction::Forward);
    if (fwd_ws_.bytes > 0) {
      CUDA_OK(cudaMalloc(&fwd_ws_.ptr, fwd_ws_.bytes));
    }
  }
  void Upload(const verify::HostTensor& t, DeviceTensor* d) {
    d->bytes = t.bytes();
    CUDA_OK(cudaMalloc(&d->ptr, d->bytes));
    CUDA_OK(cudaMemcpy(d->ptr, t.data(), d->bytes, cudaMemcpyHostToDevice));
  }
  void UploadInts(const std::vector<int32_t>& v, DeviceTensor* d) {
    if (v.empty()) return;
    d->bytes = v.size() * sizeof(int32_t);
    CUDA_OK(cudaMalloc(&d->ptr, d->bytes));
    CUDA_OK(cudaMemcpy(d->ptr, v.data(), d->bytes, cudaMemcpyHostToDevice));
  }
  FwdTensors Fwd() const {
    return {q_.ptr,
            k_.ptr,
            v_.ptr,
            o_.ptr,
            static_cast<float*>(lse_.ptr),
            static_cast<const int32_t*>(cu_q_.ptr),
            static_cast<const int32_t*>(cu_kv_.ptr),
            static_cast<const int32_t*>(off_q_.ptr),
            static_cast<const int32_t*>(off_kv_.ptr),
            nullptr};
  }
  BwdTensors Bwd() const {
    return {q_.ptr,
            k_.ptr,
            v_.ptr,
            o_.ptr,
            do_.ptr,
            static_cast<const float*>(lse_.ptr),
            dq_.ptr,
            dk_.ptr,
            dv_.ptr,
            static_cast<const int32_t*>(cu_q_.ptr),
            static_cast<const int32_t*>(cu_kv_.ptr),
            static_cast<const int32_t*>(off_q_.ptr),
            static_cast<const int32_t*>(off_kv_.ptr),
            nullptr,
            nullptr,
            nullptr};
  }
  static std::vector<unsigned char> Download(const DeviceTensor& d) {
    std::vector<unsigned char> h(d.bytes);
    EXPECT_EQ(cudaMemcpy(h.data(), d.ptr, d.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void ReplaysToTheSameBytes(const verify::CaseSpec& spec);
  void Poison(const DeviceTensor& d) { ASSERT_EQ(cudaMemset(d.ptr, 0xFF, d.bytes), cudaSuccess); }

  // O, LSE, dQ, dK and dV: every output a forward and a backward write.
  using OutputBytes = std::vector<unsigned char>[5];
  // Forward and backward called directly on the default stream; their outputs downloaded.
  void RunDirect(OutputBytes& direct) {
    RATTN_OK(forward(plan_, Fwd(), fwd_ws_.ptr, fwd_ws_.bytes));
    RATTN_OK(backward(plan_, Bwd(), ws_.ptr, ws_.bytes));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (int t = 0; t < 5; ++t) direct[t] = Download(*results_[t]);
  }
  // Every output poisoned, the memsets done: they run on the legacy default stream, which a
  // non-blocking stream does not wait for, so they could otherwise land after a run's writes.
  void PoisonOutputs() {
    for (const DeviceTensor* t : results_) Poison(*t);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  // Every output the same bytes as the direct calls'; `when` names the run that wrote them.
  void ExpectDirectBytes(const OutputBytes& direct, const std::string& when) {
    for (int t = 0; t < 5; ++t) {
      std::vector<unsigned char> got = Download(*results_[t]);
      ASSERT_EQ(std::memcmp(got.data(), direct[t].data(), got.size()), 0)
          << "output " << t << " (O, LSE, dQ, dK, dV) differs " << when;
    }
  }

  verify::PackLayout layout_;
  Plan plan_;
  verify::HostInputs inputs_;
  verify::HostOutputs outputs_;
  DeviceTensor q_, k_, v_, do_, o_, lse_, dq_, dk_, dv_, cu_q_, cu_kv_, off_q_, off_kv_, ws_,
      fwd_ws_;
  const DeviceTensor* const results_[5] = {&o_, &lse_, &dq_, &dk_, &dv_};
};

Status cuda_status_of(cudaError_t e) {
  return e == cudaSuccess ? Status::Ok() : Status(RATTN_ERROR_CUDA, cudaGetErrorString(e));
}

// The CUDA paths this machine runs: the portable one, and the Hopper one on an sm_90 device.
std::vector<rattn_backend> cuda_paths() {
  std::vector<rattn_backend> b{RATTN_BACKEND_CUDA_PORTABLE};
  if (gpu_test::have_sm90()) b.push_back(RATTN_BACKEND_CUDA_SM90);
  return b;
}

verify::CaseSpec pack_case(rattn_backend backend, bool deterministic, rattn_dq_accum accum) {
  for (verify::CaseSpec s : verify::named_suite(32, 8)) {
    if (s.name != "pack_2044") continue;
    s.backend = backend;
    s.dtype = RATTN_DTYPE_BF16;
    s.deterministic = deterministic;
    s.dq_accum = accum;
    return s;
  }
  ADD_FAILURE() << "named suite has no pack_2044";
  return {};
}

TEST_F(Fixture, DeterministicBackwardIsBitwiseStableOver20Runs) {
  RATTN_REQUIRE_GPU();
  for (rattn_backend backend : cuda_paths())
    for (rattn_dq_accum accum : {RATTN_DQ_ACCUM_FP32, RATTN_DQ_ACCUM_BF16}) {
      Prepare(pack_case(backend, true, accum));
      RATTN_OK(forward(plan_, Fwd(), fwd_ws_.ptr, fwd_ws_.bytes));
      std::vector<unsigned char> first[3];
      for (int run = 0; run < 20; ++run) {
        Poison(dq_);
        Poison(dk_);
        Poison(dv_);
        RATTN_OK(backward(plan_, Bwd(), ws_.ptr, ws_.bytes));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const DeviceTensor* outs[3] = {&dq_, &dk_, &dv_};
        for (int t = 0; t < 3; ++t) {
          std::vector<unsigned char> got = Download(*outs[t]);
          if (run == 0) {
            first[t] = got;
          } else {
            ASSERT_EQ(std::memcmp(got.data(), first[t].data(), got.size()), 0)
                << "tensor "
                << (t == 0   ? "dQ"
                    : t == 1 ? "dK"
                             : "dV")
                << " differs in run " << run << " (dq_accum " << verify::dq_accum_str(accum)
                << ", path " << plan_.describe() << ")";
          }
        }
      }
    }
}

TEST_F(Fixture, GraphCaptureReplaysToTheSameBytes) {
  RATTN_REQUIRE_GPU();
  for (rattn_backend backend : cuda_paths()) {
    SCOPED_TRACE(verify::backend_str(backend));
    ReplaysToTheSameBytes(pack_case(backend, true, RATTN_DQ_ACCUM_FP32));
  }
}

// A framework's backward runs on a worker thread of its own, which may reach the library before
// making any CUDA call itself: the thread has no current context (the first backward of a
// PyTorch process whose autograd graph starts at the attention's output).
TEST_F(Fixture, CallsFromAThreadWithoutAContextGiveTheSameBytes) {
  RATTN_REQUIRE_GPU();
  for (rattn_backend backend : cuda_paths()) {
    SCOPED_TRACE(verify::backend_str(backend));
    Prepare(pack_case(backend, true, RATTN_DQ_ACCUM_FP32));
    OutputBytes direct;
    ASSERT_NO_FATAL_FAILURE(RunDirect(direct));
    ASSERT_NO_FATAL_FAILURE(PoisonOutputs());
    // Each direction on a fresh thread, which makes no CUDA call before the library's.
    Status f, b;
    std::thread([&] { f = forward(plan_, Fwd(), fwd_ws_.ptr, fwd_ws_.bytes); }).join();
    ASSERT_TRUE(f.ok()) << f.message();
    std::thread([&] {
      b = backward(plan_, Bwd(), ws_.ptr, ws_.bytes);
      if (b.ok()) b = cuda_status_of(cudaDeviceSynchronize());
    }).join();
    ASSERT_TRUE(b.ok()) << b.message();
    ASSERT_NO_FATAL_FAILURE(ExpectDirectBytes(direct, "when called from a fresh thread"));
  }
}

void Fixture::ReplaysToTheSameBytes(const verify::CaseSpec& spec) {
  Prepare(spec);
  OutputBytes direct;
  ASSERT_NO_FATAL_FAILURE(RunDirect(direct));

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status f = forward(plan_, Fwd(), fwd_ws_.ptr, fwd_ws_.bytes, stream);
  const Status b = backward(plan_, Bwd(), ws_.ptr, ws_.bytes, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(f.ok()) << f.message();
  ASSERT_TRUE(b.ok()) << b.message();
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    ASSERT_NO_FATAL_FAILURE(PoisonOutputs());  // synchronized: `stream` is non-blocking
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    ASSERT_NO_FATAL_FAILURE(
        ExpectDirectBytes(direct, "after graph replay " + std::to_string(replay)));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace raggedattn

// The timing loop's GPU readings (bench's clock and power while timing): the device's memory reads
// a plausible SM clock and power draw through NVML, which the driver ships.
TEST(GpuSensors, DeviceMemoryReadsTheSmClockAndPower) {
  RATTN_REQUIRE_GPU();
  auto mem = raggedattn::verify::device_memory();
  ASSERT_NE(mem, nullptr);
  raggedattn::verify::GpuReading g;
  ASSERT_TRUE(mem->read_sensors(&g)) << "NVML did not open or read the current device";
  EXPECT_GT(g.sm_mhz, 100);
  EXPECT_LT(g.sm_mhz, 5000);
  EXPECT_GT(g.watts, 1.0);
  EXPECT_LT(g.watts, 3000.0);
  // Reasons outside NVML's defined bits (0x1..0x100) would mean a misread value.
  EXPECT_EQ(g.slowdown & ~uint64_t(0x1ff), 0u) << g.slowdown;
}

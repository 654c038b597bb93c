// make_plan: validation, the path decision, tile shapes and the scratch layouts — each made once.
#include <cstdio>

#include "common/dtype.hpp"
#include "common/status.hpp"
#include "core/portable_shapes.hpp"
#include "core/sm90_shapes.hpp"
#include "core/tile_map.hpp"
#include "plan/plan_data.hpp"
#include "plan/policy.hpp"
#include "plan/validate.hpp"

namespace raggedattn {
namespace {

#ifdef RATTN_WITH_CUDA
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

#ifdef RATTN_WITH_SM90
constexpr bool kBuiltWithSm90 = true;
#else
constexpr bool kBuiltWithSm90 = false;
#endif

constexpr size_t kRegionAlign = 256;

Region take(size_t* cursor, size_t bytes) {
  Region r;
  r.offset = round_up(int64_t(*cursor), kRegionAlign);
  r.bytes = bytes;
  *cursor = r.offset + bytes;
  return r;
}

Status require_cuda(const char* what, const DeviceCaps& caps) {
  if (!kBuiltWithCuda) {
    return not_supported("make_plan", "backend ", what,
                         " requested, but this build of raggedattn has no CUDA backend "
                         "(configure with nvcc present); available: cpu");
  }
  if (!caps.cuda) {
    return not_supported("make_plan", "backend ", what,
                         " requested, but no CUDA device is available; available: cpu");
  }
  if (caps.cc_major < 8) {
    return not_supported("make_plan", "device ", caps.device, " has compute capability ",
                         caps.cc_major, ".", caps.cc_minor, "; the CUDA paths need 8.0 or newer");
  }
  return Status::Ok();
}

// The backward's scratch, sized from the launch shapes the path chose (d->bwd). The dQ layout made
// here is the one the main and the post kernels address; the lock count follows the main kernel's
// query tile.
void plan_bwd_workspace(PlanData* d) {
  const Problem& p = d->problem;
  BwdWorkspace& ws = d->bwd_ws;
  ws = BwdWorkspace{};
  const AccumType at = p.dq_accum == RATTN_DQ_ACCUM_FP32 ? AccumType::F32
                       : p.dtype == RATTN_DTYPE_FP16     ? AccumType::F16
                                                         : AccumType::BF16;
  // The Hopper backward stages each dQ tile in shared memory in its accumulators' order and
  // copies it out as one block (DqTileOrder::Wgmma64); the portable backward adds into the scratch
  // directly, in row order.
  const DqTileOrder order =
      d->bwd.family == KernelFamily::Wgmma ? DqTileOrder::Wgmma64 : DqTileOrder::Rows;
  ws.dq_accum = make_dq_accum_layout(DqSlotScheme::Compact, at, /*nsplits=*/1, p.batch,
                                     p.num_heads_q, p.head_dim_qk, p.total_q, p.max_seqlen_q,
                                     portable::kDqAccumAlign, order);
  size_t cursor = 0;
  ws.dq_accum_region = take(&cursor, size_t(ws.dq_accum.bytes()));
  ws.dpsum = take(&cursor, size_t(d->row_stats().elements(p.num_heads_q)) * sizeof(float));
  if (p.deterministic) {
    int64_t q_tiles = RaggedTiles::bound(p.total_q, p.batch, d->bwd.block_m);
    ws.locks = take(&cursor, size_t(q_tiles) * p.num_heads_q * sizeof(int32_t));
  } else if (d->bwd.inner_heads > 0) {
    // The Hopper backward outside deterministic mode (plan_sm90) takes its (key tile, KV head)
    // pairs segment by segment, the segments with the most work first (long segments have more
    // query steps than short ones; sm90/schedule.cuh): one entry per CTA of its grid.
    ws.schedule = take(&cursor, size_t(d->bwd.tiles) * d->bwd.inner_heads * sizeof(HeadTile));
    ws.interleave_rows = policy::bwd_interleave_rows(d->caps.l2_bytes, p.num_heads_q, p.head_dim_qk,
                                                     p.head_dim_v, int(ws.dq_accum.elem_bytes()));
    if (policy::bwd_dq_claimed(p.head_dim_qk, !d->bwd.dq_staged, p.deterministic != 0)) {
      // Cleared in 16-byte words, as the scratch would be.
      ws.dq_claims = take(&cursor, size_t(round_up(ws.dq_accum.tiles() * 4, 16)));
    }
  }
  ws.post_tiles = RaggedTiles::bound(p.total_q, p.batch, DqAccumLayout::kTileRows);
  if (p.has_sink) {
    ws.sink_partials = take(&cursor, size_t(ws.post_tiles) * p.num_heads_q * sizeof(float));
  }
  ws.total = round_up(int64_t(cursor), kRegionAlign);
}

// The forward's scratch: the Hopper forward's query-tile order and the persistent kernel's
// work-item counter; nothing for the portable forward.
void plan_fwd_workspace(PlanData* d) {
  FwdWorkspace& ws = d->fwd_ws;
  ws = FwdWorkspace{};
  size_t cursor = 0;
  if (d->fwd.family == KernelFamily::Wgmma) {
    ws.schedule = take(&cursor, size_t(d->fwd.tiles) * sizeof(TileCoord));
  }
  if (d->fwd.item_ctas > 0) ws.work_counter = take(&cursor, sizeof(unsigned long long));
  ws.total = round_up(int64_t(cursor), kRegionAlign);
}

// The portable path's launch shapes: every supported shape on sm80+, given the shared memory.
Status portable_shapes(PlanData* d) {
  const Problem& p = d->problem;
  if (p.dtype == RATTN_DTYPE_FP32) {
    return not_supported("make_plan",
                         "dtype fp32 on a CUDA path; CUDA paths take bf16 or fp16 "
                         "(fp32 runs on backend cpu)");
  }
  const int dqk = p.head_dim_qk, dv = p.head_dim_v;
  const portable::FwdConfig fc = portable::fwd_config(dqk, dv);
  const portable::BwdConfig bc = portable::bwd_config(dqk, dv);
  const size_t limit = size_t(d->caps.smem_per_block_optin);

  d->fwd.family = KernelFamily::MmaSync;
  d->bwd.family = KernelFamily::MmaSync;
  d->fwd.block_m = fc.block_m;
  d->fwd.block_n = fc.block_n;
  d->fwd.threads = fc.warps * 32;
  d->fwd.smem_bytes = portable::fwd_smem(dqk, dv).bytes;
  d->fwd.tiles = RaggedTiles::bound(p.total_q, p.batch, fc.block_m);

  d->bwd.block_m = bc.block_m;
  d->bwd.block_n = bc.block_n;
  d->bwd.threads = bc.warps * 32;
  d->bwd.stages = portable::bwd_smem(dqk, dv, 2).bytes <= limit ? 2 : 1;
  // dQ through shared memory and bulk reduce-adds where the sm_90 build runs (the kernel's sm_80
  // build adds from registers only), for the fp32 scratch in atomic mode, and only where it
  // leaves the stages as they are: atomics from registers stall each step on their source
  // registers.
  d->bwd.dq_staged = d->caps.cc_major == 9 && p.dq_accum == RATTN_DQ_ACCUM_FP32 &&
                     !p.deterministic &&
                     portable::bwd_smem(dqk, dv, d->bwd.stages, true).bytes <= limit;
  d->bwd.smem_bytes = portable::bwd_smem(dqk, dv, d->bwd.stages, d->bwd.dq_staged).bytes;
  d->bwd.tiles = RaggedTiles::bound(p.total_kv, p.batch, bc.block_n);

  for (const LaunchShape* s : {&d->fwd, &d->bwd}) {
    if (s->smem_bytes > limit) {
      return not_supported("make_plan", "head_dim_qk=", dqk, ", head_dim_v=", dv, " needs ",
                           s->smem_bytes,
                           " bytes of shared memory per block on the portable path; "
                           "device ",
                           d->caps.device, " allows ", limit);
    }
  }

  return Status::Ok();
}

Status plan_portable(PlanData* d) {
  RATTN_RETURN_IF_ERROR(portable_shapes(d));
  plan_fwd_workspace(d);
  plan_bwd_workspace(d);
  return Status::Ok();
}

// Why the Hopper path cannot take this problem, or "" where it can.
std::string sm90_refusal(const Problem& p, const DeviceCaps& caps) {
  if (!kBuiltWithSm90) {
    return "the Hopper path is not part of this build (it needs nvcc 12.0 or newer)";
  }
  if (!(caps.cc_major == 9 && caps.cc_minor == 0)) {
    return str_cat("the Hopper path needs an sm_90 device (H100, H200); device ", caps.device,
                   " has compute capability ", caps.cc_major, ".", caps.cc_minor);
  }
  if (p.dtype == RATTN_DTYPE_FP32) {
    return "the Hopper path takes bf16 or fp16 (fp32 runs on backend cpu)";
  }
  if (!sm90::path_supports(p.head_dim_qk, p.head_dim_v)) {
    return str_cat(
        "the Hopper path has kernels for head dims 64/64, 128/128, 256/256 and 192/128; "
        "given head_dim_qk=",
        p.head_dim_qk, ", head_dim_v=", p.head_dim_v, " (backend cuda_portable takes it)");
  }
  return "";
}

// The Hopper path: per direction, its wgmma kernel where it has one for the head dims
// (sm90::fwd_supports, sm90::bwd_supports) and the portable kernel otherwise; the forward also
// takes the portable kernel when `wgmma_forward` is false (it measured faster on short
// documents). The backward scratch of every path is sized from the backward shape chosen here.
Status plan_sm90(PlanData* d, bool wgmma_forward) {
  RATTN_RETURN_IF_ERROR(portable_shapes(d));  // dtype checks and the portable shapes
  const Problem& p = d->problem;
  d->path = Path::CudaSm90;
  // Forward tiles are query tiles (block_m rows), backward tiles key tiles (block_n rows).
  if (wgmma_forward && sm90::fwd_supports(p.head_dim_qk, p.head_dim_v)) {
    // The persistent kernel (one CTA per SM over all (query tile, head) items) where the items
    // are short, the grid kernel (one CTA per item) where they are long (policy::fwd_persistent);
    // each has its own buffers.
    const int64_t tiles = RaggedTiles::bound(p.total_q, p.batch,
                                             sm90::fwd_config(p.head_dim_qk, p.head_dim_v).block_m);
    const int64_t ctas = policy::fwd_ctas(
        d->caps.num_sms, tiles * p.num_heads_q,
        policy::fwd_persistent(
            p.head_dim_qk, p.head_dim_v, d->mask,
            policy::FwdDocs::of(p.total_q, p.total_kv, p.batch, p.max_seqlen_q, p.max_seqlen_kv)));
    const bool persistent = ctas > 0;
    const sm90::FwdConfig c = sm90::fwd_config(p.head_dim_qk, p.head_dim_v, persistent);
    d->fwd = LaunchShape{KernelFamily::Wgmma,
                         c.block_m,
                         c.block_n,
                         sm90::kFwdThreads,
                         c.stages,
                         sm90::fwd_smem(p.head_dim_qk, p.head_dim_v, persistent).bytes,
                         tiles};
    d->fwd.item_ctas = ctas;
    // The grid kernel: a query tile's GQA group launches together (the kernel takes grid_slot's).
    d->fwd.inner_heads = persistent ? 0 : p.num_heads_q / p.num_heads_kv;
  }
  if (sm90::bwd_supports(p.head_dim_qk, p.head_dim_v)) {
    // Each step's dQ through a shared-memory tile (bulk reduce-adds by warp 1) or from the
    // consumers' registers, with the stages that leaves (policy::bwd_dq_from_registers).
    const bool dq_regs = policy::bwd_dq_from_registers(
        p.head_dim_qk, p.head_dim_v, p.deterministic != 0, p.dq_accum == RATTN_DQ_ACCUM_FP32);
    const sm90::BwdConfig c = sm90::bwd_config(p.head_dim_qk, p.head_dim_v, dq_regs);
    d->bwd = LaunchShape{KernelFamily::Wgmma,
                         c.block_m,
                         c.block_n,
                         sm90::kBwdThreads,
                         c.stages,
                         sm90::bwd_smem(p.head_dim_qk, p.head_dim_v, dq_regs).bytes,
                         RaggedTiles::bound(p.total_kv, p.batch, c.block_n)};
    d->bwd.dq_staged = !dq_regs;
    // Outside deterministic mode the grid is the schedule's (key tile, KV head) entries, so its
    // longest-first order holds over every head (BwdWorkspace::schedule).
    d->bwd.inner_heads = p.deterministic ? 0 : p.num_heads_kv;
  }
  for (const LaunchShape* s : {&d->fwd, &d->bwd}) {
    if (s->smem_bytes > size_t(d->caps.smem_per_block_optin)) {
      return not_supported("make_plan", "the Hopper path needs ", s->smem_bytes,
                           " bytes of shared memory per block; device ", d->caps.device, " allows ",
                           d->caps.smem_per_block_optin);
    }
  }
  plan_fwd_workspace(d);
  plan_bwd_workspace(d);
  return Status::Ok();
}

Status choose_path(PlanData* d) {
  const Problem& p = d->problem;
  const DeviceCaps& caps = d->caps;
  switch (p.backend) {
    case RATTN_BACKEND_CPU:
      d->path = Path::Cpu;
      return Status::Ok();
    case RATTN_BACKEND_AUTO:
      if (!kBuiltWithCuda || !caps.cuda) {
        d->path = Path::Cpu;
        return Status::Ok();
      }
      [[fallthrough]];
    case RATTN_BACKEND_CUDA:
      // The best CUDA path for the problem: Hopper where it takes it (its forward only where
      // the segments are long enough, policy::kAutoMinSeqlenKv), portable otherwise.
      RATTN_RETURN_IF_ERROR(require_cuda("cuda", caps));
      if (sm90_refusal(p, caps).empty()) {
        return plan_sm90(d, p.max_seqlen_kv >= policy::kAutoMinSeqlenKv);
      }
      d->path = Path::CudaPortable;
      return plan_portable(d);
    case RATTN_BACKEND_CUDA_PORTABLE:
      RATTN_RETURN_IF_ERROR(require_cuda("cuda_portable", caps));
      d->path = Path::CudaPortable;
      return plan_portable(d);
    case RATTN_BACKEND_CUDA_SM90: {
      RATTN_RETURN_IF_ERROR(require_cuda("cuda_sm90", caps));
      const std::string why = sm90_refusal(p, caps);
      if (!why.empty()) {
        return not_supported("make_plan", "backend cuda_sm90 requested, but ", why,
                             "; available: cuda_portable, cpu");
      }
      return plan_sm90(d, /*wgmma_forward=*/true);
    }
  }
  return invalid_value("make_plan", "backend=", int(p.backend), " is not a backend");
}

// The main kernels' grids (LaunchShape::grid, as cuda::launch_kernel launches them) within CUDA's
// limits.
constexpr int64_t kMaxGridX = 2147483647, kMaxGridY = 65535;
Status check_grids(const PlanData& d) {
  if (d.path == Path::Cpu) return Status::Ok();
  const Problem& p = d.problem;
  const struct {
    const char* direction;
    const LaunchShape& shape;
    int heads;
  } launches[] = {{"forward", d.fwd, p.num_heads_q}, {"backward", d.bwd, p.num_heads_kv}};
  for (const auto& l : launches) {
    const LaunchShape::Grid g = l.shape.grid(l.heads);
    if (g.x > kMaxGridX || g.y > kMaxGridY) {
      return not_supported("make_plan", "the ", l.direction, " kernel's grid would be (", g.x, ", ",
                           g.y, ") CTAs (total tokens q=", p.total_q, ", kv=", p.total_kv,
                           ", num_heads_q=", p.num_heads_q, ", num_heads_kv=", p.num_heads_kv,
                           "); CUDA allows at most (", kMaxGridX, ", ", kMaxGridY, ")");
    }
  }
  return Status::Ok();
}

}  // namespace

bool built_with_cuda() {
  return kBuiltWithCuda;
}

bool path_in_build(Path path) {
  switch (path) {
    case Path::Cpu:
      return true;
    case Path::CudaPortable:
      return kBuiltWithCuda;
    case Path::CudaSm90:
      return kBuiltWithSm90;
  }
  return false;
}

const char* path_name(Path path) {
  switch (path) {
    case Path::Cpu:
      return "cpu";
    case Path::CudaPortable:
      return "cuda_portable";
    case Path::CudaSm90:
      return "cuda_sm90";
  }
  return "unknown";
}

Problem default_problem() {
  Problem p{};
  p.batch = 0;
  p.dtype = RATTN_DTYPE_BF16;
  p.softmax_scale = 0.f;
  p.softcap = 0.f;
  p.mask = RATTN_MASK_NONE;
  p.alignment = RATTN_ALIGN_TOP_LEFT;
  p.window_left = -1;
  p.window_right = -1;
  p.dq_accum = RATTN_DQ_ACCUM_FP32;
  p.deterministic = 0;
  p.backend = RATTN_BACKEND_AUTO;
  p.has_sink = 0;
  p.zero_padding = 0;
  return p;
}

DeviceCaps cpu_caps() {
  DeviceCaps c{};
  c.cuda = 0;
  c.device = -1;
  return c;
}

Status make_plan(const Problem& problem, const DeviceCaps& caps, Plan* plan) {
  if (!plan) return invalid_value("make_plan", "plan output pointer is null");
  auto d = std::make_shared<PlanData>();
  RATTN_RETURN_IF_ERROR(resolve_problem(problem, &d->problem));
  d->caps = caps;
  const Problem& p = d->problem;
  d->scale = p.softmax_scale;
  d->mask.left = p.window_left;
  d->mask.right = p.mask == RATTN_MASK_CAUSAL ? 0 : p.window_right;
  d->mask.bottom_right = p.alignment == RATTN_ALIGN_BOTTOM_RIGHT;
  RATTN_RETURN_IF_ERROR(choose_path(d.get()));
  RATTN_RETURN_IF_ERROR(check_grids(*d));
  *plan = Plan(std::move(d));
  return Status::Ok();
}

const Problem& Plan::problem() const {
  return data_->problem;
}
rattn_dtype Plan::dq_accum_dtype() const {
  switch (data_->bwd_ws.dq_accum.type) {
    case AccumType::BF16:
      return RATTN_DTYPE_BF16;
    case AccumType::F16:
      return RATTN_DTYPE_FP16;
    case AccumType::F32:
      break;
  }
  return RATTN_DTYPE_FP32;
}

Path Plan::path() const {
  return data_->path;
}

size_t Plan::workspace_bytes(Direction dir) const {
  return dir == Direction::Forward ? data_->fwd_ws.total : data_->bwd_ws.total;
}

std::string Plan::describe() const {
  const PlanData& d = *data_;
  const Problem& p = d.problem;
  std::string s = str_cat(path_name(d.path), " ", dtype_name(p.dtype), " Hq=", p.num_heads_q,
                          " Hkv=", p.num_heads_kv, " D=", p.head_dim_qk, "/", p.head_dim_v);
  if (d.path != Path::Cpu) {
    s += str_cat(
        " fwd[", kernel_family_name(d.fwd.family), " ", d.fwd.block_m, "x", d.fwd.block_n, " ",
        d.fwd.threads, "thr ", d.fwd.smem_bytes / 1024, "KiB",
        d.fwd.item_ctas > 0
            ? str_cat(" ", d.fwd.item_ctas, " CTAs over ", d.fwd.tiles * p.num_heads_q, " items")
            : "",
        "] bwd[", kernel_family_name(d.bwd.family), " ", d.bwd.block_m, "x", d.bwd.block_n, " ",
        d.bwd.threads, "thr ", d.bwd.smem_bytes / 1024, "KiB stages=", d.bwd.stages,
        d.bwd.dq_staged ? (d.bwd_ws.dq_claims.bytes ? " dQ staged, claimed" : " dQ staged")
        : d.bwd.family == KernelFamily::Wgmma ? " dQ from registers"
                                              : "",
        // The schedule's rule (BwdWorkspace::interleave_rows), which the device's L2 sets.
        d.bwd_ws.schedule.bytes
            ? str_cat(", heads interleaved to ", d.bwd_ws.interleave_rows, " rows")
            : "",
        "] dq_accum=",
        p.dq_accum == RATTN_DQ_ACCUM_FP32 ? "fp32"
                                          : (p.dtype == RATTN_DTYPE_FP16 ? "fp16" : "bf16"),
        p.deterministic ? " deterministic" : "");
  }
  if (p.has_sink) s += " sinks";
  if (p.zero_padding) s += " zero_padding";
  return s;
}

}  // namespace raggedattn

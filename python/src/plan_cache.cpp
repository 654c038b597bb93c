#include "plan_cache.hpp"

#include <array>
#include <cstdint>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace raggedattn_py {

Status Status::of(rattn_status code) {
  Status s;
  s.code = code;
  if (code != RATTN_SUCCESS) {
    s.message = rattn_last_error();
    if (s.message.empty()) s.message = std::string("raggedattn: ") + rattn_status_name(code);
  }
  return s;
}

Status Plan::adopt(rattn_plan* plan, std::shared_ptr<const Plan>* out) {
  std::shared_ptr<Plan> p(new Plan(plan));  // owns the plan from here on
  Status s = Status::of(rattn_plan_workspace_size(plan, RATTN_FORWARD, &p->fwd_workspace_));
  if (s.ok()) s = Status::of(rattn_plan_workspace_size(plan, RATTN_BACKWARD, &p->bwd_workspace_));
  if (s.ok()) *out = std::move(p);
  return s;
}

Plan::~Plan() {
  rattn_plan_destroy(plan_);
}

std::string Plan::describe() const {
  char buffer[512];
  Status s = Status::of(rattn_plan_describe(plan_, buffer, sizeof(buffer)));
  return s.ok() ? std::string(buffer) : s.message;
}

Status Plan::forward(const rattn_fwd_tensors& t, void* workspace, size_t workspace_bytes,
                     void* stream) const {
  return Status::of(rattn_forward(plan_, &t, workspace, workspace_bytes, stream));
}

Status Plan::backward(const rattn_bwd_tensors& t, void* workspace, size_t workspace_bytes,
                      void* stream) const {
  return Status::of(rattn_backward(plan_, &t, workspace, workspace_bytes, stream));
}

namespace {

// Every field of the problem, and the device, as integers: rattn_problem has padding bytes, so
// its raw bytes are no key.
constexpr size_t kKeyFields = 39;
using Key = std::array<int64_t, kKeyFields>;

int64_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return int64_t(u);
}

Key make_key(const rattn_problem& p, int device) {
  const bool cpu = p.backend == RATTN_BACKEND_CPU;
  return Key{p.batch,
             p.total_q,
             p.total_kv,
             p.max_seqlen_q,
             p.max_seqlen_kv,
             p.has_seq_offsets,
             p.num_heads_q,
             p.num_heads_kv,
             p.head_dim_qk,
             p.head_dim_v,
             int64_t(p.dtype),
             p.q.token,
             p.q.head,
             p.k.token,
             p.k.head,
             p.v.token,
             p.v.head,
             p.o.token,
             p.o.head,
             p.d_o.token,
             p.d_o.head,
             p.dq.token,
             p.dq.head,
             p.dk.token,
             p.dk.head,
             p.dv.token,
             p.dv.head,
             float_bits(p.softmax_scale),
             float_bits(p.softcap),
             int64_t(p.mask),
             int64_t(p.alignment),
             p.window_left,
             p.window_right,
             p.has_sink,
             int64_t(p.dq_accum),
             p.deterministic,
             int64_t(p.backend),
             p.zero_padding,
             cpu ? -1 : device};
}

struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t v : k) {
      h ^= uint64_t(v);
      h *= 1099511628211ull;
    }
    return size_t(h);
  }
};

// Least recently used plans go first: packed batches change total_q from step to step, so the
// number of distinct problems grows without bound in a long run.
constexpr size_t kCapacity = 4096;

class PlanCache {
 public:
  Status get(const rattn_problem& problem, int device, std::shared_ptr<const Plan>* out) {
    const Key key = make_key(problem, device);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      *out = it->second->second;
      return Status();
    }
    std::shared_ptr<const Plan> plan;
    Status s = create(problem, device, &plan);
    if (!s.ok()) return s;
    lru_.emplace_front(key, plan);
    index_[key] = lru_.begin();
    if (lru_.size() > kCapacity) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    *out = std::move(plan);
    return s;
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return lru_.size();
  }

  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    index_.clear();
    lru_.clear();
  }

 private:
  Status create(const rattn_problem& problem, int device, std::shared_ptr<const Plan>* out) {
    rattn_device_caps caps{};  // the CPU backend needs no device: cuda = 0
    caps.device = -1;
    if (problem.backend != RATTN_BACKEND_CPU) {
      Status s = device_caps(device, &caps);
      if (!s.ok()) return s;
    }
    rattn_plan* plan = nullptr;
    Status s = Status::of(rattn_plan_create(&problem, &caps, &plan));
    if (!s.ok()) return s;
    return Plan::adopt(plan, out);
  }

  // Device capabilities, queried once per device (the query is slow: it reads every property).
  Status device_caps(int device, rattn_device_caps* caps) {
    if (device < 0) return Status::of(rattn_query_device(-1, caps));  // current: may change
    auto it = caps_.find(device);
    if (it == caps_.end()) {
      Status s = Status::of(rattn_query_device(device, caps));
      if (!s.ok()) return s;
      it = caps_.emplace(device, *caps).first;
    }
    *caps = it->second;
    return Status();
  }

  std::mutex mutex_;
  std::list<std::pair<Key, std::shared_ptr<const Plan>>> lru_;
  std::unordered_map<Key, decltype(lru_)::iterator, KeyHash> index_;
  std::map<int, rattn_device_caps> caps_;
};

PlanCache& cache() {
  static PlanCache* instance = new PlanCache();  // never destroyed: used until interpreter exit
  return *instance;
}

}  // namespace

Status get_plan(const rattn_problem& problem, int device, std::shared_ptr<const Plan>* out) {
  return cache().get(problem, device, out);
}

size_t plan_cache_size() {
  return cache().size();
}
void clear_plan_cache() {
  cache().clear();
}

}  // namespace raggedattn_py

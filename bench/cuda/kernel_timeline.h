// Records the kernels a benchmark runs on the GPU, with their device timestamps, and the host's
// step calls on the same clock, into a CSV that bench/step_timeline.py reads: where a step's time
// goes inside its CUDA graph (overlaps from programmatic launches and the side stream, idle gaps,
// each kernel's exposed time) and around it (launch, sampling, copies, the host).
//
// Through CUPTI's activity API (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: one record per kernel, a
// graph's kernel nodes included, without serialising them; timestamps in cuptiGetTimestamp's
// nanoseconds). Nsight Systems, which reads the same records, is not on the lent GPU machines.
// libcupti is opened when a recorder starts (dlopen), so a program that records nothing does not
// need it: CUPTI's folder (the toolkit's lib64 or extras/CUPTI/lib64) must be on the loader's path
// only for a recording.
//
// CSV columns: kind,start_ns,end_ns,stream,graph_node,name
//   kind "kernel": start / end of one kernel, its stream id, graph node id (0 outside a graph)
//                  and demangled name;
//   kind "step":   the host's call of one step (start before it, end after it returned),
//                  stream and graph_node 0, name the label given to step().
// Only one recorder may run in a process (CUPTI's callbacks are process-wide).
#pragma once

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace moeserve::bench {

class KernelTimeline {
 public:
  // Starts recording kernels (throws if CUPTI refuses, e.g. another profiler holds it).
  KernelTimeline() {
    State& s = state();
    std::lock_guard lock(s.mutex);
    if (s.active) throw std::runtime_error("kernel timeline: a recorder is already running");
    const Cupti& c = cupti();
    check(c.register_callbacks(&buffer_requested, &buffer_completed), "cuptiActivityRegisterCallbacks");
    check(c.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
    s.active = true;
  }
  KernelTimeline(const KernelTimeline&) = delete;
  KernelTimeline& operator=(const KernelTimeline&) = delete;
  ~KernelTimeline() {
    if (state().active) finish();
  }

  // Runs fn() as one step: its host call is recorded on the kernels' clock.
  template <class Fn>
  void step(const std::string& label, Fn&& fn) {
    const uint64_t t0 = now();
    fn();
    const uint64_t t1 = now();
    std::lock_guard lock(state().mutex);
    state().rows.push_back({"step", t0, t1, 0, 0, label});
  }

  // Stops recording (flushing CUPTI's buffers; call after the GPU work is synchronised) and
  // writes the CSV. Returns the number of kernels recorded.
  size_t write_csv(const std::string& path) {
    finish();
    State& s = state();
    std::lock_guard lock(s.mutex);
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "w"), &std::fclose);
    if (!f) throw std::runtime_error("kernel timeline: cannot write " + path);
    std::fprintf(f.get(), "kind,start_ns,end_ns,stream,graph_node,name\n");
    size_t kernels = 0;
    for (const Row& r : s.rows) {
      std::string name = "\"";
      for (char c : r.name) name += c == '"' ? std::string("\"\"") : std::string(1, c);
      name += '"';
      std::fprintf(f.get(), "%s,%llu,%llu,%u,%llu,%s\n", r.kind, static_cast<unsigned long long>(r.start),
                   static_cast<unsigned long long>(r.end), r.stream, static_cast<unsigned long long>(r.graph_node),
                   name.c_str());
      kernels += r.kind[0] == 'k';
    }
    if (std::ferror(f.get())) throw std::runtime_error("kernel timeline: error writing " + path);
    return kernels;
  }

 private:
  struct Row {
    const char* kind;
    uint64_t start, end;
    uint32_t stream;
    uint64_t graph_node;
    std::string name;
  };
  struct State {
    std::mutex mutex;
    std::vector<Row> rows;
    bool active = false;
  };
  static State& state() {
    static State s;
    return s;
  }
  static constexpr size_t kBufferBytes = 8u << 20;

  // The CUPTI entry points used, from libcupti opened at the first recording.
  struct Cupti {
    decltype(&cuptiActivityRegisterCallbacks) register_callbacks;
    decltype(&cuptiActivityEnable) enable;
    decltype(&cuptiActivityDisable) disable;
    decltype(&cuptiActivityFlushAll) flush_all;
    decltype(&cuptiActivityGetNextRecord) next_record;
    decltype(&cuptiGetTimestamp) timestamp;
    decltype(&cuptiGetResultString) result_string;
  };
  static const Cupti& cupti() {
    static const Cupti c = [] {
      void* lib = nullptr;
      std::string tried;
      for (const char* name : {"libcupti.so.13", "libcupti.so.12", "libcupti.so"}) {
        if ((lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL))) break;
        tried += std::string(tried.empty() ? "" : "; ") + dlerror();
      }
      if (!lib)
        throw std::runtime_error("kernel timeline: cannot load CUPTI (" + tried +
                                 "): put the CUDA toolkit's CUPTI folder on LD_LIBRARY_PATH");
      auto sym = [&](const char* name) {
        void* f = dlsym(lib, name);
        if (!f) throw std::runtime_error(std::string("kernel timeline: libcupti has no ") + name);
        return f;
      };
      Cupti r;
      r.register_callbacks = reinterpret_cast<decltype(r.register_callbacks)>(sym("cuptiActivityRegisterCallbacks"));
      r.enable = reinterpret_cast<decltype(r.enable)>(sym("cuptiActivityEnable"));
      r.disable = reinterpret_cast<decltype(r.disable)>(sym("cuptiActivityDisable"));
      r.flush_all = reinterpret_cast<decltype(r.flush_all)>(sym("cuptiActivityFlushAll"));
      r.next_record = reinterpret_cast<decltype(r.next_record)>(sym("cuptiActivityGetNextRecord"));
      r.timestamp = reinterpret_cast<decltype(r.timestamp)>(sym("cuptiGetTimestamp"));
      r.result_string = reinterpret_cast<decltype(r.result_string)>(sym("cuptiGetResultString"));
      return r;
    }();
    return c;
  }

  static void check(CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return;
    const char* msg = nullptr;
    cupti().result_string(r, &msg);
    throw std::runtime_error(std::string("kernel timeline: ") + what + ": " + (msg ? msg : "unknown CUPTI error"));
  }
  static uint64_t now() {
    uint64_t t = 0;
    check(cupti().timestamp(&t), "cuptiGetTimestamp");
    return t;
  }
  void finish() {
    State& s = state();
    if (!s.active) return;
    check(cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    check(cupti().disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityDisable");
    s.active = false;
  }
  static std::string demangle(const char* name) {
    if (!name) return "?";
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
    return status == 0 && d ? std::string(d.get()) : std::string(name);
  }

  static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;  // as many as fit
  }
  static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    std::vector<Row> rows;
    CUpti_Activity* rec = nullptr;
    while (cupti().next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      rows.push_back({"kernel", k->start, k->end, k->streamId, k->graphNodeId, demangle(k->name)});
    }
    std::free(buffer);
    std::lock_guard lock(state().mutex);
    for (auto& r : rows) state().rows.push_back(std::move(r));
  }
};

}  // namespace moeserve::bench

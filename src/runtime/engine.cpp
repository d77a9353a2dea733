#include "runtime/engine.h"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/log.h"
#include "runtime/cache_plan.h"
#include "runtime/request_validation.h"
#include "runtime/scheduler.h"
#include "runtime/step_executor.h"

namespace moeserve::runtime {
namespace {

SchedulerConfig scheduler_config(const EngineConfig& config, const CachePlan& plan, int prefill_alignment) {
  SchedulerConfig s;
  s.prefill_alignment = prefill_alignment;
  s.max_num_seqs = config.max_num_seqs;
  s.max_num_batched_tokens = config.max_num_batched_tokens;
  s.kv_block_size = plan.kv_block_size;
  s.kv_admission_watermark = config.kv_admission_watermark;
  return s;
}

void check_engine_config(const EngineConfig& c) {
  MOESERVE_CHECK(c.max_num_seqs >= 1, "max_num_seqs must be at least 1, got {}", c.max_num_seqs);
  MOESERVE_CHECK(c.max_num_batched_tokens >= c.max_num_seqs,
                 "max_num_batched_tokens ({}) must be at least max_num_seqs ({}) so that every running sequence "
                 "decodes in each step",
                 c.max_num_batched_tokens, c.max_num_seqs);
  MOESERVE_CHECK(c.max_model_len >= 2, "max_model_len must be at least 2, got {}", c.max_model_len);
  MOESERVE_CHECK(c.kv_admission_watermark >= 0.0 && c.kv_admission_watermark < 1.0,
                 "kv_admission_watermark must be in [0, 1), got {}", c.kv_admission_watermark);
  MOESERVE_CHECK(c.max_waiting_requests >= 0, "max_waiting_requests must not be negative");
  MOESERVE_CHECK(c.max_logprobs >= 0, "max_logprobs must not be negative");
  MOESERVE_CHECK(c.sampler_threads >= 1, "sampler_threads must be at least 1, got {}", c.sampler_threads);
}

}  // namespace

struct Engine::Impl {
  // A final or intermediate output waiting to be handed to its callback.
  struct Delivery {
    Sequence* seq;
    RequestOutput output;
  };

  Impl(std::unique_ptr<model::CausalLM> m, EngineConfig c)
      : model(std::move(m)),
        config((check_engine_config(c), c)),
        model_config(model->config()),
        plan(plan_cache(model->cache_geometry(), config)),
        blocks(plan.num_kv_blocks),
        slots(plan.num_state_slots),
        scheduler(scheduler_config(config, plan, model->prefill_alignment()), blocks, slots),
        executor(*model, model_config.eos_token_ids, config.sampler_threads, config.device_sampling),
        seed_source(config.seed ? *config.seed : std::random_device{}()) {
    MOESERVE_CHECK(model_config.vocab_size > 0, "the model config has no vocabulary (vocab_size {})",
                   model_config.vocab_size);
    MOESERVE_CHECK(model_config.max_position_embeddings <= 0 ||
                       config.max_model_len <= model_config.max_position_embeddings,
                   "max_model_len {} exceeds the model's max_position_embeddings {}", config.max_model_len,
                   model_config.max_position_embeddings);
    model->allocate_caches(plan.num_kv_blocks, plan.num_state_slots);
    log::info("engine: {} KV blocks of {} tokens and {} state slots ({:.1f} MiB), max_num_seqs {}, "
              "max_num_batched_tokens {}, max_model_len {}",
              plan.num_kv_blocks, plan.kv_block_size, plan.num_state_slots, double(plan.bytes) / (1 << 20),
              config.max_num_seqs, config.max_num_batched_tokens, config.max_model_len);
    publish_stats_locked();
    thread = std::thread([this] { run(); });
  }

  void run();
  void step(std::vector<Delivery>& deliveries, std::vector<Sequence*>& finished);
  void finish(Sequence* seq, FinishReason why, std::string error, std::vector<Delivery>& deliveries,
              std::vector<Sequence*>& finished);
  void absorb(std::vector<std::unique_ptr<Sequence>>& arrived, std::vector<std::pair<uint64_t, FinishReason>>& cancels,
              std::vector<Delivery>& deliveries, std::vector<Sequence*>& finished);
  void collect_inputs(std::vector<Delivery>& deliveries, std::vector<Sequence*>& finished);
  void deliver(std::vector<Delivery>& deliveries);
  void flush(std::vector<Delivery>& deliveries, std::vector<Sequence*>& finished);
  void recover_from(const std::string& what, std::vector<Delivery>& deliveries, std::vector<Sequence*>& finished);
  void publish_stats_locked();
  void abort_everything(const std::string& why);

  std::unique_ptr<model::CausalLM> model;
  const EngineConfig config;
  const io::Qwen35Config model_config;
  const CachePlan plan;
  BlockManager blocks;
  StateSlotPool slots;
  Scheduler scheduler;
  StepExecutor executor;

  // Shared with submitting threads, under `mutex`.
  mutable std::mutex mutex;
  std::condition_variable wake;  // the engine thread waits for work
  std::condition_variable idle;  // drain() waits for outstanding == 0
  std::vector<std::unique_ptr<Sequence>> incoming;
  std::vector<std::pair<uint64_t, FinishReason>> cancels;
  Rng seed_source;
  uint64_t next_id = 1;
  int64_t outstanding = 0;  // submitted, final output not yet delivered
  bool draining = false;
  bool stopping = false;
  Stats stats;
  int queued_in_scheduler = 0;  // scheduler.waiting().size() at the latest step

  // The engine thread's own.
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> sequences;
  std::unordered_map<uint64_t, std::string> callback_failures;
  int64_t finished_total = 0;
  int64_t prompt_tokens_total = 0;
  int64_t generation_tokens_total = 0;
  int64_t num_steps = 0;
  int idle_steps = 0;
  std::thread thread;
};

void Engine::Impl::publish_stats_locked() {
  stats.running = int(scheduler.running().size());
  queued_in_scheduler = int(scheduler.waiting().size());
  stats.waiting = queued_in_scheduler + int(incoming.size());
  stats.total_kv_blocks = blocks.num_total();
  stats.free_kv_blocks = blocks.num_free();
  stats.kv_usage = blocks.num_total() > 0 ? double(blocks.num_used()) / blocks.num_total() : 0.0;
  stats.total_state_slots = slots.num_total();
  stats.free_state_slots = slots.num_free();
  stats.num_preemptions = scheduler.num_preemptions();
  stats.prompt_tokens_total = prompt_tokens_total;
  stats.generation_tokens_total = generation_tokens_total;
  stats.requests_finished_total = finished_total;
  stats.num_steps = num_steps;
  stats.kv_block_size = plan.kv_block_size;
}

void Engine::Impl::finish(Sequence* seq, FinishReason why, std::string error, std::vector<Delivery>& deliveries,
                          std::vector<Sequence*>& finished) {
  if (seq->status == SeqStatus::Finished) return;
  scheduler.remove(seq);  // frees its blocks and slot now, before any further forward
  RequestOutput out;
  out.request_id = seq->id;
  out.finish = why;
  out.error = std::move(error);
  out.num_prompt_tokens = seq->num_prompt_tokens;
  out.num_generated_tokens = seq->num_generated();
  deliveries.push_back({seq, std::move(out)});
  finished.push_back(seq);
}

// Queues new requests and applies cancellations (the requests' blocks and slots are freed
// right here, before the next forward).
void Engine::Impl::absorb(std::vector<std::unique_ptr<Sequence>>& arrived,
                          std::vector<std::pair<uint64_t, FinishReason>>& pending, std::vector<Delivery>& deliveries,
                          std::vector<Sequence*>& finished) {
  for (auto& seq : arrived) {
    scheduler.add(seq.get());
    const uint64_t id = seq->id;
    sequences.emplace(id, std::move(seq));
  }
  arrived.clear();
  for (const auto& [id, error] : callback_failures) pending.emplace_back(id, FinishReason::Abort);
  for (const auto& [id, why] : pending) {
    auto it = sequences.find(id);
    if (it == sequences.end()) continue;  // finished already, or never existed
    std::string error;
    if (auto f = callback_failures.find(id); f != callback_failures.end()) error = "output callback failed: " + f->second;
    finish(it->second.get(), why, std::move(error), deliveries, finished);
  }
  pending.clear();
  callback_failures.clear();
}

void Engine::Impl::collect_inputs(std::vector<Delivery>& deliveries, std::vector<Sequence*>& finished) {
  std::vector<std::unique_ptr<Sequence>> arrived;
  std::vector<std::pair<uint64_t, FinishReason>> pending;
  {
    std::lock_guard lock(mutex);
    arrived.swap(incoming);
    pending.swap(cancels);
  }
  absorb(arrived, pending, deliveries, finished);
}

void Engine::Impl::deliver(std::vector<Delivery>& deliveries) {
  for (Delivery& d : deliveries) {
    if (!d.seq->callback) continue;
    try {
      d.seq->callback(d.output);
    } catch (const std::exception& e) {
      if (d.output.finish == FinishReason::None) callback_failures.emplace(d.seq->id, e.what());
      log::error("engine: output callback of request {} threw: {}", d.seq->id, e.what());
    } catch (...) {
      if (d.output.finish == FinishReason::None) callback_failures.emplace(d.seq->id, "unknown exception");
      log::error("engine: output callback of request {} threw", d.seq->id);
    }
  }
  deliveries.clear();
}

void Engine::Impl::step(std::vector<Delivery>& deliveries, std::vector<Sequence*>& finished) {
  SchedulerOutput plan = scheduler.schedule();
  if (plan.empty()) {
    // Only possible right after preempting everything; admission resumes next step. Twice in a
    // row with nothing running means the queue front can never fit: fail it, do not spin.
    if (++idle_steps >= 2 && scheduler.running().empty() && !scheduler.waiting().empty()) {
      finish(scheduler.waiting().front(), FinishReason::Abort, "the request does not fit in the KV cache",
             deliveries, finished);
    }
    return;
  }
  idle_steps = 0;
  ++num_steps;
  for (const ScheduledChunk& chunk : plan.chunks) {
    if (!chunk.seq->admitted_once) {
      chunk.seq->admitted_once = true;
      prompt_tokens_total += chunk.seq->num_prompt_tokens;
    }
  }

  try {
    executor.forward(plan);
  } catch (const std::exception& e) {
    // The caches of every sequence in the step may be half-updated: fail them all.
    log::error("engine: step of {} sequences failed: {}", plan.chunks.size(), e.what());
    const std::string error = std::string("inference failed: ") + e.what();
    for (const ScheduledChunk& chunk : plan.chunks) finish(chunk.seq, FinishReason::Abort, error, deliveries, finished);
    return;
  }
  scheduler.complete(plan);
  std::vector<ChunkResult> results = executor.sample(plan);

  // Cancellations that arrived during the forward win over its tokens.
  collect_inputs(deliveries, finished);

  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    Sequence* seq = plan.chunks[i].seq;
    ChunkResult& result = results[i];
    if (seq->status == SeqStatus::Finished) continue;
    if (!result.error.empty()) {
      finish(seq, FinishReason::Abort, "sampling failed: " + result.error, deliveries, finished);
      continue;
    }
    if (!result.sample) continue;  // a prefill chunk short of the end
    const int32_t token = result.sample->token;
    seq->tokens.push_back(token);
    seq->history.add_output(token);
    ++generation_tokens_total;

    RequestOutput out;
    out.request_id = seq->id;
    out.new_tokens.push_back(token);
    if (result.sample->logprob) out.logprobs.push_back(std::move(*result.sample->logprob));
    if (!seq->first_output_sent && seq->params.prompt_logprobs >= 0) {
      out.prompt_logprobs = std::move(seq->prompt_logprobs);
      seq->prompt_logprobs.clear();
      out.prompt_logprobs.resize(size_t(seq->num_prompt_tokens));
    }
    seq->first_output_sent = true;
    out.finish = finish_reason_after(*seq, token, model_config.eos_token_ids, config.max_model_len, &out.stop_token);
    out.num_prompt_tokens = seq->num_prompt_tokens;
    out.num_generated_tokens = seq->num_generated();
    if (out.finish != FinishReason::None) {
      scheduler.remove(seq);
      finished.push_back(seq);
    }
    deliveries.push_back({seq, std::move(out)});
  }
}

void Engine::Impl::run() {
  std::vector<Delivery> deliveries;
  std::vector<Sequence*> finished;
  std::vector<std::unique_ptr<Sequence>> arrived;
  std::vector<std::pair<uint64_t, FinishReason>> pending;
  while (true) {
    {
      std::unique_lock lock(mutex);
      wake.wait(lock, [&] {
        return stopping || !incoming.empty() || !cancels.empty() || !sequences.empty() || !callback_failures.empty();
      });
      if (stopping) break;
      arrived.swap(incoming);
      pending.swap(cancels);
    }
    absorb(arrived, pending, deliveries, finished);
    // Cancelled requests hear about it before the next forward, with their blocks already free.
    flush(deliveries, finished);
    if (!sequences.empty()) {
      try {
        step(deliveries, finished);
      } catch (const std::exception& e) {
        recover_from(e.what(), deliveries, finished);
      }
    }
    flush(deliveries, finished);
  }
  abort_everything("the engine was stopped");
}

// A failure outside the model and the sampler (which step() handles per request) means the
// engine's own bookkeeping broke. Nothing it holds can be trusted: fail every request and
// rebuild the pools from scratch, so the engine keeps serving new ones.
void Engine::Impl::recover_from(const std::string& what, std::vector<Delivery>& deliveries,
                                std::vector<Sequence*>& finished) {
  log::error("engine: internal error, failing {} requests: {}", sequences.size(), what);
  const std::string error = "internal engine error: " + what;
  for (auto& [id, seq] : sequences) {
    if (seq->status == SeqStatus::Finished) continue;
    seq->status = SeqStatus::Finished;
    RequestOutput out;
    out.request_id = seq->id;
    out.finish = FinishReason::Abort;
    out.error = error;
    out.num_prompt_tokens = seq->num_prompt_tokens;
    out.num_generated_tokens = seq->num_generated();
    deliveries.push_back({seq.get(), std::move(out)});
    finished.push_back(seq.get());
  }
  scheduler.clear();
  blocks = BlockManager(blocks.num_total());
  slots = StateSlotPool(slots.num_total());
}

void Engine::Impl::flush(std::vector<Delivery>& deliveries, std::vector<Sequence*>& finished) {
  {
    // Published before the callbacks run, so a callback (or whoever it wakes) sees the
    // freed blocks and slots in stats().
    std::lock_guard lock(mutex);
    finished_total += int64_t(finished.size());
    publish_stats_locked();
  }
  deliver(deliveries);
  if (finished.empty()) return;
  for (Sequence* seq : finished) sequences.erase(seq->id);
  {
    std::lock_guard lock(mutex);
    outstanding -= int64_t(finished.size());
  }
  finished.clear();
  idle.notify_all();
}

void Engine::Impl::abort_everything(const std::string& why) {
  std::vector<Delivery> deliveries;
  std::vector<Sequence*> finished;
  std::vector<std::unique_ptr<Sequence>> arrived;
  {
    std::lock_guard lock(mutex);
    arrived.swap(incoming);
    cancels.clear();
  }
  std::vector<std::pair<uint64_t, FinishReason>> none;
  absorb(arrived, none, deliveries, finished);
  for (auto& [id, seq] : sequences) finish(seq.get(), FinishReason::Abort, why, deliveries, finished);
  flush(deliveries, finished);
}

Engine::Engine(std::unique_ptr<model::CausalLM> model, EngineConfig config) {
  MOESERVE_CHECK(model != nullptr, "Engine: no model");
  impl_ = std::make_unique<Impl>(std::move(model), std::move(config));
}

Engine::~Engine() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint64_t Engine::submit(std::vector<int32_t> prompt, SamplingParams params, OutputCallback callback) {
  validate_request(prompt, params, impl_->model_config.vocab_size, impl_->config);
  auto seq = std::make_unique<Sequence>();
  seq->num_prompt_tokens = int(prompt.size());
  seq->tokens = std::move(prompt);
  seq->tokens.reserve(size_t(seq->num_prompt_tokens) + size_t(params.max_tokens));
  seq->history.set_prompt(seq->tokens);
  seq->params = std::move(params);
  if (seq->params.constraint) seq->constraint = seq->params.constraint->start();
  seq->callback = std::move(callback);
  uint64_t id;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopping || impl_->draining) throw EngineOverloaded("the server is shutting down");
    const int max_waiting = impl_->config.max_waiting_requests;
    if (max_waiting > 0 && impl_->queued_in_scheduler + int(impl_->incoming.size()) >= max_waiting) {
      throw EngineOverloaded(fmt::format("too many requests are waiting ({}); retry later", max_waiting));
    }
    id = impl_->next_id++;
    seq->id = id;
    seq->rng.reseed(seq->params.seed ? *seq->params.seed : impl_->seed_source.next_u64());
    impl_->incoming.push_back(std::move(seq));
    ++impl_->outstanding;
  }
  impl_->wake.notify_one();
  return id;
}

void Engine::cancel(uint64_t request_id, FinishReason why) {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->cancels.emplace_back(request_id, why == FinishReason::None ? FinishReason::Abort : why);
  }
  impl_->wake.notify_one();
}

void Engine::drain() {
  std::unique_lock lock(impl_->mutex);
  impl_->draining = true;
  impl_->idle.wait(lock, [&] { return impl_->outstanding == 0; });
}

Engine::Stats Engine::stats() const {
  std::lock_guard lock(impl_->mutex);
  Stats s = impl_->stats;
  s.waiting = impl_->queued_in_scheduler + int(impl_->incoming.size());
  return s;
}

const io::Qwen35Config& Engine::model_config() const { return impl_->model_config; }
const EngineConfig& Engine::config() const { return impl_->config; }

}  // namespace moeserve::runtime

// moeserve inspect MODEL_DIR: architecture, weight formats and sizes, bytes per decoded token
// (src/tools/inspect.h).
#include <memory>

#include "cli/command.h"
#include "tools/inspect.h"

namespace {

moeserve::cli::Registrar reg{
    "inspect", "Show a checkpoint's architecture, weight formats, sizes and bytes read per decoded token",
    [](CLI::App& app) {
      auto o = std::make_shared<moeserve::tools::InspectOptions>();
      app.add_option("model_dir", o->model_dir,
                     "Model directory (config.json + safetensors); with --config-only a config.json or its directory")
          ->required();
      app.add_flag("--config-only", o->config_only,
                   "Count the official BF16 layout of config.json instead of reading weights");
      app.add_option("--weights", o->weights,
                     "Count the weights as `moeserve convert --weights` would write them: gptq-int4, fp8-block, "
                     "hybrid-int4-fp8");
      app.add_option("--group-size", o->group_size, "INT4 group size of a planned conversion")->capture_default_str();
      app.add_flag("--int8-lm-head", o->int8_lm_head,
                   "Count a BF16 LM head as INT8 row-wise (what serve --int8-lm-head reads per token)");
      app.add_flag("--json", o->json, "Print JSON instead of text");
      app.add_flag("--tensors", o->list_tensors, "Also list every weight with its format, shape and bytes");
      app.add_option("--device", o->device, "Accepted like every subcommand; inspect runs on the CPU")
          ->check(CLI::IsMember({"cpu", "cuda"}))
          ->capture_default_str();
      app.add_option("--threads", o->threads, "Accepted like every subcommand; unused")->capture_default_str();
      return [o] { return moeserve::tools::run_inspect(*o); };
    }};

}  // namespace

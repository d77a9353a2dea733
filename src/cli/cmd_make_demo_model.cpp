// moeserve make-demo-model: writes the bundled demo checkpoint (src/tools/demo_model.h).
#include <memory>

#include "cli/command.h"
#include "core/log.h"
#include "tools/demo_model.h"

namespace {

struct MakeDemoModelArgs {
  moeserve::tools::DemoModelOptions options;
  std::string out_dir, tokenizer_dir = "third_party/tokenizers/qwen3", chat_template;
  std::string expert_layout = "fused";
};

moeserve::cli::Registrar reg{
    "make-demo-model", "Write a small random-weight Qwen3.5-MoE checkpoint (deterministic) for demos and tests",
    [](CLI::App& app) {
      auto a = std::make_shared<MakeDemoModelArgs>();
      app.add_option("DIR", a->out_dir, "Output model directory")->required();
      app.add_option("--seed", a->options.seed, "Weights seed (same seed, same bytes)")->capture_default_str();
      app.add_option("--tokenizer", a->tokenizer_dir, "Directory with tokenizer.json and tokenizer_config.json")
          ->capture_default_str();
      app.add_option("--size", a->options.size, "tiny (hidden 64, 4 layers) or small (hidden 128, 8 layers)")
          ->check(CLI::IsMember(moeserve::tools::demo_model_size_names()))
          ->capture_default_str();
      app.add_option("--chat-template", a->chat_template,
                     "Jinja chat template file (default: the tokenizer_config.json's)")
          ->check(CLI::ExistingFile);
      app.add_option("--expert-layout", a->expert_layout,
                     "fused (experts.gate_up_proj, as official BF16 releases) or per-expert")
          ->check(CLI::IsMember({"fused", "per-expert"}))
          ->capture_default_str();
      app.add_flag("--overwrite", a->options.overwrite, "Replace DIR if it exists");
      return [a] {
        auto o = a->options;
        o.out_dir = a->out_dir;
        o.tokenizer_dir = a->tokenizer_dir;
        o.chat_template = a->chat_template;
        o.expert_layout = a->expert_layout == "fused" ? moeserve::tools::ExpertLayout::Fused
                                                      : moeserve::tools::ExpertLayout::PerExpert;
        moeserve::tools::write_demo_model(o);
        moeserve::log::info("wrote the {} demo model (seed {}) to {}", o.size, o.seed, a->out_dir);
        return 0;
      };
    }};

}  // namespace

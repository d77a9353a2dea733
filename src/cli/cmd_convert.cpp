// moeserve convert SRC DST: quantise, combine and re-shard checkpoints (src/tools/convert.h).
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "tools/convert.h"

namespace {

struct ConvertArgs {
  moeserve::tools::ConvertOptions options;
  std::vector<std::string> paths;
  std::string modules;
  bool no_progress = false;
};

moeserve::cli::Registrar reg{
    "convert",
    "Quantise (GPTQ INT4, FP8 block, hybrid), combine donors, add MTP weights, or re-shard a checkpoint",
    [](CLI::App& app) {
      auto a = std::make_shared<ConvertArgs>();
      auto& o = a->options;
      app.add_option("paths", a->paths,
                     "SRC DST (with --hybrid-experts-from/--hybrid-dense-from: only DST)")
          ->required()
          ->expected(1, 2);
      app.add_option("--weights", o.weights, "keep | gptq-int4 | fp8-block | hybrid-int4-fp8")->capture_default_str();
      app.add_option("--modules", a->modules,
                     "gptq-int4/fp8-block: quantise the Linear modules whose canonical name matches this regex "
                     "(e.g. 'mlp\\.experts' or 'self_attn') instead of the default set");
      app.add_option("--group-size", o.group_size, "INT4 group size along the input features")->capture_default_str();
      app.add_option("--hybrid-experts-from", o.hybrid_experts_from,
                     "Hybrid from donors: the INT4 checkpoint that gives the routed experts");
      app.add_option("--hybrid-dense-from", o.hybrid_dense_from,
                     "Hybrid from donors: the FP8 checkpoint that gives everything else (and the non-weight files)");
      app.add_option("--add-mtp-from", o.add_mtp_from, "Copy the mtp.* tensors of this checkpoint into the output");
      app.add_option("--max-shard-size", o.max_shard_size, "Largest shard, e.g. 5GB, 200MB, 200KB (decimal units)")
          ->capture_default_str();
      app.add_flag("--force", o.force, "Replace DST if it exists (only once the new checkpoint is complete)");
      app.add_option("--threads", o.threads, "Quantisation threads (0: all)")->capture_default_str();
      app.add_flag("--no-progress", a->no_progress, "No progress bar");
      return [a] {
        auto o = a->options;
        if (a->paths.size() == 2) {
          o.src = a->paths[0];
          o.dst = a->paths[1];
        } else {
          o.dst = a->paths[0];
          if (o.hybrid_experts_from.empty() && o.hybrid_dense_from.empty())
            moeserve::fail("convert needs SRC and DST (or only DST with --hybrid-experts-from/--hybrid-dense-from)");
        }
        if (!a->modules.empty()) o.modules = a->modules;
        if (a->no_progress) o.progress = moeserve::tools::ProgressBar::Mode::Off;
        moeserve::tools::run_convert(o);
        return 0;
      };
    }};

}  // namespace

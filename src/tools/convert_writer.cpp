#include "tools/convert_writer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "quant/quantize_fp8_block.h"
#include "quant/quantize_gptq_int4.h"

namespace moeserve::tools {

namespace {

constexpr uint64_t kCopyChunk = uint64_t(64) << 20;

// Drops the whole pages inside [p, p + n) from this process's view of a read-only file mapping
// (they stay in the page cache; a later access reads them again), so a long conversion does not
// accumulate the whole checkpoint in its resident set.
void release_source_pages(const std::byte* p, uint64_t n) {
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (uintptr_t(p) + page - 1) / page * page, end = (uintptr_t(p) + n) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

const std::byte* source_bytes(const PlanItem& item) {
  const Tensor& view = item.source->view;
  MOESERVE_CHECK(view.defined() || item.source_bytes == 0, "tensor '{}' ({}) has no data to convert",
                 item.source->name, item.source->origin);
  return view.bytes() + item.source_offset;
}

// Source rows [r0, r0 + rows) of the item's [N, K] slab, converted to fp32.
void rows_to_f32(const PlanItem& item, const std::byte* base, int64_t r0, int64_t rows, int64_t k0, int64_t width,
                 float* out, ThreadPool* pool) {
  const DType t = item.source->dtype();
  const size_t esize = dtype_size(t);
  auto convert = [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      convert_to_f32(t, base + size_t((r0 + r) * item.cols + k0) * esize, out + r * width, size_t(width));
  };
  if (pool)
    pool->parallel_for(rows, convert, 16);
  else
    convert(0, rows);
}

void copy_item(const PlanItem& item, io::SafetensorsWriter& writer) {
  const std::byte* p = source_bytes(item);
  const std::string& name = item.outputs.at(0).name;
  for (uint64_t done = 0; done < item.source_bytes;) {
    const uint64_t n = std::min(kCopyChunk, item.source_bytes - done);
    writer.write_tensor(name, p + done, size_t(n));
    release_source_pages(p + done, n);  // a large tensor never becomes resident as a whole
    done += n;
  }
  if (item.source_bytes == 0) writer.write_tensor(name, nullptr, 0);
}

// qweight group by group, then qzeros and scales (outputs in the plan's order).
void gptq_item(const PlanItem& item, int64_t g, io::SafetensorsWriter& writer, ThreadPool* pool) {
  const int64_t N = item.rows, K = item.cols, groups = K / g;
  const std::byte* base = source_bytes(item);
  std::vector<float> slab(size_t(N * g));
  std::vector<int32_t> qweight_rows(size_t(g / 8 * N));
  std::vector<uint16_t> scales(size_t(groups * N));
  for (int64_t j = 0; j < groups; ++j) {
    rows_to_f32(item, base, 0, N, j * g, g, slab.data(), pool);
    quant::quantize_gptq_int4_group(slab.data(), N, g, qweight_rows.data(), scales.data() + j * N, item.module, j * g,
                                    pool);
    writer.write_tensor(item.outputs[0].name, qweight_rows.data(), qweight_rows.size() * sizeof(int32_t));
  }
  const std::vector<int32_t> qzeros(size_t(groups * N / 8), quant::kGptqSymZerosWord);
  writer.write_tensor(item.outputs[1].name, qzeros.data(), qzeros.size() * sizeof(int32_t));
  writer.write_tensor(item.outputs[2].name, scales.data(), scales.size() * sizeof(uint16_t));
}

// weight one row of blocks at a time, then weight_scale_inv.
void fp8_item(const PlanItem& item, io::SafetensorsWriter& writer, ThreadPool* pool) {
  const int64_t N = item.rows, K = item.cols, col_blocks = quant::fp8_block_count(K);
  const std::byte* base = source_bytes(item);
  std::vector<float> rows(size_t(quant::kFp8BlockEdge * K));
  std::vector<uint8_t> codes(rows.size());
  std::vector<float> scales(size_t(quant::fp8_block_count(N) * col_blocks));
  for (int64_t r0 = 0, i = 0; r0 < N; r0 += quant::kFp8BlockEdge, ++i) {
    const int64_t n = std::min(quant::kFp8BlockEdge, N - r0);
    rows_to_f32(item, base, r0, n, 0, K, rows.data(), pool);
    quant::quantize_fp8_block_rows(rows.data(), n, K, codes.data(), scales.data() + i * col_blocks, item.module, r0,
                                   pool);
    writer.write_tensor(item.outputs[0].name, codes.data(), size_t(n * K));
  }
  writer.write_tensor(item.outputs[1].name, scales.data(), scales.size() * sizeof(float));
}

}  // namespace

void write_shards(const ConvertPlan& plan, const std::vector<Shard>& shards, const std::filesystem::path& dir,
                  const WriteOptions& options) {
  uint64_t processed = 0;
  for (const Shard& shard : shards) {
    std::vector<io::SafetensorsWriter::Declaration> decl;
    for (size_t i : shard.items)
      for (const OutputTensor& o : plan.items[i].outputs) decl.push_back({o.name, {o.dtype, o.shape}});
    io::SafetensorsWriter writer(dir / shard.file_name, std::move(decl), {{"format", "pt"}});
    for (size_t i : shard.items) {
      const PlanItem& item = plan.items[i];
      switch (item.action) {
        case PlanItem::Action::Copy: copy_item(item, writer); break;
        case PlanItem::Action::GptqInt4: gptq_item(item, options.group_size, writer, options.pool); break;
        case PlanItem::Action::Fp8Block: fp8_item(item, writer, options.pool); break;
      }
      if (item.source_bytes > 0) release_source_pages(source_bytes(item), item.source_bytes);
      processed += item.source_bytes;
      if (options.on_progress) options.on_progress(processed);
    }
    writer.finish();
  }
}

}  // namespace moeserve::tools

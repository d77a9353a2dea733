#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

using namespace moeserve;

TEST(DType, NamesRoundTrip) {
  for (auto t : {DType::BF16, DType::F16, DType::F32, DType::F8_E4M3, DType::I32, DType::I8,
                 DType::U8, DType::I64}) {
    auto parsed = parse_dtype(dtype_name(t));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_FALSE(parse_dtype("F4").has_value());
  EXPECT_EQ(dtype_size(DType::F8_E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
}

TEST(DType, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), uint16_t(h)) << "h=" << h;
  }
}

TEST(DType, Fp8E4M3KnownValues) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  for (int c = 0; c < 256; ++c) {
    const float f = fp8_e4m3_to_f32(uint8_t(c));
    if (std::isnan(f) || (c == 0x80)) continue;  // -0 encodes as 0x80
    ASSERT_EQ(f32_to_fp8_e4m3(f), uint8_t(c)) << "c=" << c;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(1000.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-1000.0f), 0xfe);
}

TEST(Tensor, SliceAndIndexAreViews) {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[size_t(i)] = float(i);
  Tensor t = Tensor::from_f32(v, {2, 3, 4});
  Tensor e1 = t.index0(1);
  ASSERT_EQ(e1.shape(), (Shape{3, 4}));
  EXPECT_EQ(e1.data<float>()[0], 12.0f);
  Tensor rows = e1.slice0(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 4}));
  EXPECT_EQ(rows.data<float>()[0], 16.0f);
  EXPECT_THROW(t.slice0(1, 3), std::runtime_error);
}

TEST(ThreadPool, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    std::vector<int> hits(1000, 0);
    for (int rep = 0; rep < 20; ++rep)
      pool.parallel_for(1000, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
    for (int h : hits) ASSERT_EQ(h, 20);
  }
}

TEST(ThreadPool, PropagatesExceptions) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100, [](int64_t b, int64_t) {
    if (b > 0) throw std::runtime_error("boom");
  }), std::runtime_error);
  // The pool stays usable.
  int64_t sum = 0;
  std::mutex m;
  pool.parallel_for(10, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> l(m);
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum, 45);
}

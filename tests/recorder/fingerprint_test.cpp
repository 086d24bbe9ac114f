// Fingerprints: of recorded tensors against an independent computation from
// their bytes, of strided tensors against their contiguous copies, of the
// SIMD kernels against the portable loops, and of derived views against
// computed ones.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "diff/trace_alignment.h"
#include "formats/bundle_reader.h"
#include "formats/trace.h"
#include "recorder/fingerprint.h"
#include "recorder/hooks/tensor_adapter.h"
#include "tests/recorder/tiny_recording.h"
#include "tests/testing/test_util.h"
#include "xxhash.h"

namespace moerr::recorder {
namespace {

using formats::testing::TempDir;
using testing::RecordSteps;

// Every recorded tensor's fingerprint equals one computed independently, with
// ATen reductions and xxHash, from the bytes stored in a full-mode bundle:
// exactly, but for the float rounding of mean and L2.
TEST(RecorderTest, FingerprintsMatchAnIndependentComputation) {
  TempDir dir;
  auto reader = RecordSteps(dir.File("full.moerr"), CaptureMode::kFull, 1);
  const formats::Trace trace = formats::ReadTrace(*reader, 0).value();
  int checked = 0;
  for (const formats::TensorMeta& meta : trace.tensors) {
    if (meta.leaf.empty()) continue;
    const formats::OwnedTensor owned = reader->ReadTensor(meta.leaf, 0).value();
    const at::Tensor t = ToTensor(owned.view()).to(at::kDouble);
    const formats::Fingerprint& f = meta.fingerprint;
    SCOPED_TRACE(meta.leaf);
    ASSERT_EQ(f.numel, static_cast<uint64_t>(t.numel()));
    EXPECT_EQ(f.hash, owned.bytes.empty() ? 0 : XXH3_64bits(owned.bytes.data(), owned.bytes.size()));
    if (t.numel() == 0) continue;
    const at::Tensor finite = t.masked_select(t.isfinite());
    EXPECT_EQ(f.nan, t.isnan().sum().item<int64_t>());
    EXPECT_EQ(f.pos_inf, t.isposinf().sum().item<int64_t>());
    EXPECT_EQ(f.neg_inf, t.isneginf().sum().item<int64_t>());
    EXPECT_EQ(f.beyond_f16, finite.abs().gt(65504.0).sum().item<int64_t>());
    const at::Tensor not_nan = t.masked_select(t.isnan().logical_not());
    if (not_nan.numel() > 0) {
      EXPECT_EQ(f.min, not_nan.min().item<double>());
      EXPECT_EQ(f.max, not_nan.max().item<double>());
    }
    if (finite.numel() > 0) {
      EXPECT_EQ(f.abs_max, finite.abs().max().item<double>());
      // Sums are reduced in float within 256-element chunks (fingerprint.cpp).
      EXPECT_NEAR(f.mean, finite.mean().item<double>(), 1e-5 * (1e-3 + finite.abs().mean().item<double>()));
      EXPECT_NEAR(f.l2, finite.norm().item<double>(), 1e-5 * (1e-3 + f.l2));
    }
    ++checked;
  }
  EXPECT_GT(checked, 1000);
}

// Strided tensors (transposed, expanded, sliced; larger than a block, with
// NaN and Inf) are fingerprinted from their elements in row-major order: the
// same fingerprint as their contiguous copy, the hash of its bytes.
// A tensor whose storage holds no memory yet (a functional collective's
// pending result) gets its numel and every field unknown, not a crash.
TEST(RecorderTest, UnreadableBytesGiveAnUnknownFingerprint) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 16, c10::DataPtr(nullptr, c10::Device(c10::kCPU)), nullptr,
                     false);
  at::Tensor pending = at::empty({0}, at::kFloat);
  pending.set_(empty, 0, {4}, {1});
  EXPECT_FALSE(BytesReadable(pending));
  const formats::Fingerprint f = ComputeFingerprint(pending);
  EXPECT_EQ(f.numel, 4u);
  EXPECT_FALSE(f.Known(formats::Fingerprint::kHash));
  EXPECT_FALSE(f.Known(formats::Fingerprint::kAbsMax));
  EXPECT_FALSE(BytesReadable(at::empty({4}, at::TensorOptions().device(at::kMeta))));
  EXPECT_TRUE(BytesReadable(at::ones({4})));
  EXPECT_TRUE(ComputeFingerprint(at::ones({4})).Known(formats::Fingerprint::kHash));
}

TEST(RecorderTest, StridedFingerprintsEqualTheirContiguousCopies) {
  torch::manual_seed(3);
  at::Tensor big = torch::randn({3, 40000});
  big[1][7] = NAN;
  big[2][39999] = INFINITY;
  for (const at::Tensor& t : {big.t(), big.t().to(at::kBFloat16), big.narrow(1, 5, 30000), big.select(1, 2),
                              torch::randn({1, 5}).expand({9000, 5}), big.slice(1, 0, 40000, 3)}) {
    ASSERT_FALSE(t.is_contiguous());
    const at::Tensor c = t.contiguous();
    const formats::Fingerprint a = ComputeFingerprint(t), b = ComputeFingerprint(c);
    SCOPED_TRACE(t.sizes());
    EXPECT_EQ(a.hash, XXH3_64bits(c.data_ptr(), c.numel() * c.element_size()));
    EXPECT_EQ(a.hash, b.hash);
    EXPECT_EQ(a.numel, b.numel);
    EXPECT_EQ(a.min, b.min);
    EXPECT_EQ(a.max, b.max);
    EXPECT_EQ(a.mean, b.mean);
    EXPECT_EQ(a.l2, b.l2);
    EXPECT_EQ(a.abs_max, b.abs_max);
    EXPECT_EQ(a.nan, b.nan);
    EXPECT_EQ(a.pos_inf, b.pos_inf);
    EXPECT_EQ(a.beyond_f16, b.beyond_f16);
  }
}

// The AVX2 kernels and the portable loops give the same fingerprint, to the
// bit (a bundle recorded on one machine is replayed on another): every float
// dtype, lengths that are not a multiple of the 8 lanes, values past f16
// range, NaN and Inf (which send a chunk down the careful path), and a
// transposed view (gathered in blocks).
TEST(RecorderTest, SimdFingerprintsEqualPortableOnes) {
  SetFingerprintSimd(true);
  // The second call returns what the first set: false where the CPU has no AVX2.
  if (!SetFingerprintSimd(true)) GTEST_SKIP() << "no AVX2 on this CPU: only the portable loops run";
  torch::manual_seed(5);
  at::Tensor base = torch::randn({70001}) * 3e4;
  base[17] = NAN;
  base[40000] = -INFINITY;
  const at::Tensor tail = torch::randn({1003});
  const at::Tensor transposed = base.narrow(0, 0, 70000).view({7, 10000}).t();
  for (const at::Tensor& t : {base, base.narrow(0, 300, 60000), tail, tail.to(at::kBFloat16), base.to(at::kBFloat16),
                              tail.to(at::kHalf), (tail * 1e5).to(at::kHalf), transposed}) {
    SCOPED_TRACE(c10::toString(t.scalar_type()));
    SetFingerprintSimd(true);
    const formats::Fingerprint simd = ComputeFingerprint(t);
    SetFingerprintSimd(false);
    const formats::Fingerprint portable = ComputeFingerprint(t);
    SetFingerprintSimd(true);
    EXPECT_EQ(simd.hash, portable.hash);
    EXPECT_EQ(simd.numel, portable.numel);
    EXPECT_EQ(std::memcmp(&simd.min, &portable.min, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&simd.max, &portable.max, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&simd.mean, &portable.mean, sizeof(double)), 0) << simd.mean << " " << portable.mean;
    EXPECT_EQ(std::memcmp(&simd.l2, &portable.l2, sizeof(double)), 0) << simd.l2 << " " << portable.l2;
    EXPECT_EQ(std::memcmp(&simd.abs_max, &portable.abs_max, sizeof(double)), 0);
    EXPECT_EQ(simd.nan, portable.nan);
    EXPECT_EQ(simd.pos_inf, portable.pos_inf);
    EXPECT_EQ(simd.neg_inf, portable.neg_inf);
    EXPECT_EQ(simd.beyond_f16, portable.beyond_f16);
    EXPECT_EQ(simd.beyond_bf16, portable.beyond_bf16);
  }
}

// Views of an input's elements get the input's statistics without a pass over
// their bytes (op_tracer_args.cpp, OutputId). Full mode computes every output from
// its bytes; the same deterministic step recorded both ways must agree.
TEST(RecorderTest, DerivedViewFingerprintsMatchComputedOnes) {
  TempDir dir;
  auto derived = RecordSteps(dir.File("r.moerr"), CaptureMode::kReplayable, 1);
  auto computed = RecordSteps(dir.File("f.moerr"), CaptureMode::kFull, 1);
  const formats::Trace a = formats::ReadTrace(*derived, 0).value();
  const formats::Trace b = formats::ReadTrace(*computed, 0).value();
  ASSERT_EQ(a.ops.size(), b.ops.size());
  std::map<uint64_t, std::string> op_name;  // by seq
  for (const auto& op : a.ops) op_name[op.seq] = op.name;
  // The values of an uninitialised allocation (empty, empty_like, ...) are
  // whatever memory held: they differ between the two recordings.
  auto uninitialised = [&](const formats::TensorMeta* m) {
    const std::string& name = op_name[static_cast<uint64_t>(m->producer)];
    return name.rfind("aten::empty", 0) == 0 || name.rfind("aten::new_empty", 0) == 0;
  };
  int views = 0;
  for (size_t i = 0; i < a.ops.size(); ++i) {
    // aten::add against aten::add_: diff::OutOfPlaceName.
    ASSERT_EQ(diff::OutOfPlaceName(a.ops[i].name), diff::OutOfPlaceName(b.ops[i].name)) << i;
    ASSERT_EQ(a.ops[i].outputs.size(), b.ops[i].outputs.size());
    for (size_t o = 0; o < a.ops[i].outputs.size(); ++o) {
      const formats::TensorMeta* x = a.Find(a.ops[i].outputs[o]);
      const formats::TensorMeta* y = b.Find(b.ops[i].outputs[o]);
      if (x == nullptr || y == nullptr || x->view_of == 0 || x->producer != static_cast<int64_t>(a.ops[i].seq)) continue;
      if (const formats::TensorMeta* base = a.Find(x->view_of); base == nullptr || uninitialised(base)) continue;
      ++views;
      const formats::Fingerprint& f = x->fingerprint;
      const formats::Fingerprint& g = y->fingerprint;
      SCOPED_TRACE(a.ops[i].name);
      EXPECT_EQ(f.numel, g.numel);
      EXPECT_EQ(f.nan, g.nan);
      EXPECT_EQ(f.pos_inf, g.pos_inf);
      EXPECT_EQ(f.beyond_f16, g.beyond_f16);
      if (g.numel > 0 && g.Finite()) {
        EXPECT_EQ(f.min, g.min);
        EXPECT_EQ(f.max, g.max);
        EXPECT_EQ(f.abs_max, g.abs_max);
        EXPECT_NEAR(f.l2, g.l2, 1e-5 * (1e-3 + g.l2));
      }
      auto contiguous = [](const formats::TensorMeta& m) {
        int64_t expect = 1;
        for (size_t d = m.shape.size(); d-- > 0;) {
          if (m.shape[d] != 1 && m.strides[d] != expect) return false;
          expect *= m.shape[d];
        }
        return true;
      };
      // Along a chain of contiguous views of a contiguous tensor with a
      // computed hash, the hash is that of the same bytes.
      const formats::TensorMeta* base = x;
      bool chain_contiguous = contiguous(*x);
      while (base->view_of != 0 && chain_contiguous) {
        base = a.Find(base->view_of);
        chain_contiguous = base != nullptr && contiguous(*base);
      }
      if (chain_contiguous) {
        EXPECT_EQ(f.hash, g.hash) << "a contiguous view of a contiguous tensor holds the same bytes";
      }
    }
  }
  EXPECT_GT(views, 500);
}

}  // namespace
}  // namespace moerr::recorder

/* tests/cuda/cu_split_emu.cpp -- cu_split's kernels.cu run on the CPU
 * (kcu_emu.h: blocks one after another, threads as fibers with exact
 * barrier and shuffle semantics), for the split reductions (ROW_SPLIT,
 * COL_TILE) and, as a check of the emulation, kernels of the other mappings.
 *
 * For each kernel: results against a reference (exact where the order of
 * the float operations is known, else |got - ref| <= 1e-5 (sum |terms|) +
 * 1e-6); the same bits whatever order the blocks run in (so whichever block
 * is last), and whatever row ranges the rows are launched in; the unsplit
 * form (no scratch lane, slot -1) within the tolerance; every block counter
 * back at 0 after every launch; nothing written outside the outputs.  Then
 * the scratch lanes: one per stream, the same bits on another stream, and
 * the unsplit fallback once the lanes are all taken.
 *
 * Built and run by split_emu.sh, which rewrites kernels.cu to
 * kernels_emu.cu (included here). */
#include "kernels_emu.cu"

#include <math.h>

#include <cstdio>
#include <vector>

#include "cu_test.h" /* failures, CHECK */

static uint64_t rng = 0x9e3779b97f4a7c15u;

static float uniform(float lo, float hi) {
  uint64_t z = (rng += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  z ^= z >> 31;
  return lo + (hi - lo) * (float)((double)(z >> 40) / (double)(1u << 24));
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* A buffer with guard zones either side (GUARD floats of a NaN pattern no
 * kernel produces) and a 16-byte aligned start, or one float past it. */
enum { GUARD = 64 };
static const uint32_t GUARD_BITS = 0x7fbadbadu;

struct Buf {
  std::vector<float> mem;
  size_t n;
  int off;
  Buf(size_t n_, int off_ = 0) : mem(n_ + 2 * GUARD + 4), n(n_), off(off_) {
    float g;
    memcpy(&g, &GUARD_BITS, sizeof g);
    for (float &x : mem) x = g;
  }
  float *p() { return mem.data() + GUARD + off; }
  float &operator[](size_t i) { return p()[i]; }
  bool guards_ok() const {
    for (size_t i = 0; i < mem.size(); i++) {
      if (i >= (size_t)(GUARD + off) && i < GUARD + off + n) continue;
      if (bits(mem[i]) != GUARD_BITS) return false;
    }
    return true;
  }
  std::vector<float> get() { return std::vector<float>(p(), p() + n); }
  void set(const std::vector<float> &v) { memcpy(p(), v.data(), n * sizeof(float)); }
};

static bool counters_zero() {
  for (int l = 0; l < KCU_LANES; l++)
    for (int i = 0; i < KCU_LANE_COUNTS; i++)
      if (kcu_count_[l][i]) return false;
  return true;
}

static bool same_bits(const std::vector<float> &a, const std::vector<float> &b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (bits(a[i]) != bits(b[i])) return false;
  return true;
}

/* out starts as init; run(rb, re) launches rows [rb, re).  Returns the
 * result of one launch of all rows; checks that other block orders and the
 * row ranges split at each of cuts give the same bits. */
template <class F>
static std::vector<float> run_all(const char *name, Buf &out, const std::vector<float> &init, int64_t rows,
                                  std::vector<int64_t> cuts, F run) {
  std::vector<float> first;
  const unsigned orders[] = {0, 1, 7};
  for (unsigned o : orders) {
    kcu_emu_order = o;
    out.set(init);
    run(0, rows);
    CHECK(counters_zero(), "%s: a block counter is not back at 0 (order %u)", name, o);
    CHECK(out.guards_ok(), "%s: wrote outside its output (order %u)", name, o);
    if (first.empty()) first = out.get();
    else CHECK(same_bits(first, out.get()), "%s: block order %u changes the bits", name, o);
  }
  kcu_emu_order = 3;
  for (int64_t cut : cuts) {
    out.set(init);
    run(0, cut);
    run(cut, rows);
    CHECK(counters_zero(), "%s: a block counter is not back at 0 (cut %lld)", name, (long long)cut);
    CHECK(same_bits(first, out.get()), "%s: rows [0, %lld) + [%lld, %lld) change the bits", name,
          (long long)cut, (long long)cut, (long long)rows);
  }
  kcu_emu_order = 0;
  return first;
}

/* |got - ref| <= 1e-5 mag + 1e-6, or both NaN */
static bool near(float got, double ref, double mag) {
  if (isnan(ref)) return isnan(got);
  return fabs((double)got - ref) <= 1e-5 * mag + 1e-6;
}

static cudaStream_t S0 = nullptr;

static void test_sumsq() {
  const int64_t E = 100000;
  Buf x(E), xu(E, 1), out(1);
  double ref = 0;
  for (int64_t c = 0; c < E; c++) {
    x[c] = xu[c] = uniform(-1, 1);
    ref += (double)x[c] * x[c];
  }
  std::vector<float> init(1, 0.0f);
  long b0 = kcu_emu_blocks;
  std::vector<float> got = run_all("sumsq", out, init, 1, {}, [&](int64_t rb, int64_t re) {
    sumsq_launch(out.p(), x.p(), rb, re, S0);
  });
  CHECK(kcu_emu_blocks - b0 == 3 * 49, "sumsq: %ld blocks for 3 launches, expected 3 x 49",
        kcu_emu_blocks - b0);
  CHECK(near(got[0], ref, ref), "sumsq: %.9g, expected %.9g", got[0], ref);
  /* float4 off: one float past the alignment */
  std::vector<float> gu = run_all("sumsq unaligned", out, init, 1, {}, [&](int64_t rb, int64_t re) {
    sumsq_launch(out.p(), xu.p(), rb, re, S0);
  });
  CHECK(near(gu[0], ref, ref), "sumsq unaligned: %.9g, expected %.9g", gu[0], ref);
  /* unsplit (no lane): one block */
  out.set(init);
  kcu_emu_launch(1, 256, sumsq<true>, out.p(), x.p(), 0, 1, -1);
  CHECK(near(out[0], ref, ref), "sumsq unsplit: %.9g, expected %.9g", out[0], ref);
  /* another stream: another lane, the same bits */
  out.set(init);
  sumsq_launch(out.p(), x.p(), 0, 1, (cudaStream_t)0x10);
  CHECK(kcu_lane((cudaStream_t)0x10) == 1 && kcu_lane(S0) == 0, "lanes %d %d", kcu_lane(S0),
        kcu_lane((cudaStream_t)0x10));
  CHECK(bits(out[0]) == bits(got[0]) && counters_zero(), "sumsq on lane 1: %.9g vs %.9g", out[0], got[0]);
}

static void test_rowstats() {
  const int64_t R = 3, E = 50001;
  Buf x(R * E), scale(R), out(2 * R), acc(R);
  float sc[3] = {0.5f, -2.0f, 1.5f};
  for (int64_t i = 0; i < R * E; i++) x[i] = uniform(-3, 3);
  x[2 * E + 30000] = NAN;
  x[1 * E + 4] = 1e3f;  /* a known maximum of row 1 after scaling: its minimum */
  for (int r = 0; r < R; r++) scale[r] = sc[r];
  std::vector<float> init(2 * R, 0.0f), ainit = {1.0f, 2.0f, 3.0f};
  std::vector<float> got_acc;
  std::vector<float> got = run_all("rowstats", out, init, R, {1, 2}, [&](int64_t rb, int64_t re) {
    if (rb == 0) acc.set(ainit);
    rowstats_launch(x.p(), scale.p(), out.p(), acc.p(), rb, re, S0);
    if (re == R) {
      if (got_acc.empty()) got_acc = acc.get();
      else CHECK(same_bits(got_acc, acc.get()), "rowstats: acc bits differ between runs");
    }
  });
  CHECK(acc.guards_ok() && out.guards_ok(), "rowstats: guards");
  for (int r = 0; r < R; r++) {
    float mx = -INFINITY, mn = INFINITY;
    double s = 0, mag = fabs(ainit[r]);
    bool nan = false;
    for (int64_t c = 0; c < E; c++) {
      float v = x[r * E + c] * sc[r];
      if (isnan(v)) nan = true;
      mx = v > mx ? v : mx;
      mn = v < mn ? v : mn;
      s += v;
      mag += fabs(v);
    }
    if (nan) {
      CHECK(isnan(got[2 * r]) && isnan(got[2 * r + 1]) && isnan(got_acc[r]), "rowstats row %d: NaN lost", r);
      continue;
    }
    CHECK(bits(got[2 * r]) == bits(mx) && bits(got[2 * r + 1]) == bits(mn),
          "rowstats row %d: max %.9g min %.9g, expected %.9g %.9g", r, got[2 * r], got[2 * r + 1], mx, mn);
    CHECK(near(got_acc[r], ainit[r] + s, mag), "rowstats row %d: acc %.9g, expected %.9g", r, got_acc[r],
          ainit[r] + s);
  }
  CHECK(got[3] == -2e3f, "rowstats: min of row 1 %.9g", got[3]);
  /* unsplit */
  out.set(init);
  acc.set(ainit);
  kcu_emu_launch(3, 256, rowstats, x.p(), scale.p(), out.p(), acc.p(), 0, 3, -1);
  for (int r = 0; r < 2; r++)
    CHECK(bits(out[2 * r]) == bits(got[2 * r]) && bits(out[2 * r + 1]) == bits(got[2 * r + 1]) &&
              near(acc[r], got_acc[r], fabs(got_acc[r]) + 1e3),
          "rowstats unsplit row %d", r);
}

static void test_colsum() {
  const int64_t R = 200, E = 4096;
  Buf dy(R * E), db(R);
  for (int64_t i = 0; i < R * E; i++) dy[i] = uniform(-1, 1);
  std::vector<float> init(R);
  for (auto &v : init) v = uniform(-1, 1);
  std::vector<float> got = run_all("colsum", db, init, R, {77, 32, 199}, [&](int64_t rb, int64_t re) {
    colsum_launch(dy.p(), db.p(), rb, re, S0);
  });
  for (int64_t r = 0; r < R; r++) {
    double s = init[r], mag = fabs(init[r]);
    for (int64_t c = 0; c < E; c++) s += dy[c * R + r], mag += fabs(dy[c * R + r]);
    CHECK(near(got[r], s, mag), "colsum row %lld: %.9g, expected %.9g", (long long)r, got[r], s);
  }
  /* dy one float past the alignment: a row a lane (the scalar instantiation),
   * the same bits as 4 rows a lane */
  Buf dyu(R * E, 1);
  for (int64_t i = 0; i < R * E; i++) dyu[i] = dy[i];
  std::vector<float> gu = run_all("colsum unaligned", db, init, R, {100}, [&](int64_t rb, int64_t re) {
    colsum_launch(dyu.p(), db.p(), rb, re, S0);
  });
  CHECK(same_bits(got, gu), "colsum: 4 rows a lane and a row a lane give different bits");
  /* unsplit (no scratch lane), both instantiations: 2 tiles of 128 rows, 7 of 32 */
  db.set(init);
  kcu_emu_launch(kcu_grid(2, 1), 256, colsum<true>, dy.p(), db.p(), 0, R, -1);
  std::vector<float> u4 = db.get();
  db.set(init);
  kcu_emu_launch(kcu_grid(7, 1), 256, colsum<false>, dy.p(), db.p(), 0, R, -1);
  CHECK(same_bits(u4, db.get()), "colsum unsplit: the instantiations give different bits");
  for (int64_t r = 0; r < R; r++)
    CHECK(near(db[r], got[r], 100), "colsum unsplit row %lld: %.9g vs %.9g", (long long)r, db[r], got[r]);
}

static void test_colstats() {
  const int64_t R = 80, E = 300;
  Buf x(R * E), out(2 * R);
  for (int64_t i = 0; i < R * E; i++) x[i] = uniform(-5, 5);
  x[100 * R + 45] = NAN;  /* row (1, 5) */
  std::vector<float> init(2 * R, 0.0f);
  std::vector<float> got = run_all("colstats", out, init, R, {33, 40, 64}, [&](int64_t rb, int64_t re) {
    colstats_launch(x.p(), out.p(), rb, re, S0);
  });
  for (int64_t r = 0; r < R; r++) {
    float mx = -INFINITY;
    double s = 0, mag = 0;
    for (int64_t c = 0; c < E; c++) {
      float v = x[c * R + r];
      mx = v > mx || isnan(v) ? v : mx;
      s += v, mag += fabs(v);
    }
    if (r == 45) {
      CHECK(isnan(got[2 * r]) && isnan(got[2 * r + 1]), "colstats row 45: NaN lost");
      continue;
    }
    CHECK(bits(got[2 * r]) == bits(mx) && near(got[2 * r + 1], s, mag),
          "colstats row %lld: %.9g %.9g, expected %.9g %.9g", (long long)r, got[2 * r], got[2 * r + 1], mx, s);
  }
}

static void test_colshort() {
  const int64_t R = 5000;
  Buf x(3 * R), out(R);
  for (int64_t i = 0; i < 3 * R; i++) x[i] = uniform(-1, 1);
  std::vector<float> init(R, 0.0f);
  std::vector<float> got = run_all("colshort", out, init, R, {4999, 31}, [&](int64_t rb, int64_t re) {
    colshort_launch(x.p(), out.p(), rb, re, S0);
  });
  for (int64_t r = 0; r < R; r++) {
    float s = (x[r] + x[R + r]) + x[2 * R + r];  /* slices 0, 1, 2 in order */
    CHECK(got[r] == s * 2.0f, "colshort row %lld: %.9g, expected %.9g", (long long)r, got[r], s * 2.0f);
  }
}

/* coltile's kernels (cu_split.c) that keep a row a lane: out[r] = sum_c
 * x[c R + r + off] (times r where scale) against a double reference, the
 * same bits over row ranges and block orders */
template <class F>
static void test_coltile(const char *name, int64_t R, int64_t E, int64_t off, bool scale, F launch) {
  Buf x(R * E + off), out(R);
  for (int64_t i = 0; i < R * E + off; i++) x[i] = uniform(-1, 1);
  std::vector<float> init(R, 0.0f);
  std::vector<float> got = run_all(name, out, init, R, {R / 2, 4}, [&](int64_t rb, int64_t re) {
    launch(x.p(), out.p(), rb, re);
  });
  for (int64_t r = 0; r < R; r++) {
    double s = 0, mag = 0;
    for (int64_t c = 0; c < E; c++) {
      double v = (double)x[c * R + r + off] * (scale ? (double)r : 1.0);
      s += v, mag += fabs(v);
    }
    CHECK(near(got[r], s, mag), "%s row %lld: %.9g, expected %.9g", name, (long long)r, got[r], s);
  }
}

/* cu_split's concat3 kernels (LOOPS, and the row groups of its conflicting
 * variants) against their loops run in order: out[r, off_i + c] = a_i[r, c]
 * (twice the middle one's); conflict as in cu_split.c */
template <class F>
static void test_concat3(const char *name, int conflict, int64_t R, F launch) {
  const int64_t E[3] = {1024, 6, 2048}, W = 1024 + 6 + 2048;
  int64_t off[3] = {0, 1024, 1030};
  if (conflict == 1) off[1] = 1028;
  Buf a0(R * E[0]), a1(R * E[1]), a2(R * E[2]), a0u(R * E[0], 1), out(R * W);
  Buf *a[3] = {&a0, &a1, &a2};
  for (int i = 0; i < 3; i++)
    for (int64_t j = 0; j < R * E[i]; j++) (*a[i])[j] = uniform(-1, 1);
  for (int64_t j = 0; j < R * E[0]; j++) a0u[j] = a0[j];
  std::vector<float> init(R * W);
  for (auto &v : init) v = uniform(-1, 1);
  std::vector<float> ref = init;
  for (int64_t r = 0; r < R; r++) {
    float first = ref[r * W];
    for (int i = 0; i < 3; i++)
      for (int64_t c = 0; c < E[i]; c++) {
        float v = (*a[i])[r * E[i] + c];
        if (i == 1) v = v * 2.0f;
        if (i == 2 && conflict == 2) v = v + ref[r * W + c];
        if (i == 2 && conflict == 3) v = v + first;
        ref[r * W + off[i] + c] = v;
      }
  }
  std::vector<float> got = run_all(name, out, init, R, {1, R - 1}, [&](int64_t rb, int64_t re) {
    launch(a0.p(), a1.p(), a2.p(), out.p(), rb, re);
  });
  CHECK(same_bits(got, ref), "%s: not the loops' result in order", name);
  /* a0 one float past the alignment: a column a step, the same bits */
  std::vector<float> gu = run_all(name, out, init, R, {}, [&](int64_t rb, int64_t re) {
    launch(a0u.p(), a1.p(), a2.p(), out.p(), rb, re);
  });
  CHECK(same_bits(gu, ref), "%s unaligned: not the loops' result in order", name);
}

/* row sums of [R, E] through whatever mapping the kernel has */
template <class F> static void test_rowsum(const char *name, int64_t R, int64_t E, F launch) {
  Buf x(R * E), out(R);
  for (int64_t i = 0; i < R * E; i++) x[i] = uniform(-1, 1);
  std::vector<float> init(R, 0.0f);
  std::vector<float> got = run_all(name, out, init, R, {R / 2}, [&](int64_t rb, int64_t re) {
    launch(out.p(), x.p(), rb, re);
  });
  for (int64_t r = 0; r < R; r++) {
    double s = 0, mag = 0;
    for (int64_t c = 0; c < E; c++) s += x[r * E + c], mag += fabs(x[r * E + c]);
    CHECK(near(got[r], s, mag), "%s row %lld: %.9g, expected %.9g", name, (long long)r, got[r], s);
  }
}

/* rowcenter_*: y = x - mean of its row, out[r] = sum of y^2 (cu_split.c) */
template <class F> static void test_rowcenter(const char *name, int64_t R, int64_t E, F launch) {
  Buf x(R * E), out(R), y(R * E);
  for (int64_t i = 0; i < R * E; i++) x[i] = uniform(-1, 1) + (float)(i / E % 5);
  std::vector<float> init(R, 0.0f);
  std::vector<float> got = run_all(name, out, init, R, {R / 2}, [&](int64_t rb, int64_t re) {
    launch(out.p(), x.p(), y.p(), rb, re);
  });
  CHECK(y.guards_ok(), "%s: wrote outside y", name);
  for (int64_t r = 0; r < R; r++) {
    double s = 0, mag = 0, q = 0;
    for (int64_t c = 0; c < E; c++) s += x[r * E + c], mag += fabs(x[r * E + c]);
    const double mean = s / (double)E;
    for (int64_t c = 0; c < E; c++) {
      const double d = (double)x[r * E + c] - mean;
      q += d * d;
      CHECK(near(y[r * E + c], d, mag / (double)E), "%s y[%lld, %lld]: %.9g, expected %.9g", name,
            (long long)r, (long long)c, y[r * E + c], d);
    }
    CHECK(near(got[r], q, q), "%s row %lld: %.9g, expected %.9g", name, (long long)r, got[r], q);
  }
}

/* the other mappings, as a check of the emulation */
static void test_others() {
  const int64_t E = 8192;
  Buf x(E), out(1), y(E);
  for (int64_t c = 0; c < E; c++) x[c] = uniform(-4, 4);
  std::vector<float> init(1, 0.0f);
  std::vector<float> got = run_all("twoloop", out, init, 1, {}, [&](int64_t rb, int64_t re) {
    twoloop_launch(out.p(), x.p(), rb, re, S0);
  });
  double mx = -INFINITY, s = 0;
  for (int64_t c = 0; c < E; c++) mx = x[c] > mx ? x[c] : mx;
  for (int64_t c = 0; c < E; c++) s += exp((double)x[c] - mx);
  CHECK(near(got[0], s, s), "twoloop: %.9g, expected %.9g", got[0], s);
  got = run_all("loopstore", out, init, 1, {}, [&](int64_t rb, int64_t re) {
    loopstore_launch(out.p(), x.p(), y.p(), rb, re, S0);
  });
  s = 0;
  double mag = 0;
  for (int64_t c = 0; c < E; c++) {
    s += x[c], mag += fabs(x[c]);
    CHECK(y[c] == x[c] + x[c], "loopstore y[%lld]", (long long)c);
  }
  CHECK(near(got[0], s, mag), "loopstore: %.9g, expected %.9g", got[0], s);
}

/* Batched launches (kir_cuda.h, NAME_multi): count instances over their own
 * buffers, each instance's inputs offset by off[i] floats (1: no float4),
 * give the bits of one NAME_launch each, in every block order, nothing
 * written outside the outputs.  make(i) fills instance i's buffers; launch
 * one instance (i) or all (-1); outs(i) its outputs. */
/* a value in [-scale, scale) fixed by (i, j): make() must fill alike each time */
static float fixed(int i, int j, float scale) {
  uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15u + (uint64_t)j * 0xbf58476d1ce4e5b9u + 1;
  z = (z ^ (z >> 31)) * 0x94d049bb133111ebu;
  z ^= z >> 29;
  return scale * (float)((double)(z >> 40) / (double)(1u << 23) - 1.0);
}

template <class Make, class Run, class Outs>
static void check_multi(const char *name, int count, Make make, Run launch, Outs outs) {
  std::vector<std::vector<float>> ref(count);
  for (int i = 0; i < count; i++) {
    make(i);
    launch(i);
    for (Buf *b : outs(i)) {
      std::vector<float> v = b->get();
      ref[i].insert(ref[i].end(), v.begin(), v.end());
    }
  }
  const unsigned orders[] = {0, 1, 7};
  for (unsigned o : orders) {
    kcu_emu_order = o;
    for (int i = 0; i < count; i++) make(i);
    launch(-1);
    for (int i = 0; i < count; i++) {
      std::vector<float> got;
      for (Buf *b : outs(i)) {
        std::vector<float> v = b->get();
        got.insert(got.end(), v.begin(), v.end());
        CHECK(b->guards_ok(), "%s_multi: instance %d wrote outside its output", name, i);
      }
      CHECK(same_bits(got, ref[i]), "%s_multi: instance %d (order %u) differs from its own launch",
            name, i, o);
    }
  }
  kcu_emu_order = 0;
}

/* The split kernels batched: sumsq (ROW_SPLIT, 49 parts) and colsum
 * (COL_TILE, 64 parts of 200 rows), each instance on its share of the lane;
 * the counters back at 0.  On stream s (one without a lane: a launch each,
 * unsplit, as the single launches there). */
static void test_multi_split(cudaStream_t s) {
  enum { E = 100000, R = 200, C = 4096 };
  std::vector<Buf *> x(4), o(4), dy(3), db(3);
  for (int i = 0; i < 4; i++) x[i] = new Buf(E), o[i] = new Buf(1);
  for (int i = 0; i < 3; i++) dy[i] = new Buf(R * C), db[i] = new Buf(R);
  check_multi("sumsq", 4, [&](int i) {
    for (int j = 0; j < E; j++) (*x[i])[j] = fixed(i, j, 2);
    (*o[i])[0] = 0;
  }, [&](int i) {
    if (i >= 0) return sumsq_launch(o[i]->p(), x[i]->p(), 0, 1, s);
    sumsq_multi_t a = {};
    for (int j = 0; j < 4; j++) a.out[j] = o[j]->p(), a.x[j] = x[j]->p();
    sumsq_multi_launch(&a, 4, 0, 1, s);
  }, [&](int i) { return std::vector<Buf *>{o[i]}; });
  CHECK(counters_zero(), "sumsq_multi: a block counter is not back at 0");
  check_multi("colsum", 3, [&](int i) {
    for (int j = 0; j < R * C; j++) (*dy[i])[j] = fixed(i, j, 1);
    for (int j = 0; j < R; j++) (*db[i])[j] = (float)j;
  }, [&](int i) {
    if (i >= 0) return colsum_launch(dy[i]->p(), db[i]->p(), 0, R, s);
    colsum_multi_t a = {};
    for (int j = 0; j < 3; j++) a.dy[j] = dy[j]->p(), a.db[j] = db[j]->p();
    colsum_multi_launch(&a, 3, 0, R, s);
  }, [&](int i) { return std::vector<Buf *>{db[i]}; });
  CHECK(counters_zero(), "colsum_multi: a block counter is not back at 0");
  for (int i = 0; i < 4; i++) delete x[i], delete o[i];
  for (int i = 0; i < 3; i++) delete dy[i], delete db[i];
}

static void test_multi() {
  enum { N = 5 };
  for (int mixed = 0; mixed < 3; mixed++) { /* all aligned, none, some (a launch each) */
    auto off = [&](int i) { return mixed == 0 ? 0 : mixed == 1 ? 1 : i % 2; };
    /* rowsum_768: rows [8] of 768, a row group, float4 */
    std::vector<Buf *> x(N), out(N);
    for (int i = 0; i < N; i++) x[i] = new Buf(8 * 768, off(i)), out[i] = new Buf(8);
    auto make_rs = [&](int i) {
      for (int j = 0; j < 8 * 768; j++) (*x[i])[j] = fixed(i, j, 2) + (float)i;
      for (int j = 0; j < 8; j++) (*out[i])[j] = 0;
    };
    long l0 = kcu_emu_launches;
    check_multi("rowsum_768", N, make_rs, [&](int i) {
      if (i >= 0) return rowsum_768_launch(out[i]->p(), x[i]->p(), 0, 8, S0);
      rowsum_768_multi_t a = {};
      for (int j = 0; j < N; j++) a.out[j] = out[j]->p(), a.x[j] = x[j]->p();
      rowsum_768_multi_launch(&a, N, 0, 8, S0);
    }, [&](int i) { return std::vector<Buf *>{out[i]}; });
    /* N single launches, then per block order one batched launch (mixed: N) */
    long want = N + 3 * (mixed == 2 ? N : 1);
    CHECK(kcu_emu_launches - l0 == want, "rowsum_768_multi (mixed %d): %ld launches, expected %ld",
          mixed, kcu_emu_launches - l0, want);
    /* axpy: acc += 2 x over [6, 1000], flat, float4, read-modify-write */
    std::vector<Buf *> ax(N), acc(N);
    for (int i = 0; i < N; i++) ax[i] = new Buf(6000, off(i)), acc[i] = new Buf(6000, off(i));
    check_multi("axpy", N, [&](int i) {
      for (int j = 0; j < 6000; j++) (*ax[i])[j] = fixed(i, j, 1), (*acc[i])[j] = (float)(i + j % 7);
    }, [&](int i) {
      if (i >= 0) return axpy_launch(ax[i]->p(), acc[i]->p(), 0, 6, S0);
      axpy_multi_t a = {};
      for (int j = 0; j < N; j++) a.x[j] = ax[j]->p(), a.acc[j] = acc[j]->p();
      axpy_multi_launch(&a, N, 0, 6, S0);
    }, [&](int i) { return std::vector<Buf *>{acc[i]}; });
    for (int i = 0; i < N; i++) delete x[i], delete out[i], delete ax[i], delete acc[i];
  }
  /* colshort: column tiles without a split; loopstore: a store in the loop */
  std::vector<Buf *> cx(3), co(3), lx(3), lo(3), ly(3);
  for (int i = 0; i < 3; i++)
    cx[i] = new Buf(15000), co[i] = new Buf(5000), lx[i] = new Buf(8192), lo[i] = new Buf(1),
    ly[i] = new Buf(8192);
  check_multi("colshort", 3, [&](int i) {
    for (int j = 0; j < 15000; j++) (*cx[i])[j] = fixed(i, j, 3);
  }, [&](int i) {
    if (i >= 0) return colshort_launch(cx[i]->p(), co[i]->p(), 0, 5000, S0);
    colshort_multi_t a = {};
    for (int j = 0; j < 3; j++) a.x[j] = cx[j]->p(), a.out[j] = co[j]->p();
    colshort_multi_launch(&a, 3, 0, 5000, S0);
  }, [&](int i) { return std::vector<Buf *>{co[i]}; });
  check_multi("loopstore", 3, [&](int i) {
    for (int j = 0; j < 8192; j++) (*lx[i])[j] = fixed(i, j, 3);
  }, [&](int i) {
    if (i >= 0) return loopstore_launch(lo[i]->p(), lx[i]->p(), ly[i]->p(), 0, 1, S0);
    loopstore_multi_t a = {};
    for (int j = 0; j < 3; j++) a.out[j] = lo[j]->p(), a.x[j] = lx[j]->p(), a.y[j] = ly[j]->p();
    loopstore_multi_launch(&a, 3, 0, 1, S0);
  }, [&](int i) { return std::vector<Buf *>{lo[i], ly[i]}; });
  for (int i = 0; i < 3; i++) delete cx[i], delete co[i], delete lx[i], delete lo[i], delete ly[i];
  /* concat3: flat over its three loops, 3 rows; instance 1's first part one
   * float past the alignment (mixed: a launch each), then all aligned */
  for (int mixed = 0; mixed < 2; mixed++) {
    std::vector<Buf *> p0(3), p1(3), p2(3), po(3);
    for (int i = 0; i < 3; i++)
      p0[i] = new Buf(3 * 1024, mixed && i == 1), p1[i] = new Buf(3 * 6), p2[i] = new Buf(3 * 2048),
      po[i] = new Buf(3 * 3078);
    check_multi("concat3", 3, [&](int i) {
      for (int j = 0; j < 3 * 1024; j++) (*p0[i])[j] = fixed(i, j, 4);
      for (int j = 0; j < 3 * 6; j++) (*p1[i])[j] = fixed(i, j, 5);
      for (int j = 0; j < 3 * 2048; j++) (*p2[i])[j] = fixed(i, j, 6);
      for (int j = 0; j < 3 * 3078; j++) (*po[i])[j] = 0;
    }, [&](int i) {
      if (i >= 0) return concat3_launch(po[i]->p(), p0[i]->p(), p1[i]->p(), p2[i]->p(), 0, 3, S0);
      concat3_multi_t a = {};
      for (int j = 0; j < 3; j++)
        a.out[j] = po[j]->p(), a.a0[j] = p0[j]->p(), a.a1[j] = p1[j]->p(), a.a2[j] = p2[j]->p();
      concat3_multi_launch(&a, 3, 0, 3, S0);
    }, [&](int i) { return std::vector<Buf *>{po[i]}; });
    for (int i = 0; i < 3; i++) delete p0[i], delete p1[i], delete p2[i], delete po[i];
  }
  test_multi_split(S0);
}

int main() {
  test_multi();
  test_sumsq();
  test_rowstats();
  test_colsum();
  test_colstats();
  test_colshort();
  test_concat3("concat3", 0, 3, [](float *a0, float *a1, float *a2, float *o, int64_t rb, int64_t re) {
    concat3_launch(o, a0, a1, a2, rb, re, S0);
  });
  test_concat3("concat3_overlap", 1, 3, [](float *a0, float *a1, float *a2, float *o, int64_t rb,
                                           int64_t re) { concat3_overlap_launch(o, a0, a1, a2, rb, re, S0); });
  test_concat3("concat3_reads", 2, 3, [](float *a0, float *a1, float *a2, float *o, int64_t rb,
                                         int64_t re) { concat3_reads_launch(o, a0, a1, a2, rb, re, S0); });
  test_concat3("concat3_rowload", 3, 3, [](float *a0, float *a1, float *a2, float *o, int64_t rb,
                                           int64_t re) { concat3_rowload_launch(o, a0, a1, a2, rb, re, S0); });
  test_coltile("colrowval", 36, 500, 0, true, [](const float *x, float *o, int64_t rb, int64_t re) {
    colrowval_launch(x, o, rb, re, S0);
  });
  test_coltile("coloffset", 40, 300, 2, false, [](const float *x, float *o, int64_t rb, int64_t re) {
    coloffset_launch(x, o, rb, re, S0);
  });
  test_coltile("colodd", 38, 300, 0, false, [](const float *x, float *o, int64_t rb, int64_t re) {
    colodd_launch(x, o, rb, re, S0);
  });
  test_rowsum("rowsum_4096", 31, 4096, [](float *o, const float *x, int64_t rb, int64_t re) {
    rowsum_4096_launch(o, x, rb, re, S0);
  });
  test_rowsum("rowsum_4095", 1, 4095, [](float *o, const float *x, int64_t rb, int64_t re) {
    rowsum_4095_launch(o, x, rb, re, S0);
  });
  test_rowsum("rowsum_32", 32, 8192, [](float *o, const float *x, int64_t rb, int64_t re) {
    rowsum_32_launch(o, x, rb, re, S0);
  });
  /* row groups unrolled over their few passes: every lane, the partial last pass,
   * float4 rows (768, 700) and single columns (701) */
  test_rowsum("rowsum_768", 8, 768, [](float *o, const float *x, int64_t rb, int64_t re) {
    rowsum_768_launch(o, x, rb, re, S0);
  });
  test_rowsum("rowsum_700", 5, 700, [](float *o, const float *x, int64_t rb, int64_t re) {
    rowsum_700_launch(o, x, rb, re, S0);
  });
  test_rowsum("rowsum_701", 3, 701, [](float *o, const float *x, int64_t rb, int64_t re) {
    rowsum_701_launch(o, x, rb, re, S0);
  });
  /* from 1024 rows: a warp per row over 6 float4 passes; 128 threads over 6
   * single-column passes (below 1024 rows, a block per row: rowsum_768) */
  test_rowcenter("rowcenter_1024x768", 1024, 768,
                 [](float *o, const float *x, float *y, int64_t rb, int64_t re) {
                   rowcenter_1024x768_launch(o, x, y, rb, re, S0);
                 });
  test_rowcenter("rowcenter_1024x701", 1024, 701,
                 [](float *o, const float *x, float *y, int64_t rb, int64_t re) {
                   rowcenter_1024x701_launch(o, x, y, rb, re, S0);
                 });
  test_others();

  /* lanes: S0 and 0x10 have 0 and 1; more streams take the rest; then none */
  for (uintptr_t i = 0; i < KCU_LANES - 2; i++)
    CHECK(kcu_lane((cudaStream_t)(0x100 + i)) == (int)i + 2, "stream %d's lane", (int)i);
  cudaStream_t late = (cudaStream_t)0x1000;
  CHECK(kcu_lane(late) == -1 && kcu_lane(late) == -1 && kcu_lane((cudaStream_t)0x10) == 1,
        "lanes after all are taken");
  {
    Buf x(100000), out(1);
    double ref = 0;
    for (int c = 0; c < 100000; c++) x[c] = uniform(-1, 1), ref += (double)x[c] * x[c];
    long b0 = kcu_emu_blocks;
    sumsq_launch(out.p(), x.p(), 0, 1, late);
    CHECK(kcu_emu_blocks - b0 == 1 && near(out[0], ref, ref), "sumsq without a lane: %ld blocks, %.9g vs %.9g",
          kcu_emu_blocks - b0, out[0], ref);
  }
  { /* the batched split kernels without a lane: a launch each (4 sumsq, 3 colsum),
     * singly, then per block order */
    long l0 = kcu_emu_launches;
    test_multi_split(late);
    CHECK(kcu_emu_launches - l0 == 4 * 4 + 3 * 4, "batched without a lane: %ld launches, expected %d",
          kcu_emu_launches - l0, 4 * 4 + 3 * 4);
  }

  if (failures) fprintf(stderr, "cu_split_emu: %d failure(s)\n", failures);
  else
    printf("cu_split_emu: ok (%ld launches, %ld blocks, %ld barriers emulated)\n", kcu_emu_launches,
           kcu_emu_blocks, kcu_emu_barriers);
  return failures ? 1 : 0;
}

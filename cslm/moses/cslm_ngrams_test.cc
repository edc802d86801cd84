// cslm_ngrams_test.cc -- checks cslm_ngrams.h without Moses or a server.
//   g++ -std=c++11 -O1 -o cslm_ngrams_test cslm_ngrams_test.cc && ./cslm_ngrams_test
// Decomposing a sentence into phrases and scoring internal + boundary n-grams
// must give exactly the n-grams of the whole sentence, for any segmentation.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#include "cslm_ngrams.h"

static int failures = 0;
#define CHECK(c)                                                 \
  do {                                                           \
    if (!(c)) {                                                  \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #c); \
      ++failures;                                                \
    }                                                            \
  } while (0)

typedef std::vector<uint32_t> Ids;
static const uint32_t BOS = 1, EOS = 2;

// The reference: every word of the sentence then </s>, history padded with <s>.
static std::multiset<Ids> sentence_ngrams(const Ids& words, unsigned order) {
  Ids seq(1, BOS);
  seq.insert(seq.end(), words.begin(), words.end());
  seq.push_back(EOS);
  std::multiset<Ids> out;
  for (size_t k = 1; k < seq.size(); ++k) {
    Ids flat;
    cslm::append_ngram(&seq[0], k, seq[k], order, BOS, &flat);
    out.insert(flat);
  }
  return out;
}

static void split(const Ids& flat, unsigned order, std::multiset<Ids>* out) {
  CHECK(flat.size() % order == 0);
  for (size_t i = 0; i < flat.size(); i += order) out->insert(Ids(flat.begin() + i, flat.begin() + i + order));
}

int main() {
  // append_ngram pads on the left
  Ids flat;
  const uint32_t hist[] = {10, 11};
  cslm::append_ngram(hist, 2, 12, 4, BOS, &flat);
  CHECK((flat == Ids{BOS, 10, 11, 12}));
  flat.clear();
  cslm::append_ngram(hist, 0, 12, 3, BOS, &flat);
  CHECK((flat == Ids{BOS, BOS, 12}));

  std::srand(7);
  for (unsigned order = 2; order <= 7; ++order) {
    for (int trial = 0; trial < 300; ++trial) {
      Ids words(1 + std::rand() % 20);
      for (size_t i = 0; i < words.size(); ++i) words[i] = 3 + std::rand() % 5;
      std::multiset<Ids> got;
      Ids state(1, BOS), next;
      for (size_t start = 0; start < words.size();) {
        const size_t want = 1 + std::rand() % 9, left = words.size() - start;
        const size_t len = want < left ? want : left;
        Ids phrase(words.begin() + start, words.begin() + start + len);
        start += len;
        Ids a, b;
        const size_t ni = cslm::internal_ngrams(phrase, order, BOS, &a);
        Ids e;  // the estimate: the words the boundary n-grams score, with the phrase's own history
        const size_t ne = cslm::estimate_ngrams(phrase, order, BOS, &e);
        CHECK(ni + ne == phrase.size() && e.size() == ne * order);
        for (size_t k = 0; k < ne; ++k) CHECK(e[k * order + order - 1] == phrase[k]);
        const size_t nb = cslm::boundary_ngrams(state.data(), state.size(), phrase, start == words.size(), order, BOS, EOS, &b, &next);
        // at the sentence start the estimate is exact: the boundary n-grams' history is <s> too
        if (start == len) CHECK(Ids(e.begin(), e.end()) == Ids(b.begin(), b.begin() + e.size()));
        CHECK(ni + nb == phrase.size() + (start == words.size() ? 1 : 0));
        CHECK(a.size() == ni * order && b.size() == nb * order);
        split(a, order, &got);
        split(b, order, &got);
        CHECK(next.size() <= order - 1 && next.back() == phrase.back());
        state = next;
      }
      CHECK(got == sentence_ngrams(words, order));
    }
  }

  // the cache
  cslm::NgramCache cache(2);
  const uint32_t g1[] = {1, 2, 3}, g2[] = {1, 2, 4}, g3[] = {5, 6, 7};
  float lp = 0;
  uint8_t fl = 0;
  CHECK(!cache.find(g1, 3, &lp, &fl));
  cache.insert(g1, 3, -1.5f, 1);
  cache.insert(g2, 3, -2.5f, 0);
  CHECK(cache.find(g1, 3, &lp, &fl) && lp == -1.5f && fl == 1);
  CHECK(cache.find(g2, 3, &lp, &fl) && lp == -2.5f && fl == 0);
  cache.insert(g3, 3, -3.0f, 0);  // full: emptied first
  CHECK(cache.size() == 1 && !cache.find(g1, 3, &lp, &fl) && cache.find(g3, 3, &lp, &fl));
  CHECK(cache.hits() == 3 && cache.misses() == 2);
  cache.make_room(1);  // one more fits: kept
  CHECK(cache.size() == 1);
  cache.make_room(2);  // two more do not: emptied, so both will stay
  CHECK(cache.size() == 0);
  CHECK(!cache.find(g3, 3, &lp, &fl));
  cache.insert(g3, 3, -4.0f, 2);  // an emptied cache takes entries afresh
  CHECK(cache.find(g3, 3, &lp, &fl) && lp == -4.0f && fl == 2 && cache.size() == 1);
  cache.insert(g3, 3, -4.5f, 3);  // again: the value replaced, no second entry
  CHECK(cache.find(g3, 3, &lp, &fl) && lp == -4.5f && fl == 3 && cache.size() == 1);
  {
    // many entries, colliding in a small table: each found with its own value
    cslm::NgramCache many(1000);
    for (uint32_t i = 0; i < 1000; ++i) {
      const uint32_t g[] = {i, i * 7, 5};
      many.insert(g, 3, -static_cast<float>(i), static_cast<uint8_t>(i & 0xff));
    }
    bool all = many.size() == 1000;
    for (uint32_t i = 0; i < 1000; ++i) {
      const uint32_t g[] = {i, i * 7, 5}, h[] = {i, i * 7, 6};
      all = all && many.find(g, 3, &lp, &fl) && lp == -static_cast<float>(i) && fl == (i & 0xff) &&
            !many.find(h, 3, &lp, &fl);
    }
    CHECK(all);
  }
  {
    // pending n-grams: marked once, unseen by find, answered by insert
    cslm::NgramCache pend(10);
    const uint32_t a[] = {1, 2, 3}, b[] = {2, 3, 4};
    pend.insert(a, 3, -1.0f, 1);
    CHECK(pend.mark(a, 3, &lp, &fl) == cslm::NgramCache::kAnswered && lp == -1.0f && fl == 1);
    CHECK(pend.mark(b, 3, &lp, &fl) == cslm::NgramCache::kMarked && pend.size() == 2);
    CHECK(pend.mark(b, 3, &lp, &fl) == cslm::NgramCache::kPending && !pend.find(b, 3, &lp, &fl));
    CHECK(!pend.insert(b, 3, -2.0f, 2) && pend.find(b, 3, &lp, &fl) && lp == -2.0f && fl == 2 && pend.size() == 2);
    CHECK(pend.mark(b, 3, &lp, &fl) == cslm::NgramCache::kAnswered && lp == -2.0f);
    cslm::NgramCache none(0);  // no room: every n-gram is asked for
    CHECK(none.mark(a, 3, &lp, &fl) == cslm::NgramCache::kMarked && none.mark(a, 3, &lp, &fl) == cslm::NgramCache::kMarked);
  }
  {
    // a table that doubles as it fills: every entry found after each growth,
    // none after emptying; the value of an n-gram inserted twice replaced
    cslm::NgramCache big(100000);
    bool all = true;
    for (uint32_t i = 0; i < 50000; ++i) {
      const uint32_t g[] = {i % 97, i, 3, 9};
      all = all && big.insert(g, 4, -static_cast<float>(i), static_cast<uint8_t>(i & 0xff));
    }
    const uint32_t again[] = {5, 5, 3, 9};
    all = all && !big.insert(again, 4, 1.0f, 7) && big.size() == 50000;
    for (uint32_t i = 0; i < 50000; ++i) {
      const uint32_t g[] = {i % 97, i, 3, 9};
      all = all && big.find(g, 4, &lp, &fl) && lp == (i == 5 ? 1.0f : -static_cast<float>(i)) &&
            fl == (i == 5 ? 7 : (i & 0xff));
    }
    big.clear();
    for (uint32_t i = 0; i < 50000; ++i) {
      const uint32_t g[] = {i % 97, i, 3, 9};
      all = all && !big.find(g, 4, &lp, &fl);
    }
    CHECK(all && big.size() == 0);
    // emptied more times than a slot's tag counts generations: old entries stay gone
    const uint32_t a[] = {1, 2, 3, 4}, b[] = {4, 3, 2, 1};
    big.insert(a, 4, -1.0f, 0);
    for (uint32_t i = 0; i < (1u << 24); ++i) {
      big.insert(b, 4, -2.0f, 0);
      big.clear();
    }
    CHECK(!big.find(a, 4, &lp, &fl) && !big.find(b, 4, &lp, &fl));
    big.insert(b, 4, -3.0f, 1);
    CHECK(big.find(b, 4, &lp, &fl) && lp == -3.0f && fl == 1 && big.size() == 1);
  }

  // the cache's default size: small only in process, self-normalised, with a history cache, unbuffered
  CHECK(cslm::default_cache_size(true, true, 16384, 0) == 4096);
  CHECK(cslm::default_cache_size(false, true, 16384, 0) == 1000000);     // through a server
  CHECK(cslm::default_cache_size(true, false, 16384, 0) == 1000000);     // the exact softmax
  CHECK(cslm::default_cache_size(true, true, 0, 0) == 1000000);          // no history cache
  CHECK(cslm::default_cache_size(true, true, 16384, 65536) == 1000000);  // the buffer

  // moses.ini numbers: the whole value, within its range
  {
    size_t n = 7;
    float f = 0;
    int i = 0;
    CHECK(cslm::parse_number<size_t>("4096", 0, 100000000, &n) && n == 4096);
    CHECK(cslm::parse_number<size_t>("0", 0, 10, &n) && n == 0);
    CHECK(!cslm::parse_number<size_t>("abc", 0, 10, &n) && !cslm::parse_number<size_t>("-5", 0, 10, &n));
    CHECK(!cslm::parse_number<size_t>("12x", 0, 100, &n) && !cslm::parse_number<size_t>("", 0, 10, &n));
    CHECK(!cslm::parse_number<size_t>(" 3", 0, 10, &n) && !cslm::parse_number<size_t>("3 ", 0, 10, &n));
    CHECK(!cslm::parse_number<size_t>("11", 0, 10, &n) && !cslm::parse_number<size_t>("1.5", 0, 10, &n));
    CHECK(!cslm::parse_number<size_t>("99999999999999999999999", 0, 100000000, &n) && n == 0);
    CHECK(cslm::parse_number<int>("-3", -10, 10, &i) && i == -3 && !cslm::parse_number<int>("-11", -10, 10, &i));
    CHECK(cslm::parse_number<float>("1.25", 0, 1000, &f) && f == 1.25f);
    CHECK(cslm::parse_number<float>("-100", -1e6f, 0, &f) && f == -100.0f);
    CHECK(!cslm::parse_number<float>("nan", 0, 1000, &f) && !cslm::parse_number<float>("inf", 0, 1e30f, &f));
    CHECK(!cslm::parse_number<float>("1e9", 0, 1000, &f) && !cslm::parse_number<float>("1,5", 0, 10, &f));
  }

  // cube pruning's corner: (x+i, y+j) with (i+1)(j+1) <= corner, inside the cube, (x, y) first
  std::vector<std::pair<size_t, size_t> > cells;
  cslm::cube_corner(0, 0, 10, 10, 8, &cells);
  CHECK(cells.size() == 8 + 4 + 2 + 2 + 1 + 1 + 1 + 1);
  CHECK(cells[0] == std::make_pair(size_t(0), size_t(0)));
  std::set<std::pair<size_t, size_t> > in(cells.begin(), cells.end());
  CHECK(in.size() == cells.size());
  for (size_t i = 0; i < 10; ++i)
    for (size_t j = 0; j < 10; ++j) CHECK(in.count(std::make_pair(i, j)) == ((i + 1) * (j + 1) <= 8 ? 1u : 0u));
  cslm::cube_corner(1, 1, 2, 3, 8, &cells);  // clipped by the cube's edges
  CHECK(cells.size() == 2 && cells[0] == std::make_pair(size_t(1), size_t(1)) &&
        cells[1] == std::make_pair(size_t(1), size_t(2)));
  cslm::cube_corner(3, 4, 10, 10, 1, &cells);
  CHECK(cells.size() == 1 && cells[0] == std::make_pair(size_t(3), size_t(4)));
  cslm::cube_corner(0, 0, 10, 10, 0, &cells);
  CHECK(cells.empty());
  cslm::cube_corner(0, 0, 0, 10, 8, &cells);
  CHECK(cells.empty());

  // cube pruning run ahead: every cube's (0, 0), then each pop's successors, best estimate first
  {
    const float rows_a[] = {0.0f, -1.0f, -5.0f}, cols_a[] = {0.0f, -0.5f};
    const float rows_b[] = {-0.2f}, cols_b[] = {0.0f, -3.0f, -4.0f};
    std::vector<cslm::CubeEstimate> cubes;
    cslm::CubeEstimate a = {rows_a, 3, cols_a, 2, 0.0f}, b = {rows_b, 1, cols_b, 3, -1.0f}, none = {rows_b, 0, cols_b, 3, 0.0f};
    cubes.push_back(a);
    cubes.push_back(none);  // no predecessors: creates nothing
    cubes.push_back(b);
    std::vector<cslm::CubeCell> made;
    cslm::cube_pops(cubes, 0, &made);
    CHECK(made.size() == 2 && made[0].cube == 0 && made[1].cube == 2 && made[1].x == 0 && made[1].y == 0);
    // pop 1: a(0,0) = 0 -> a(1,0) = -1, a(0,1) = -0.5; pop 2: a(0,1) -> a(1,1) = -1.5 ((0,2) is outside);
    // pop 3: a(1,0) -> a(2,0) = -5 ((1,1) made already); pop 4: b(0,0) = -1.2 -> b(0,1) = -4.2
    cslm::cube_pops(cubes, 4, &made);
    CHECK(made.size() == 7);
    std::set<std::pair<size_t, std::pair<size_t, size_t> > > got;
    for (size_t i = 0; i < made.size(); ++i) got.insert(std::make_pair(made[i].cube, std::make_pair(made[i].x, made[i].y)));
    CHECK(got.size() == made.size());
    CHECK(got.count(std::make_pair(size_t(0), std::make_pair(size_t(2), size_t(0)))) == 1);
    CHECK(got.count(std::make_pair(size_t(0), std::make_pair(size_t(1), size_t(1)))) == 1);
    CHECK(got.count(std::make_pair(size_t(2), std::make_pair(size_t(0), size_t(1)))) == 1);
    CHECK(got.count(std::make_pair(size_t(2), std::make_pair(size_t(0), size_t(2)))) == 0);
    cslm::cube_pops(cubes, 100, &made);  // past the last cell: every cell, once
    CHECK(made.size() == 3 * 2 + 1 * 3);
  }

  // the run ahead with a score per cell: called once per created cell, in the order created
  {
    struct Counting {
      std::vector<cslm::CubeCell> asked;
      float operator()(size_t c, size_t x, size_t y) {
        cslm::CubeCell cell = {c, x, y};
        asked.push_back(cell);
        return -static_cast<float>(x + 2 * y) - (c == 1 ? 0.5f : 0.0f);  // cube 1 a little worse
      }
    } score;
    std::vector<std::pair<size_t, size_t> > sizes;
    sizes.push_back(std::make_pair(size_t(2), size_t(2)));
    sizes.push_back(std::make_pair(size_t(3), size_t(1)));
    std::vector<cslm::CubeCell> made;
    cslm::cube_run(sizes, 2, score, &made);
    // created: 0(0,0) 1(0,0); pop 0(0,0) = 0 -> 0(1,0) = -1, 0(0,1) = -2; pop 1(0,0) = -0.5 -> 1(1,0) = -1.5
    CHECK(made.size() == 5 && score.asked.size() == 5);
    for (size_t i = 0; i < made.size(); ++i)
      CHECK(made[i].cube == score.asked[i].cube && made[i].x == score.asked[i].x && made[i].y == score.asked[i].y);
    CHECK(made[2].cube == 0 && made[2].x == 1 && made[2].y == 0 && made[3].x == 0 && made[3].y == 1);
    CHECK(made[4].cube == 1 && made[4].x == 1 && made[4].y == 0);
  }

  // the run ahead's provisional values: means of the answered n-grams with the same ending, shrunk to the shorter's
  {
    cslm::SuffixMeans means(2, 4);  // the word and the bigram; 16 slots
    const uint32_t a[3] = {7, 5, 9}, b[3] = {8, 6, 9}, c[3] = {8, 5, 9}, d[3] = {7, 5, 4};
    CHECK(means.estimate(a, 3, -5.0f) == -5.0f);  // nothing answered: the fallback
    means.add(a, 3, -2.0f);
    means.add(b, 3, -4.0f);
    means.add(d, 3, -6.0f);
    // all: mean -4; word 9: (-2 - 4 + -4) / 3; bigram (5, 9): (-2 + that) / 2
    const double all = -4.0, word = (-6.0 + all) / 3, bigram = (-2.0 + word) / 2;
    CHECK(std::fabs(means.estimate(c, 3, -5.0f) - bigram) < 1e-6);  // 8 5 9: ends like 7 5 9
    const uint32_t e[3] = {1, 2, 9}, f[3] = {1, 2, 3};
    CHECK(std::fabs(means.estimate(e, 3, -5.0f) - word) < 1e-6);     // a new bigram: the word's
    CHECK(std::fabs(means.estimate(f, 3, -5.0f) - all) < 1e-6);      // a new word: the mean of all
    CHECK(means.answered() == 3);
    // a full table replaces slots: every estimate stays between the answers' extremes
    for (uint32_t i = 0; i < 1000; ++i) {
      const uint32_t g[3] = {i % 13, i % 31, i % 17};
      means.add(g, 3, -1.0f - static_cast<float>(i % 5));
    }
    for (uint32_t i = 0; i < 200; ++i) {
      const uint32_t g[3] = {i, i % 31, i % 19};
      const float v = means.estimate(g, 3, 0.0f);
      CHECK(v <= -1.0f && v >= -6.0f);
    }
  }

  if (failures) return 1;
  std::printf("cslm_ngrams: all checks passed\n");
  return 0;
}

// Growable arrays of an automaton's rows (states, edge blocks) that never copy on growth.
//
// A std::vector doubles by allocating fresh memory, copying every row and freeing the old
// block: for a group automaton of a few MB that is a copy of all of it plus a page fault for
// every 4 kB of the new block, paid inside the engine step that happened to cross the
// capacity (its share of the step: docs/results.md, "Native draft path"). Past
// 256 kB an array lives in its own anonymous mapping and grows with mremap, which moves page
// tables, not data, and the mapping asks for transparent huge pages (MADV_HUGEPAGE): rows are read
// by chains of dependent random accesses (suffix links, transitions), and 2 MB pages cut
// their TLB misses. Small arrays (most automata of a fresh index) stay on the heap, as all
// arrays do where mremap does not exist (other than Linux).
#pragma once

#ifdef __linux__
#include <sys/mman.h>
#endif

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <type_traits>
#include <utility>

namespace bsn {

template <class T>
class Rows {
  static_assert(std::is_trivially_copyable<T>::value, "rows are moved as bytes");

 public:
  Rows() = default;
  Rows(std::initializer_list<T> init) {
    reserve(init.size());
    for (const T& x : init) p_[n_++] = x;
  }
  Rows(const Rows&) = delete;
  Rows& operator=(const Rows&) = delete;
  Rows(Rows&& o) noexcept { swap(o); }
  Rows& operator=(Rows&& o) noexcept {
    swap(o);
    return *this;
  }
  ~Rows() { release(); }

  size_t size() const { return n_; }
  size_t capacity() const { return cap_; }
  bool empty() const { return n_ == 0; }
  T* data() { return p_; }
  const T* data() const { return p_; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }
  const T* begin() const { return p_; }
  const T* end() const { return p_ + n_; }

  void push_back(const T& x) {
    if (n_ == cap_) {
      const T copy = x;  // x may be a row of this array
      grow(n_ + 1);
      p_[n_++] = copy;
      return;
    }
    p_[n_++] = x;
  }
  // New rows are zero bytes (a std::vector value-initialises them; callers set them anyway).
  void resize(size_t n) {
    if (n > cap_) grow(n);
    if (n > n_) std::memset(static_cast<void*>(p_ + n_), 0, (n - n_) * sizeof(T));
    n_ = n;
  }
  void reserve(size_t n) {
    if (n > cap_) grow(n);
  }
  void swap(Rows& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(cap_, o.cap_);
    std::swap(mapped_, o.mapped_);
  }

 private:
  static constexpr size_t kMapFrom = size_t(256) << 10;  // bytes: own mapping from here on
  static constexpr size_t kPage = size_t(4) << 10;

  T* p_ = nullptr;
  size_t n_ = 0, cap_ = 0;
  bool mapped_ = false;

  static size_t round_up(size_t b) { return (b + kPage - 1) / kPage * kPage; }

  void grow(size_t need) {
    size_t cap = cap_ ? 2 * cap_ : 4;
    while (cap < need) cap *= 2;
    size_t bytes = cap * sizeof(T);
#ifdef __linux__
    const bool heap = bytes < kMapFrom;
#else
    const bool heap = true;  // mremap is Linux-only: elsewhere the heap's realloc
#endif
    if (heap) {
      void* q = std::realloc(p_, bytes);
      if (!q) throw std::bad_alloc();
      p_ = static_cast<T*>(q);
      cap_ = cap;
      return;
    }
#ifdef __linux__
    bytes = round_up(bytes);
    void* q;
    if (mapped_) {
      q = mremap(p_, round_up(cap_ * sizeof(T)), bytes, MREMAP_MAYMOVE);
      if (q == MAP_FAILED) throw std::bad_alloc();
    } else {
      q = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (q == MAP_FAILED) throw std::bad_alloc();
      if (n_) std::memcpy(q, p_, n_ * sizeof(T));
      std::free(p_);
      mapped_ = true;
    }
#ifdef MADV_HUGEPAGE
    madvise(q, bytes, MADV_HUGEPAGE);  // advice only: without THP it is plain pages
#endif
    p_ = static_cast<T*>(q);
    cap_ = bytes / sizeof(T);
#endif
  }

  void release() {
    if (mapped_) {
#ifdef __linux__
      munmap(p_, round_up(cap_ * sizeof(T)));
#endif
    } else {
      std::free(p_);
    }
    p_ = nullptr;
    n_ = cap_ = 0;
    mapped_ = false;
  }
};

}  // namespace bsn

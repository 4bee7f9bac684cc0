// The essential swap hook of benchmarks/hooks.py (EssentialSwap) with its pack and unpack in C++:
// a guard on the shape and dtype a first pass found at each position, the never-move checks,
// deduplication by storage, offset and version (the strides matched), one copy into a slot
// allocated up front that is not reused while an entry still holds it, and host bytes counted
// from the copy to the entry's death, with their peak. Built by benchmarks/native_hooks.py with
// torch.utils.cpp_extension.load_inline, to tell what moving the hooks out of Python buys.
#include <torch/extension.h>

#include <deque>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// Positions and bytes of dead entries: drained by the next pack (never from a destructor's caller).
struct ReleaseQueue {
  std::deque<std::pair<int64_t, int64_t>> released;
};

struct Entry {
  int64_t key;
  at::Tensor host;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  int64_t nbytes;
  int64_t handles = 1;
  int64_t reads = 0;
  at::Tensor held_out;
  std::shared_ptr<ReleaseQueue> sink;

  Entry(int64_t key, at::Tensor host, c10::weak_intrusive_ptr<c10::StorageImpl> storage, int64_t nbytes,
        std::shared_ptr<ReleaseQueue> sink)
      : key(key), host(std::move(host)), storage(std::move(storage)), nbytes(nbytes), sink(std::move(sink)) {}
  ~Entry() { sink->released.emplace_back(key, nbytes); }
};

struct Where {
  const void* storage;
  int64_t offset;
  uint32_t version;
  bool operator==(const Where& other) const {
    return storage == other.storage && offset == other.offset && version == other.version;
  }
};

struct WhereHash {
  size_t operator()(const Where& w) const {
    return std::hash<const void*>()(w.storage) ^ (static_cast<size_t>(w.offset) * 1315423911u) ^ w.version;
  }
};

struct Guard {
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  at::Tensor slot;
  bool movable;
};

class KeyedSwap {
 public:
  void add_guard(std::vector<int64_t> shape, at::ScalarType dtype, at::Tensor slot, bool movable) {
    guards_.push_back(Guard{std::move(shape), dtype, std::move(slot), movable});
    held_.push_back(false);
  }

  void begin() {
    position_ = 0;
    dedupe_.clear();
    drain();
  }

  void drain() {
    auto& released = sink_->released;
    while (!released.empty()) {
      auto [key, nbytes] = released.front();
      released.pop_front();
      held_[key] = false;
      host_bytes_ -= nbytes;
    }
  }

  py::object pack(const at::Tensor& t) {
    const int64_t key = position_++;
    if (key >= static_cast<int64_t>(guards_.size())) return py::cast(t.detach());
    Guard& guard = guards_[key];
    if (!guard.movable || t.layout() != at::kStrided || t.scalar_type() != guard.dtype ||
        t.sizes() != c10::IntArrayRef(guard.shape)) {
      return py::cast(t.detach());
    }
    if (!sink_->released.empty()) drain();
    const Where where{t.storage().unsafeGetStorageImpl(), t.storage_offset(), t._version()};
    auto found = dedupe_.find(where);
    if (found != dedupe_.end()) {
      if (auto entry = found->second.lock()) {
        if (!entry->storage.expired() && entry->host.strides() == t.strides()) {
          entry->handles += 1;
          return py::cast(entry);
        }
      }
    }
    if ((t.requires_grad() && t.is_leaf()) || held_[key] || !t.is_contiguous()) return py::cast(t.detach());
    guard.slot.copy_(t);
    held_[key] = true;
    const int64_t nbytes = guard.slot.numel() * guard.slot.element_size();
    auto entry = std::make_shared<Entry>(key, guard.slot, t.storage().getWeakStorageImpl(), nbytes, sink_);
    dedupe_[where] = entry;
    host_bytes_ += nbytes;
    if (host_bytes_ > peak_host_bytes_) peak_host_bytes_ = host_bytes_;
    return py::cast(entry);
  }

  int64_t host_bytes() const { return host_bytes_; }
  int64_t peak_host_bytes() const { return peak_host_bytes_; }

 private:
  std::vector<Guard> guards_;
  std::vector<bool> held_;
  std::shared_ptr<ReleaseQueue> sink_ = std::make_shared<ReleaseQueue>();
  std::unordered_map<Where, std::weak_ptr<Entry>, WhereHash> dedupe_;
  int64_t position_ = 0;
  int64_t host_bytes_ = 0;
  int64_t peak_host_bytes_ = 0;
};

at::Tensor unpack(const py::object& packed) {
  if (py::isinstance<Entry>(packed)) {
    auto entry = packed.cast<std::shared_ptr<Entry>>();
    at::Tensor out = entry->held_out.defined() ? entry->held_out : entry->host.clone();
    entry->reads += 1;
    entry->held_out = entry->reads < entry->handles ? out : at::Tensor();
    return out;
  }
  return packed.cast<at::Tensor>();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Entry, std::shared_ptr<Entry>>(m, "Entry");
  py::class_<KeyedSwap>(m, "KeyedSwap")
      .def(py::init<>())
      .def("add_guard", &KeyedSwap::add_guard)
      .def("begin", &KeyedSwap::begin)
      .def("drain", &KeyedSwap::drain)
      .def("pack", &KeyedSwap::pack)
      .def_property_readonly("host_bytes", &KeyedSwap::host_bytes)
      .def_property_readonly("peak_host_bytes", &KeyedSwap::peak_host_bytes);
  m.def("unpack", &unpack);
}

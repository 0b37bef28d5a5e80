#include "opgen/exec/thunk_registry.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#ifndef OPGEN_THUNK_ABI  // "thunk.h:<sha-256 prefix>,torch:<version>", opgen/cmake/opgen.cmake
#error "OPGEN_THUNK_ABI is defined by opgen.cmake's opgen_add_extension and opgen_add_runtime"
#endif

namespace opgen::exec {

extern const ThunkEntry* const kThunkTables[];  // generated: thunk_tables.cpp
extern const char kThunkDigest[];               // generated: thunk_tables.cpp

namespace {

constexpr ThunkExport kOwn{OPGEN_THUNK_ABI, kThunkTables, kThunkDigest};

// A thunk a name finds, and the prefix it was registered under ("": this module's own).
struct Found {
  const ThunkEntry* entry;
  std::string prefix;
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, Found> thunks;  // by "<name>.<backend>"
  std::map<std::string, ThunkExport> modules;     // by prefix

  Registry() {
    for (const ThunkEntry* const* t = kOwn.tables; *t != nullptr; ++t) {
      for (const ThunkEntry* e = *t; e->name != nullptr; ++e)
        thunks[std::string(e->name) + "." + e->backend] = Found{e, ""};
    }
  }
};

Registry& registry() {
  static auto* r = new Registry();  // never destroyed: programs may be parsed during exit
  return *r;
}

std::string key(std::string_view prefix, std::string_view name, std::string_view backend) {
  std::string k;
  k.reserve(prefix.size() + name.size() + 1 + backend.size());
  return k.append(prefix).append(name).append(".").append(backend);
}

bool is_prefix(std::string_view prefix) {
  return !prefix.empty() && std::all_of(prefix.begin(), prefix.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// What register_thunks refuses, before it takes the lock.
void check(const std::string& prefix, const ThunkExport& other) {
  const std::string what = "register_thunks('" + prefix + "'): ";
  if (!is_prefix(prefix))
    throw std::invalid_argument(what +
                                "a prefix is one or more of A-Z a-z 0-9 _ (it begins the "
                                "function of a kernel line, `<prefix><function>.<device>`)");
  const std::string_view abi = other.abi == nullptr ? "" : other.abi;
  if (abi != kOwn.abi) {
    throw std::invalid_argument(what + "the thunks have ABI '" + std::string(abi) +
                                "' but this module's executor has ABI '" + kOwn.abi +
                                "': built against another opgen or torch: rebuild the extension");
  }
  if (other.tables == nullptr)
    throw std::invalid_argument(what + "the export holds no thunk tables");
}

}  // namespace

const ThunkExport& own_thunks() { return kOwn; }

const ThunkEntry* find_thunk(std::string_view name, std::string_view backend) {
  Registry& r = registry();
  const std::string k = key("", name, backend);
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.thunks.find(k);
  return it == r.thunks.end() ? nullptr : it->second.entry;
}

Registered register_thunks(const std::string& prefix, const ThunkExport& other) {
  check(prefix, other);
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto old = r.modules.find(prefix);
  if (old != r.modules.end() && old->second.tables == other.tables) return Registered::kUnchanged;
  std::vector<std::pair<std::string, const ThunkEntry*>> added;
  for (const ThunkEntry* const* t = other.tables; *t != nullptr; ++t) {
    for (const ThunkEntry* e = *t; e->name != nullptr; ++e) {
      std::string k = key(prefix, e->name, e->backend);
      const auto taken = r.thunks.find(k);
      if (taken != r.thunks.end() && taken->second.prefix != prefix) {
        const std::string& by = taken->second.prefix;
        throw std::invalid_argument(
            "register_thunks('" + prefix + "'): " + k + " is taken by " +
            (by.empty() ? "this module's own thunks" : "the thunks registered under '" + by + "'") +
            ": choose another prefix");
      }
      added.emplace_back(std::move(k), e);
    }
  }
  const bool replaced = old != r.modules.end();
  if (replaced) std::erase_if(r.thunks, [&](const auto& kv) { return kv.second.prefix == prefix; });
  for (auto& [k, e] : added) r.thunks[std::move(k)] = Found{e, prefix};
  r.modules[prefix] = other;
  return replaced ? Registered::kReplaced : Registered::kAdded;
}

std::vector<std::pair<std::string, std::string>> registered_thunks() {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [prefix, other] : r.modules)
    out.emplace_back(prefix, other.digest == nullptr ? "" : other.digest);
  return out;
}

}  // namespace opgen::exec

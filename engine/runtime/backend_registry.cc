// The backend registry: see backend_registry.h.
#include "engine/runtime/backend_registry.h"

#include <functional>
#include <map>
#include <mutex>

namespace pdserve::engine {
namespace {

struct Registry {
  std::mutex mu;
  // Node-based: pointers to the hooks stay valid as others register.
  std::map<std::string, BackendHooks, std::less<>> backends;
};
Registry& GetRegistry() {
  static Registry* registry = new Registry();  // never destroyed: used from static initializers
  return *registry;
}

}  // namespace

void RegisterBackend(const std::string& name, BackendHooks hooks) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.backends[name] = hooks;
}

const BackendHooks* FindRegisteredBackend(std::string_view name) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (auto it = r.backends.find(name); it != r.backends.end()) return &it->second;
  return nullptr;
}

}  // namespace pdserve::engine

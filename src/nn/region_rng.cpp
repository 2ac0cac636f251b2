// Note [Region generators]
// The region's numbers are kept as generator *states*, not generators: a RegionRng swaps each
// into the device's default generator and the default's out, and back at its end, so every op
// that draws from the default generator (dropout, rand, bernoulli on any device) draws the
// region's without being told, and the defaults go on as if the region never drew. This is
// Megatron's fork(); its tracker holds states for the same reason.
#include "tandem/nn/region_rng.h"

#include <map>
#include <mutex>

#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include "tandem/error.h"

namespace tandem::nn {
namespace {

std::mutex states_mutex;
std::vector<std::pair<c10::Device, at::Tensor>> states;  // under states_mutex
thread_local int depth = 0;

at::Generator& default_generator(c10::Device device) {
  // The default generators live as long as the process; defaultGenerator gives a const handle.
  return const_cast<at::Generator&>(at::globalContext().defaultGenerator(device));
}

std::vector<c10::Device> devices() {
  std::vector<c10::Device> out{c10::Device(c10::kCPU)};
  if (at::globalContext().hasCUDA()) {
    const auto count = at::detail::getCUDAHooks().deviceCount();
    for (c10::DeviceIndex i = 0; i < count; ++i) out.emplace_back(c10::kCUDA, i);
  }
  return out;
}

// Each device's state after seeding its default generator with `seed`; the defaults unchanged.
std::vector<std::pair<c10::Device, at::Tensor>> seeded_states(uint64_t seed) {
  std::vector<std::pair<c10::Device, at::Tensor>> out;
  for (const auto& device : devices()) {
    at::Generator& gen = default_generator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    const at::Tensor before = gen.get_state();
    gen.set_current_seed(seed);
    out.emplace_back(device, gen.get_state());
    gen.set_state(before);
  }
  return out;
}

// Swaps every region state with its default generator's.
void swap_all() {
  for (auto& [device, state] : states) {
    at::Generator& gen = default_generator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    at::Tensor theirs = gen.get_state();
    gen.set_state(state);
    state = std::move(theirs);
  }
}

}  // namespace

void seed_region_rng(uint64_t seed) {
  auto fresh = seeded_states(seed);
  std::lock_guard<std::mutex> lock(states_mutex);
  TANDEM_CHECK(depth == 0, "nn::seed_region_rng: called inside a RegionRng: seed before entering the region");
  states = std::move(fresh);
}

RegionRng::RegionRng() {
  if (depth++ > 0) return;
  outermost_ = true;
  std::lock_guard<std::mutex> lock(states_mutex);
  if (states.empty()) {
    uint64_t base = 0;
    {
      at::Generator& cpu = default_generator(c10::Device(c10::kCPU));
      std::lock_guard<std::mutex> gen_lock(cpu.mutex());
      base = cpu.current_seed();
    }
    states = seeded_states(base + 2718);
  }
  swap_all();
}

RegionRng::~RegionRng() {
  --depth;
  if (!outermost_) return;
  std::lock_guard<std::mutex> lock(states_mutex);
  swap_all();
}

// Inside a RegionRng these are the defaults' states (swapped out): a checkpoint that captures and
// restores both the defaults and these inside one puts back what was there, as it was.
std::vector<std::pair<c10::Device, at::Tensor>> region_rng_states() {
  std::lock_guard<std::mutex> lock(states_mutex);
  std::vector<std::pair<c10::Device, at::Tensor>> out;
  for (const auto& [device, state] : states) out.emplace_back(device, state.clone());
  return out;
}

void set_region_rng_states(const std::vector<std::pair<c10::Device, at::Tensor>>& given) {
  std::lock_guard<std::mutex> lock(states_mutex);
  states.clear();
  for (const auto& [device, state] : given) states.emplace_back(device, state.clone());
}

}  // namespace tandem::nn

#include "core/settings.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>

namespace ringattn {
namespace {

constexpr const char* kFault = "RINGATTN_FAULT";
constexpr const char* kLogLevel = "RINGATTN_LOG_LEVEL";
constexpr const char* kMpiTimeout = "RINGATTN_MPI_TIMEOUT_S";
constexpr const char* kMpiProgress = "RINGATTN_MPI_PROGRESS";
constexpr const char* kFlashKernel = "RINGATTN_FLASH_KERNEL";
constexpr const char* kBackwardKernel = "RINGATTN_BACKWARD_KERNEL";
constexpr const char* kBackwardDq = "RINGATTN_BACKWARD_DQ";
constexpr const char* kHopperTile = "RINGATTN_HOPPER_TILE";
constexpr const char* kHopperLazy = "RINGATTN_HOPPER_LAZY";

// A variable that takes one of a list of names: the names (in the order messages list them), the
// value each stands for, and the value when the variable is unset or empty (named: the first
// name's; unnamed: no name stands for it, and messages add "(or unset)").
template <class T>
struct Choice {
  std::vector<const char*> names;
  std::vector<T> values;
  T fallback;
  bool fallback_named;
};

const Choice<FlashKernel>& flash_kernels() {
  static const Choice<FlashKernel> c{{"auto", "hopper", "portable"},
                                     {FlashKernel::Auto, FlashKernel::Hopper, FlashKernel::Portable},
                                     FlashKernel::Auto, true};
  return c;
}
const Choice<BackwardKernel>& backward_kernels() {
  static const Choice<BackwardKernel> c{
      {"auto", "hopper", "mma", "simt"},
      {BackwardKernel::Auto, BackwardKernel::Hopper, BackwardKernel::Mma, BackwardKernel::Simt},
      BackwardKernel::Auto, true};
  return c;
}
const Choice<BackwardDq>& backward_dqs() {
  static const Choice<BackwardDq> c{
      {"auto", "separate", "atomic"}, {BackwardDq::Auto, BackwardDq::Separate, BackwardDq::Atomic}, BackwardDq::Auto,
      true};
  return c;
}
const Choice<MpiProgress>& mpi_progresses() {
  static const Choice<MpiProgress> c{
      {"thread", "nonblocking"}, {MpiProgress::HelperThread, MpiProgress::Nonblocking}, MpiProgress::Auto, false};
  return c;
}
// "auto" (the measured default, stored as "") and the tile names.
const Choice<std::string>& hopper_tiles() {
  static const Choice<std::string> c = [] {
    Choice<std::string> t{{"auto"}, {""}, "", true};
    for (const char* n : kHopperTileNames) {
      t.names.push_back(n);
      t.values.emplace_back(n);
    }
    return t;
  }();
  return c;
}
const Choice<bool>& hopper_lazies() {
  static const Choice<bool> c{{"1", "0"}, {true, false}, true, true};
  return c;
}

constexpr const char* kLogNames[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};

std::string joined(const std::vector<const char*>& names) {
  std::string s;
  for (const char* n : names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

template <class T>
std::string allowed(const Choice<T>& c) {
  return joined(c.names) + (c.fallback_named ? "" : " (or unset)");
}

template <class T>
Setting<T> parse_choice(const char* name, const char* raw, const Choice<T>& c) {
  const std::string v = raw ? raw : "";
  if (v.empty()) return Setting<T>(c.fallback);
  for (size_t i = 0; i < c.names.size(); ++i)
    if (v == c.names[i]) return Setting<T>(c.values[i]);
  return Setting<T>::refused(fmt::format("{}='{}' is not understood: allowed are {}", name, v, allowed(c)));
}

// Decimal text only ("0x10", "inf", " 5" are refused), >= kMinTimeoutS and <= kMaxTimeoutS.
Setting<std::optional<double>> parse_timeout(const char* raw) {
  if (raw == nullptr || *raw == '\0') return Setting<std::optional<double>>(std::nullopt);
  char* end = nullptr;
  const double v = std::strtod(raw, &end);
  const bool decimal = std::string(raw).find_first_not_of("0123456789.eE+-") == std::string::npos;
  if (!decimal || end == raw || *end != '\0' || !(v >= kMinTimeoutS) || v > kMaxTimeoutS)
    return Setting<std::optional<double>>::refused(
        fmt::format("{}='{}' must be a number of seconds >= {:g} and <= {:g} (or use --timeout)", kMpiTimeout, raw,
                    kMinTimeoutS, kMaxTimeoutS));
  return Setting<std::optional<double>>(v);
}

Setting<std::optional<LogLevel>> parse_log_level_setting(const char* raw) {
  if (raw == nullptr || *raw == '\0') return Setting<std::optional<LogLevel>>(std::nullopt);
  if (const std::optional<LogLevel> l = log_level_from_name(raw)) return Setting<std::optional<LogLevel>>(l);
  return Setting<std::optional<LogLevel>>::refused(
      fmt::format("{}='{}' is not understood: allowed are {}", kLogLevel, raw, log_level_names()));
}

}  // namespace

const char* flash_kernel_name(FlashKernel k) {
  switch (k) {
    case FlashKernel::Auto: return "auto";
    case FlashKernel::Hopper: return "hopper";
    case FlashKernel::Portable: return "portable";
  }
  return "?";
}

const char* backward_kernel_name(BackwardKernel k) {
  switch (k) {
    case BackwardKernel::Auto: return "auto";
    case BackwardKernel::Mma: return "mma";
    case BackwardKernel::Simt: return "simt";
    case BackwardKernel::Hopper: return "hopper";
  }
  return "?";
}

const char* log_level_name(LogLevel l) {
  const size_t i = size_t(l);
  return i < std::size(kLogNames) ? kLogNames[i] : "?";
}

std::optional<LogLevel> log_level_from_name(const std::string& name) {
  std::string s = name;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (s == "warning") return LogLevel::Warn;
  if (s == "err") return LogLevel::Error;
  for (size_t i = 0; i < std::size(kLogNames); ++i)
    if (s == kLogNames[i]) return LogLevel(i);
  return std::nullopt;
}

std::string log_level_names() { return joined({std::begin(kLogNames), std::end(kLogNames)}); }

KernelChoices Settings::kernels() const {
  KernelChoices k;
  k.flash = flash_kernel.get();
  k.backward = backward_kernel.get();
  k.backward_dq = backward_dq.get();
  k.hopper_tile = hopper_tile.get();
  k.hopper_lazy = hopper_lazy.get();
  return k;
}

double Settings::timeout_s(std::optional<double> requested) const {
  if (requested) return *requested;
  return mpi_timeout_s.get().value_or(kDefaultTimeoutS);
}

const std::vector<SettingDoc>& setting_docs() {
  static const std::vector<SettingDoc> docs{
      {kFault, "RANK:HOP:KIND[:PHASE]; KIND exit, hang, corrupt, error, throw; PHASE forward, backward, grads",
       "unset (no fault)",
       "makes rank RANK fail at hop HOP of a ring run: tests of the failure paths (docs/correctness.md)"},
      {kLogLevel, log_level_names() + " (any case)", "info",
       "the log level when --log-level is not given (ranks other than 0 log warnings and errors only)"},
      {kMpiTimeout, fmt::format("seconds, >= {:g} and <= {:g}", kMinTimeoutS, kMaxTimeoutS),
       fmt::format("{:g}", kDefaultTimeoutS),
       "bound on every wait for another rank when --timeout is not given (the first exchange gets 3x, and waits behind it up to 4.5x)"},
      {kMpiProgress, allowed(mpi_progresses()),
       "thread under MPI_THREAD_SERIALIZED or more, else nonblocking",
       "how the MPI transport progresses exchanges: a helper thread, or MPI_Isend/MPI_Irecv"},
      {kFlashKernel, allowed(flash_kernels()), "auto",
       "the CUDA forward's bf16/fp16 kernel: auto takes the Hopper kernel wherever it takes the call"},
      {kBackwardKernel, allowed(backward_kernels()), "auto",
       "the CUDA backward's kernel: auto takes Hopper, else mma (mma.sync), else simt, wherever each takes the call"},
      {kBackwardDq, allowed(backward_dqs()), "auto",
       "how the tensor-core backwards form dq outside --deterministic: auto is atomic on Hopper, separate on mma"},
      {kHopperTile, allowed(hopper_tiles()), "auto",
       "the Hopper forward's tile configuration wherever it exists for the head dim and takes the call (kernels/cuda/hopper/PERF.md)"},
      {kHopperLazy, allowed(hopper_lazies()), "1",
       "lazy rescaling of the running max in the Hopper forward (1-3% faster on the H200; 0 turns it off)"},
  };
  return docs;
}

Settings parse_settings(const std::function<const char*(const char*)>& lookup) {
  Settings s;
  const char* fault = lookup(kFault);
  s.fault = Setting<std::string>(fault ? fault : "");
  s.log_level = parse_log_level_setting(lookup(kLogLevel));
  s.mpi_timeout_s = parse_timeout(lookup(kMpiTimeout));
  s.mpi_progress = parse_choice(kMpiProgress, lookup(kMpiProgress), mpi_progresses());
  s.flash_kernel = parse_choice(kFlashKernel, lookup(kFlashKernel), flash_kernels());
  s.backward_kernel = parse_choice(kBackwardKernel, lookup(kBackwardKernel), backward_kernels());
  s.backward_dq = parse_choice(kBackwardDq, lookup(kBackwardDq), backward_dqs());
  s.hopper_tile = parse_choice(kHopperTile, lookup(kHopperTile), hopper_tiles());
  s.hopper_lazy = parse_choice(kHopperLazy, lookup(kHopperLazy), hopper_lazies());
  return s;
}

Settings settings_from_environment() {
  return parse_settings([](const char* name) { return std::getenv(name); });
}

const Settings& settings() {
  static const Settings s = settings_from_environment();
  return s;
}

}  // namespace ringattn

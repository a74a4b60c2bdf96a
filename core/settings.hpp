// The RINGATTN_* environment variables, all of them read here and nowhere else:
// settings_from_environment() reads them into one Settings, settings() is the process's copy
// (read once, on first use). The layers above take the fields they need as parameters: the CLI
// reads settings() once at start-up and passes its fields down; the library's defaults
// (make_cuda_backend(device), make_mpi_transport(comm) with MpiProgress::Auto or timeout 0, the
// runner's fault_plan()) take theirs from settings(). setting_docs() describes every variable (name,
// values, default, what it does): `ringattn --help-env` prints it, and a test holds README.md's
// table to it.
//
// A variable that is unset or empty takes its default. A value that does not parse is kept as a
// refusal, not thrown when the environment is read: Setting::get() throws it (InvalidArgument
// naming the variable, its value and what is allowed) where the value is used, so a bad value of
// a variable that a run does not use (a kernel choice on CPU ranks, the wait bound under
// --timeout) stops nothing, as before this file existed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"

namespace ringattn {

// RINGATTN_FLASH_KERNEL: which bf16/fp16 flash kernel the CUDA backend takes. Auto: the Hopper
// kernel wherever it takes the call, the portable kernel elsewhere. Hopper: the Hopper kernel or
// an error. Portable: the portable kernel even on an sm_90 GPU.
enum class FlashKernel : uint8_t { Auto = 0, Hopper = 1, Portable = 2 };
const char* flash_kernel_name(FlashKernel k);

// RINGATTN_BACKWARD_KERNEL: which backward kernel the CUDA backend takes. Auto: the Hopper kernels
// (wgmma, sm_90a) wherever they take the call, else the tensor-core kernel (mma.sync; bf16/fp16,
// head dim 64 or 128) wherever it does, the SIMT kernels elsewhere. Hopper, Mma: that kernel or an
// error. Simt: the SIMT kernels for every call (tests and benchmarks compare them).
enum class BackwardKernel : uint8_t { Auto = 0, Mma = 1, Simt = 2, Hopper = 3 };
const char* backward_kernel_name(BackwardKernel k);

// RINGATTN_BACKWARD_DQ: how the tensor-core backwards form dq outside deterministic mode
// (kernels/cuda/flash_dispatch.hpp, FlashKernelOptions::backward_dq).
enum class BackwardDq : uint8_t { Auto = 0, Separate = 1, Atomic = 2 };

// RINGATTN_MPI_PROGRESS, and the MPI transport's progress mode (comm/mpi_transport.hpp).
enum class MpiProgress : uint8_t {
  Auto = 0,         // helper thread when the thread level allows; RINGATTN_MPI_PROGRESS overrides
  HelperThread = 1, // MPI_Sendrecv on a helper thread: progresses while the rank computes
  Nonblocking = 2,  // MPI_Isend/MPI_Irecv, completed in wait_exchange
};

// RINGATTN_LOG_LEVEL and --log-level.
enum class LogLevel : uint8_t { Trace, Debug, Info, Warn, Error, Critical, Off };
const char* log_level_name(LogLevel l);  // "trace", ..., "off"
// "trace", "debug", "info", "warn" or "warning", "error" or "err", "critical", "off", in any case;
// nullopt for anything else.
std::optional<LogLevel> log_level_from_name(const std::string& name);
// The names log_level_from_name takes (without the aliases), for messages: "trace, debug, ...".
std::string log_level_names();

// The tile configurations RINGATTN_HOPPER_TILE names besides auto: hopper_tile_name's
// (kernels/cuda/hopper/hopper_launch.hpp; a GPU test holds the two lists together).
inline constexpr const char* kHopperTileNames[] = {"128x128",   "128x176", "192x128",   "128x128q2",
                                                   "128x80",    "128x176c2", "128x128c2"};

// The largest wait bound accepted (RINGATTN_MPI_TIMEOUT_S, --timeout), in seconds.
inline constexpr double kMaxTimeoutS = 1e6;
// No exchange completes in less: a shorter bound (1e-300 was accepted) only fails every run.
inline constexpr double kMinTimeoutS = 1e-3;
// The wait bound when neither --timeout nor RINGATTN_MPI_TIMEOUT_S gives one, in seconds.
inline constexpr double kDefaultTimeoutS = 300.0;

// One variable's value, or the refusal of the value the environment held.
template <class T>
class Setting {
 public:
  Setting() = default;
  explicit Setting(T value) : value_(std::move(value)) {}
  static Setting refused(std::string message) {
    Setting s;
    s.refusal_ = std::move(message);
    return s;
  }
  // The value (the default when the variable is unset or empty); throws InvalidArgument naming
  // the variable, its value and what is allowed when that value was refused.
  const T& get() const {
    if (!refusal_.empty()) throw InvalidArgument(refusal_);
    return value_;
  }
  const std::string& refusal() const { return refusal_; }  // empty when the value is good

 private:
  T value_{};
  std::string refusal_;
};

// The CUDA backend's kernel choices (kernels/cuda/flash_dispatch.hpp's FlashKernelOptions takes
// them over).
struct KernelChoices {
  FlashKernel flash = FlashKernel::Auto;
  BackwardKernel backward = BackwardKernel::Auto;
  BackwardDq backward_dq = BackwardDq::Auto;
  std::string hopper_tile;  // one of kHopperTileNames; empty: the measured default (auto)
  bool hopper_lazy = true;  // lazy rescaling of the running max
};

// One field per variable (setting_docs() says what each does).
struct Settings {
  Setting<std::string> fault;                  // RINGATTN_FAULT: a plan (runner/faults/fault.hpp parses it), "" none
  Setting<std::optional<LogLevel>> log_level;  // RINGATTN_LOG_LEVEL (nullopt: info, unless --log-level)
  Setting<std::optional<double>> mpi_timeout_s;  // RINGATTN_MPI_TIMEOUT_S (nullopt: 300, unless --timeout)
  Setting<MpiProgress> mpi_progress;           // RINGATTN_MPI_PROGRESS
  Setting<FlashKernel> flash_kernel;           // RINGATTN_FLASH_KERNEL
  Setting<BackwardKernel> backward_kernel;     // RINGATTN_BACKWARD_KERNEL
  Setting<BackwardDq> backward_dq;             // RINGATTN_BACKWARD_DQ
  Setting<std::string> hopper_tile;            // RINGATTN_HOPPER_TILE ("" for auto)
  Setting<bool> hopper_lazy{true};             // RINGATTN_HOPPER_LAZY

  // The five kernel choices; throws the first refusal among them, in the order above.
  KernelChoices kernels() const;
  // The wait bound: `requested` when given, else RINGATTN_MPI_TIMEOUT_S, else 300 s (throws its
  // refusal only when it is needed).
  double timeout_s(std::optional<double> requested) const;
};

// What `ringattn --help-env` and README.md's table say of one variable.
struct SettingDoc {
  const char* name;
  std::string values;  // what it takes
  std::string fallback;  // the default
  const char* does;
};
const std::vector<SettingDoc>& setting_docs();  // every RINGATTN_* variable, in Settings' order

// The settings from `lookup` (a variable's value, nullptr when unset). Never throws: a value that
// does not parse becomes its Setting's refusal.
Settings parse_settings(const std::function<const char*(const char*)>& lookup);
// parse_settings over the environment now (std::getenv).
Settings settings_from_environment();
// The process's settings: settings_from_environment() on the first call, the same object after.
const Settings& settings();

}  // namespace ringattn

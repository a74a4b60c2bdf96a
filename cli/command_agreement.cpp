#include "cli/command_agreement.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "cli/flags.hpp"
#include "core/error.hpp"
#include "core/host.hpp"
#include "core/timer.hpp"
#include "runner/diagnostics/log.hpp"

namespace ringattn::cli {
namespace {

constexpr uint32_t kMagic = 0x434d444c;  // "CMDL"
constexpr uint32_t kVersion = 3;  // 3: field names of 48 bytes (the environment's fields)
constexpr size_t kMaxFields = 64;

// Fixed size and trivially copyable: one MPI_Iallgather of bytes, never truncated.
struct Record {
  uint32_t magic = kMagic, version = kVersion, nfields = 0, pad = 0;
  char command[16] = {};
  char error[256] = {};
  struct Field {
    char name[48] = {};
    char value[44] = {};
  } fields[kMaxFields];
};

void copy_text(char* dst, size_t n, const std::string& s) { std::strncpy(dst, s.c_str(), n - 1); }

// Long values (file paths) keep their start and a hash of the whole, so that they fit and still
// compare.
std::string fitted(const std::string& v, size_t room) {
  if (v.size() < room) return v;
  return fmt::format("{}...#{:08x}", v.substr(0, room - 13), uint32_t(std::hash<std::string>{}(v)));
}

}  // namespace

namespace {

// The environment's part of the agreement, after the flags: the fault plan (a rank that plans a
// fault skips the untimed warm-up exchange, so a plan on some ranks only would leave the others
// waiting) and the wait bound that --timeout or RINGATTN_MPI_TIMEOUT_S sets (every rank must give
// up on a peer alike). A refused value is the rank's early error, reported before these compare.
void add_environment(CommandFields& f, const CommandLine& cl, unsigned cmd) {
  const Settings& env = cl.env;
  f.emplace_back("RINGATTN_FAULT", !env.fault.refusal().empty() ? std::string("(refused)")
                                   : env.fault.get().empty()    ? std::string("none")
                                                                : env.fault.get());
  if ((cmd & (kRun | kBench)) == 0) return;
  const std::optional<double> asked = cmd == kBench ? cl.bench.problem.timeout_s : cl.run.problem.timeout_s;
  std::string bound = "(refused)";
  if (asked || env.mpi_timeout_s.refusal().empty()) bound = fmt::format("{:g} s", env.timeout_s(asked));
  f.emplace_back("wait bound (--timeout, RINGATTN_MPI_TIMEOUT_S)", bound);
}

}  // namespace

CommandFields command_fields(const CommandLine& cl) {
  CommandFields f;
  const unsigned cmd = command_bit(cl.command);
  for (const Flag* row : flags_of(cmd)) {
    if (row->agree == Agree::Local || row->alias_of != nullptr) continue;  // an alias fills its target's slot
    const std::string name = flag_name(*row) + (row->agree == Agree::Given ? " given" : "");
    f.emplace_back(name, flag_text(*row, cl, Cmd(cmd)));
  }
  add_environment(f, cl, cmd);
  return f;
}

namespace {

// "" when no rank failed; the common error when every rank failed alike; else the ranks and
// their errors, grouped by message.
std::string early_errors(const std::vector<CommandView>& all) {
  std::vector<std::pair<std::string, std::string>> groups;  // (message, "1, 3")
  bool all_alike = true;
  for (size_t r = 0; r < all.size(); ++r) {
    all_alike = all_alike && all[r].error == all[0].error;
    if (all[r].error.empty()) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == all[r].error; });
    if (it == groups.end()) groups.emplace_back(all[r].error, std::to_string(r));
    else it->second += ", " + std::to_string(r);
  }
  if (groups.empty()) return "";
  if (all_alike) return all[0].error;
  std::string msg = "ranks stopped before the start:";
  for (const auto& [error, ranks] : groups)
    msg += fmt::format(" rank{} {}: {};", ranks.find(',') == std::string::npos ? "" : "s", ranks, error);
  return msg + " the other ranks stop with them";
}

}  // namespace

std::string command_disagreement(const std::vector<CommandView>& all) {
  if (std::string e = early_errors(all); !e.empty()) return e;
  const int P = int(all.size());
  auto same = [](const CommandView& a, const CommandView& b) { return a.command == b.command && a.fields == b.fields; };
  // The reference is the record most ranks hold (ties: the lowest rank), so a single odd rank is
  // the one named, even when it is rank 0.
  int ref = 0, best = 0;
  for (int r = 0; r < P; ++r) {
    int votes = 0;
    for (int s = 0; s < P; ++s) votes += same(all[size_t(r)], all[size_t(s)]) ? 1 : 0;
    if (votes > best) best = votes, ref = r;
  }
  const CommandView& R = all[size_t(ref)];
  std::string msg;
  int differ = 0;
  for (int r = 0; r < P; ++r) {
    const CommandView& a = all[size_t(r)];
    if (same(a, R)) continue;
    ++differ;
    if (a.command != R.command) {
      msg += fmt::format(" rank {} runs `ringattn {}` where rank {} runs `ringattn {}`;", r, a.command, ref, R.command);
      continue;
    }
    for (size_t i = 0; i < std::max(a.fields.size(), R.fields.size()); ++i) {
      const auto fa = i < a.fields.size() ? a.fields[i] : std::pair<std::string, std::string>{"?", "?"};
      const auto fr = i < R.fields.size() ? R.fields[i] : std::pair<std::string, std::string>{"?", "?"};
      if (fa == fr) continue;
      msg += fmt::format(" rank {} has {} {} where rank {} has {} {};", r, fa.first, fa.second, ref, fr.first,
                         fr.second);
      break;
    }
  }
  if (differ == 0) return "";
  return fmt::format("ranks disagree on the command line ({} of {} differ from rank {}):{} start every rank with the "
                     "same subcommand and flags", differ, P, ref, msg);
}

namespace {

Record make_record(const CommandLine& cl, const std::string& error) {
  Record rec;
  copy_text(rec.error, sizeof(rec.error), error);
  copy_text(rec.command, sizeof(rec.command), cl.command);
  const CommandFields f = command_fields(cl);
  if (f.size() > kMaxFields) fail_runtime("internal: {} command fields exceed the record's {}", f.size(), kMaxFields);
  rec.nfields = uint32_t(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    copy_text(rec.fields[i].name, sizeof(rec.fields[i].name), f[i].first);
    copy_text(rec.fields[i].value, sizeof(rec.fields[i].value), fitted(f[i].second, sizeof(rec.fields[i].value)));
  }
  return rec;
}

CommandView view_of(const Record& rec) {
  CommandView v;
  if (rec.magic != kMagic || rec.version != kVersion || rec.nfields > kMaxFields) {
    v.command = fmt::format("<unknown record: another program or ringattn version, magic {:#x} version {}>", rec.magic,
                            rec.version);
    return v;
  }
  v.command.assign(rec.command, strnlen(rec.command, sizeof(rec.command)));
  v.error.assign(rec.error, strnlen(rec.error, sizeof(rec.error)));
  for (uint32_t i = 0; i < rec.nfields; ++i) {
    const Record::Field& f = rec.fields[i];
    v.fields.emplace_back(std::string(f.name, strnlen(f.name, sizeof(f.name))),
                          std::string(f.value, strnlen(f.value, sizeof(f.value))));
  }
  return v;
}

}  // namespace

void agree_on_command(const CommandLine& cl, const MpiSession& mpi, double timeout_s, const std::string& error) {
  if (!mpi.active()) return;
  int size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size == 1) {
    if (!error.empty()) throw CollectiveError(error);
    return;
  }
  const Record mine = make_record(cl, error);
  std::vector<Record> all(static_cast<size_t>(size));
  MPI_Request rq = MPI_REQUEST_NULL;
  if (MPI_Iallgather(&mine, int(sizeof(Record)), MPI_BYTE, all.data(), int(sizeof(Record)), MPI_BYTE, MPI_COMM_WORLD,
                     &rq) != MPI_SUCCESS)
    fail_runtime("rank {}: MPI_Iallgather of the start-up agreement failed", rank);
  const auto t0 = std::chrono::steady_clock::now();
  for (int done = 0;;) {
    MPI_Test(&rq, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (seconds_since(t0) > timeout_s)
      fail_runtime("rank {} on {}: not every rank joined the start-up agreement within {:g} s (--timeout, "
                   "RINGATTN_MPI_TIMEOUT_S): some rank runs another program, or stopped before it; start every rank "
                   "with the same ringattn subcommand and flags", rank, host_name(), timeout_s);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::vector<CommandView> views;
  for (const Record& r : all) views.push_back(view_of(r));
  if (const std::string e = command_disagreement(views); !e.empty()) throw CollectiveError(e);
}

}  // namespace ringattn::cli

// The one table of the command line's flags. Every flag of every subcommand is a row: its names,
// the field it fills (whose type picks the parser) and the check on its text, whether it changes
// the computation, how the ranks agree on it, whether it names a file, its JSON key and two
// sample values. Everything that has to know the flags is derived from the rows: the CLI11
// registration (options.cpp), the start-up agreement (command_agreement.cpp), the output-path
// checks (outputs.cpp), the flags line of the reports and the dry run, and the "flags" object of
// every JSON record. A new flag is agreed, reported and written once it has its row, and the
// agreement test (tests/cli/test_flag_agreement.cpp) walks the rows.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/options.hpp"

namespace ringattn::cli {

// The subcommands, as bits of Flag::commands.
enum Cmd : unsigned { kRun = 1, kBench = 2, kPlan = 4 };
// The subcommand named `name` ("run", "bench", "plan"); 0 for any other (help, version).
unsigned command_bit(const std::string& name);

// How the ranks of one job agree on a flag before their first exchange.
enum class Agree : uint8_t {
  Value,  // every rank holds the same value: it changes what the ranks compute, or which files
          // they read, or which collectives they call
  Given,  // every rank agrees whether it is given: a file only rank 0 writes, whose contents
          // every rank helps gather; the path itself is rank 0's
  Local,  // this rank's own (its log level): not agreed
};

// Whether the flag names a file, and which kind: .npy tensors are read or written in --layout.
enum class Io : uint8_t { None, InputTensor, OutputTensor, InputFile, OutputFile };

// The check on a flag's text (after the decimal-number transforms every numeric flag gets).
enum class Check : uint8_t {
  None,
  Range,    // an integer in lo..hi (hi 0: the largest of the field's type)
  Choice,   // one of `choices`
  Seconds,  // a wait bound: >= kMinTimeoutS and <= kMaxTimeoutS
  Layout,   // bhsd | bshd
  Factor,   // a number in 1.01..1e6 (the sweep factor)
};

// The field a row fills, by type.
template <class T>
using Field = T& (*)(CommandLine&, Cmd);
using Target = std::variant<Field<bool>, Field<int>, Field<int64_t>, Field<uint64_t>, Field<double>,
                            Field<std::string>, Field<std::optional<int64_t>>, Field<std::optional<double>>>;

struct Flag {
  const char* names;  // CLI11's: "--seq", "-b,--seq-min"; "!--no-check" is a negated bool
  unsigned commands;  // the Cmd bits of the subcommands that take it
  Target target;
  Agree agree = Agree::Value;
  bool computes = true;  // changes out, lse or the gradients (else: files, checks, reports, timing)
  Io io = Io::None;
  const char* json_key = nullptr;  // in the "flags" object of the JSON records; null for an alias
  const char* help = "";
  Check check = Check::None;
  int64_t lo = 0, hi = 0;                 // Check::Range
  std::vector<const char*> choices = {};  // Check::Choice
  bool show_default = false;              // --help prints the default
  const char* unset = "none";             // the text of an empty string or unset optional
  const char* needs = nullptr;            // a flag without which this one does nothing
  const char* alias_of = nullptr;         // a flag without a value that sets alias_of to alias_value
  const char* alias_value = nullptr;
  // Two values that differ and that the command takes (with the flags the row needs, which the
  // agreement test adds): it starts one rank with each (nullptr for the first: the flag left out; a bool
  // takes no value, so both are nullptr and one rank gives the flag).
  const char* samples[2] = {nullptr, nullptr};
};

// Every row, in the order --help lists them.
const std::vector<Flag>& flag_table();
// The rows of one subcommand (Cmd bit).
std::vector<const Flag*> flags_of(unsigned cmd);

// "--seq-min" of "-b,--seq-min": the long name the messages, the record and the report use.
std::string flag_name(const Flag& f);
bool flag_is_bool(const Flag& f);

// Adds the rows of `cmd` to `app`, bound to `cl`'s fields.
void add_flags(CLI::App& app, CommandLine& cl, Cmd cmd);

// The flag's value as text ("yes"/"no" for a bool, f.unset for an empty string), or the
// agreement's "yes"/"no" of whether it is given for Agree::Given; as JSON (null when unset).
std::string flag_text(const Flag& f, const CommandLine& cl, Cmd cmd);
nlohmann::json flag_json(const Flag& f, const CommandLine& cl, Cmd cmd);

// The flags given on the command line of cl.command, as "NAME VALUE" (a bool: "NAME"), in table
// order: the flags line of the reports and the dry run.
std::string given_flags_line(const CommandLine& cl);
// {json_key: value} for every row of cl.command (aliases left out): the records' "flags".
nlohmann::json flags_json(const CommandLine& cl);

}  // namespace ringattn::cli

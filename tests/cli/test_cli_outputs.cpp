// Output files: written whole or not at all (AtomicFile, NpyWriter), checked before any compute
// (check_output_paths), and the ranks' start-up agreement on the command line.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/command_agreement.hpp"
#include "cli/outputs.hpp"
#include "common/test_util.hpp"
#include "runner/io/atomic_file.hpp"
#include "core/error.hpp"
#include "runner/io/npy.hpp"

namespace ringattn::cli {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed at the end.
struct TempDir {
  fs::path dir;
  explicit TempDir(const std::string& tag)
      : dir(fs::temp_directory_path() / ("ringattn_out_" + tag + "_" + std::to_string(getpid()))) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
  size_t entries() const { return size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator())); }
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(AtomicFile, NothingAppearsUntilCommit) {
  TempDir d("commit");
  const std::string path = d / "x.txt";
  {
    std::ofstream(path) << "old";
    AtomicFile f(path);
    f.write("new contents", 12);
    EXPECT_EQ(slurp(path), "old");  // the destination is untouched until commit
  }
  EXPECT_EQ(slurp(path), "old");  // destroyed without commit: the old file stays, no temporary is left
  EXPECT_EQ(d.entries(), 1u);
  AtomicFile f(path);
  f.write("new contents", 12);
  f.commit();
  EXPECT_EQ(slurp(path), "new contents");
  EXPECT_EQ(d.entries(), 1u);
}

// The outputs of one run appear together or not at all: a set destroyed before commit() (a later
// output failed) leaves none of its files, not even the finished ones.
TEST(FileSet, AllOrNone) {
  TempDir d("set");
  {
    FileSet set;
    NpyWriter a(d / "dq.npy", {2}, DType::F32);
    const float x[2] = {1, 2};
    a.write(x, 2);
    set.add(a.release_finished());
    auto j = std::make_unique<AtomicFile>(d / "r.json");
    j->write("{}", 2);
    set.add(std::move(j));
    EXPECT_EQ(d.entries(), 2u);  // two finished temporary files, nothing at the destinations
    EXPECT_FALSE(fs::exists(d / "dq.npy"));
  }
  EXPECT_EQ(d.entries(), 0u);
  FileSet set;
  auto j = std::make_unique<AtomicFile>(d / "r.json");
  j->write("{}", 2);
  set.add(std::move(j));
  set.commit();
  EXPECT_EQ(slurp(d / "r.json"), "{}");
  EXPECT_EQ(d.entries(), 1u);
}

// A SIGTERM (or SIGINT, SIGHUP) that ends the process while a file is being written, finished or
// not, leaves no temporary file behind, and the process still dies of the signal.
TEST(AtomicFile, ASignalLeavesNoPartialFile) {
  for (const int sig : {SIGTERM, SIGINT, SIGHUP}) {
    TempDir d("signal");
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      AtomicFile open_one(d / "a.npy");
      open_one.write("abc", 3);
      auto finished = std::make_unique<AtomicFile>(d / "b.npy");
      finished->write("abc", 3);
      FileSet set;
      set.add(std::move(finished));
      ::raise(sig);
      _exit(0);  // not reached
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFSIGNALED(status)) << "signal " << sig << ": status " << status;
    if (WIFSIGNALED(status)) EXPECT_EQ(WTERMSIG(status), sig);
    EXPECT_EQ(d.entries(), 0u) << "signal " << sig;
  }
}

TEST(AtomicFile, RefusesMissingDirectoriesAndDevices) {
  TempDir d("refuse");
  EXPECT_EQ(error_of([&] { AtomicFile f(d / "nodir/x.npy"); }),
            fmt::format("cannot write '{}': its directory '{}' does not exist", d / "nodir/x.npy", d / "nodir"));
  EXPECT_EQ(error_of([] { AtomicFile f("/dev/full"); }),
            "cannot write '/dev/full': it exists and is not a regular file (a device or pipe)");
  EXPECT_EQ(error_of([&] { AtomicFile f(d.dir.string()); }),
            fmt::format("cannot write '{}': it is a directory", d.dir.string()));
}

// A destination that is a symbolic link: the file it links to is replaced (created when the link
// dangles), the link stays a link; a link to a device is refused like the device.
TEST(AtomicFile, WritesThroughSymbolicLinks) {
  TempDir d("links");
  fs::create_directories(d / "real");
  std::ofstream(d / "real/target.json") << "old";
  fs::create_symlink("real/target.json", d / "link.json");
  fs::create_symlink(d / "link.json", d / "link2.json");  // a link to a link
  write_file_atomically(d / "link2.json", "new");
  EXPECT_TRUE(fs::is_symlink(d / "link.json"));
  EXPECT_TRUE(fs::is_symlink(d / "link2.json"));
  EXPECT_EQ(slurp(d / "real/target.json"), "new");
  fs::create_symlink("real/fresh.json", d / "dangling.json");
  write_file_atomically(d / "dangling.json", "fresh");
  EXPECT_TRUE(fs::is_symlink(d / "dangling.json"));
  EXPECT_EQ(slurp(d / "real/fresh.json"), "fresh");
  EXPECT_EQ(resolve_output_path(d / "link2.json"), d / "real/target.json");
  fs::create_symlink("/dev/null", d / "null.json");
  EXPECT_EQ(error_of([&] { AtomicFile f(d / "null.json"); }),
            fmt::format("cannot write '{}': it exists and is not a regular file (a device or pipe)", d / "null.json"));
  EXPECT_TRUE(fs::is_symlink(d / "null.json"));
  fs::create_symlink("nodir/x.json", d / "nowhere.json");
  EXPECT_EQ(error_of([&] { AtomicFile f(d / "nowhere.json"); }),
            fmt::format("cannot write '{}': it links to '{}': its directory '{}' does not exist", d / "nowhere.json",
                        d / "nodir/x.json", d / "nodir"));
  // A loop of links is refused and left as it is (the rename replaced it by a file).
  fs::create_symlink("loop_b.json", d / "loop_a.json");
  fs::create_symlink("loop_a.json", d / "loop_b.json");
  EXPECT_EQ(error_of([&] { AtomicFile f(d / "loop_a.json"); }),
            fmt::format("cannot write '{}': its symbolic links form a loop or a chain of more than 40; give the file "
                        "itself", d / "loop_a.json"));
  EXPECT_TRUE(fs::is_symlink(d / "loop_a.json"));
  EXPECT_TRUE(fs::is_symlink(d / "loop_b.json"));
}

TEST(AtomicFile, AFailedRenameLeavesNothing) {
  TempDir d("rename");
  const std::string path = d / "x.npy";
  NpyWriter w(path, {2}, DType::F32);
  const float x[2] = {1, 2};
  w.write(x, 2);
  w.finish();
  fs::create_directories(path + "/inner");  // a non-empty directory appears there: the rename must fail
  const std::string e = error_of([&] { w.close(); });
  EXPECT_NE(e.find("writing '" + path + "' failed: renaming the finished temporary file onto it"), std::string::npos)
      << e;
  EXPECT_TRUE(fs::is_directory(path + "/inner"));
  EXPECT_EQ(d.entries(), 1u);  // the temporary file is gone
}

TEST(AtomicFile, NpyWriterShortOfElementsWritesNothing) {
  TempDir d("short");
  const std::string path = d / "o.npy";
  {
    NpyWriter w(path, {4}, DType::F32);
    const float x[2] = {1, 2};
    w.write(x, 2);
    EXPECT_EQ(error_of([&] { w.close(); }), path + ": 2 elements written but the shape holds 4");
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(d.entries(), 0u);
}

TEST(OutputPaths, AliasesAndInputsAreRefused) {
  TempDir d("alias");
  std::ofstream(d / "q.npy") << "x";
  fs::create_hard_link(d / "q.npy", d / "q_link.npy");
  const std::string same = d / "same.npy";
  EXPECT_EQ(error_of([&] { check_output_paths({{"--out", same}, {"--lse", same}}, {}); }),
            fmt::format("--out {} and --lse {} name the same file: each output needs a file of its own", same, same));
  EXPECT_EQ(error_of([&] { check_output_paths({{"--out", same}, {"--lse", d / "./same.npy"}}, {}); }).find("same file") !=
                std::string::npos,
            true);
  EXPECT_EQ(error_of([&] { check_output_paths({{"--out", d / "q_link.npy"}}, {{"--q", d / "q.npy"}}); }),
            fmt::format("--out {} is the input file of --q {}: writing it would overwrite the input; choose another "
                        "name", d / "q_link.npy", d / "q.npy"));
  EXPECT_EQ(error_of([&] { check_output_paths({{"--json", "/dev/full"}}, {}); }),
            "--json /dev/full: cannot write the output there: it exists and is not a regular file (a device or pipe)");
  EXPECT_EQ(error_of([&] { check_output_paths({{"--out", d / "o.npy"}, {"--lse", d / "l.npy"}, {"--json", "-"}},
                                              {{"--q", d / "q.npy"}}); }),
            "");
}

TEST(CommandAgreement, NamesTheRanksAndTheField) {
  CommandLine a, b, c;
  a.command = b.command = c.command = "run";
  b.run.problem.seed = 7;
  const CommandView va{"run", command_fields(a)}, vb{"run", command_fields(b)};
  EXPECT_EQ(command_disagreement({va, va, va}), "");
  EXPECT_EQ(command_disagreement({va, vb, va}),
            "ranks disagree on the command line (1 of 3 differ from rank 0): rank 1 has --seed 7 where rank 0 has "
            "--seed 1; start every rank with the same subcommand and flags");
  // The majority is the reference, even against rank 0.
  EXPECT_NE(command_disagreement({vb, va, va}).find("rank 0 has --seed 7 where rank 1 has --seed 1"),
            std::string::npos);
  c.command = "bench";
  EXPECT_NE(command_disagreement({va, CommandView{"bench", command_fields(c)}})
                .find("rank 1 runs `ringattn bench` where rank 0 runs `ringattn run`"),
            std::string::npos);
  c.command = "run";
  c.run.dry_run = true;
  EXPECT_NE(command_disagreement({va, CommandView{"run", command_fields(c)}})
                .find("rank 1 has --dry-run yes where rank 0 has --dry-run no"),
            std::string::npos);
}

TEST(CommandAgreement, ErrorsBeforeMpiStopEveryRank) {
  CommandLine a;
  a.command = "run";
  const CommandView ok{"run", command_fields(a), ""};
  const CommandView bad{"run", {}, "--seq: must be an integer >= 1 (got '0')"};
  const CommandView other{"", {}, "RINGATTN_FAULT='x' is not RANK:HOP:KIND"};
  // Every rank failed alike: the error itself, printed once.
  EXPECT_EQ(command_disagreement({bad, bad}), bad.error);
  EXPECT_EQ(command_disagreement({ok, bad, other, bad}),
            "ranks stopped before the start: ranks 1, 3: --seq: must be an integer >= 1 (got '0'); rank 2: "
            "RINGATTN_FAULT='x' is not RANK:HOP:KIND; the other ranks stop with them");
}

}  // namespace
}  // namespace ringattn::cli

// Fault-plan parsing and the flight recorder.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "runner/faults/fault.hpp"
#include "runner/diagnostics/flight_recorder.hpp"

namespace ringattn {
namespace {

TEST(FaultPlan, ParsesEveryKind) {
  EXPECT_FALSE(parse_fault_plan("").active());
  const FaultPlan p = parse_fault_plan("3:1:corrupt");
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.hop, 1);
  EXPECT_EQ(p.kind, FaultKind::Corrupt);
  EXPECT_EQ(parse_fault_plan("0:0:exit").kind, FaultKind::Exit);
  EXPECT_EQ(parse_fault_plan("1:2:hang").kind, FaultKind::Hang);
  EXPECT_EQ(parse_fault_plan("1:2:error").kind, FaultKind::Error);
}

TEST(FaultPlan, ParsesThePhase) {
  const FaultPlan b = parse_fault_plan("1:0:throw:backward");
  EXPECT_EQ(b.phase, FaultPhase::Backward);
  EXPECT_EQ(b.kind, FaultKind::Throw);
  EXPECT_EQ(b.text(), "RINGATTN_FAULT=1:0:throw:backward");
  EXPECT_EQ(parse_fault_plan("1:0:exit").phase, FaultPhase::Forward);
  const FaultPlan f = parse_fault_plan("1:0:exit:forward");
  EXPECT_EQ(f.phase, FaultPhase::Forward);
  EXPECT_EQ(f.text(), "RINGATTN_FAULT=1:0:exit");
  const FaultPlan g = parse_fault_plan("2:3:corrupt:grads");
  EXPECT_EQ(g.phase, FaultPhase::Grads);
  EXPECT_EQ(g.text(), "RINGATTN_FAULT=2:3:corrupt:grads");
  try {
    parse_fault_plan("1:0:exit:sideways");
    ADD_FAILURE() << "accepted an unknown phase";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "RINGATTN_FAULT='1:0:exit:sideways' is not RANK:HOP:KIND[:PHASE]: unknown phase 'sideways' "
                           "(allowed: forward, the default, backward, the ring backward's K/V ring, and grads, its dK/dV ring)");
  }
}

TEST(FaultPlan, RejectsMalformedText) {
  for (const char* bad :
       {"1:2", "a:1:exit", "1:-2:exit", "1:2:explode", "1:2:exit:4", "::exit", "1:2:", "1:2:exit:", "1:2:exit:grad"}) {
    try {
      parse_fault_plan(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("RANK:HOP:KIND"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

GlobalProblem ring_problem(int64_t n, bool causal, Sharding s, Window w = {}) {
  GlobalProblem p;
  p.batch = 1, p.q_heads = 2, p.kv_heads = 1, p.head_dim = 16, p.q_len = p.kv_len = n;
  p.causal = causal;
  p.sharding = s;
  p.window = w;
  return p;
}

std::string refusal(const char* plan, const GlobalProblem& p, int world, bool backward = false) {
  try {
    std::optional<RingPlan> ring;
    if (p.is_ring()) ring.emplace(ring_plan(p, world));
    check_fault_plan(parse_fault_plan(plan), p, ring ? &*ring : nullptr, world, backward);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// A plan is refused unless the rank does, at that hop of that ring, what the kind hooks into:
// posts an exchange (exit, hang, error), sends a block (corrupt), computes (throw). Issue 39's
// repros, each with the hops the plan could fire at.
TEST(FaultPlan, RefusesPlansThatCanNeverFire) {
  const GlobalProblem windowed = ring_problem(512, true, Sharding::Contiguous, Window{16, 0});
  EXPECT_EQ(refusal("2:2:exit", windowed, 4),
            "RINGATTN_FAULT=2:2:exit can never fire: rank 2 posts no exchange at hop 2 of the forward ring (this "
            "problem's ring takes 2 hops over 4 ranks); on rank 2, exit can fire at hop 0");
  EXPECT_EQ(refusal("2:0:exit", windowed, 4), "");
  EXPECT_EQ(refusal("2:1:throw", windowed, 4), "");  // the last hop of a short ring computes
  EXPECT_EQ(refusal("0:1:throw:backward", windowed, 4, true),
            "RINGATTN_FAULT=0:1:throw:backward can never fire: rank 0 computes on no block at hop 1 of the backward "
            "ring (this problem's ring takes 2 hops over 4 ranks); on rank 0, throw can fire at hop 0");
  const GlobalProblem causal = ring_problem(512, true, Sharding::Contiguous);
  EXPECT_EQ(refusal("0:1:throw", causal, 2),
            "RINGATTN_FAULT=0:1:throw can never fire: rank 0 computes on no block at hop 1 of the forward ring (this "
            "problem's ring takes 2 hops over 2 ranks); on rank 0, throw can fire at hop 0");
  EXPECT_EQ(refusal("1:1:throw", causal, 2), "");
  // Causal contiguous: rank 1's block is needed by no other rank, so it sends nothing at hop 0.
  EXPECT_EQ(refusal("1:0:corrupt", causal, 2),
            "RINGATTN_FAULT=1:0:corrupt can never fire: rank 1 sends no block at hop 0 of the forward ring (this "
            "problem's ring takes 2 hops over 2 ranks); on rank 1, corrupt can fire at no hop");
  EXPECT_EQ(refusal("0:0:corrupt", causal, 2), "");
  const GlobalProblem full = ring_problem(64, false, Sharding::Zigzag);
  EXPECT_EQ(refusal("3:2:hang", full, 4), "");
  EXPECT_EQ(refusal("3:3:hang", full, 4),
            "RINGATTN_FAULT=3:3:hang can never fire: rank 3 posts no exchange at hop 3 of the forward ring (this "
            "problem's ring takes 4 hops over 4 ranks); on rank 3, hang can fire at hops 0..2");
  EXPECT_EQ(refusal("0:0:exit", full, 1),
            "RINGATTN_FAULT=0:0:exit can never fire: rank 0 posts no exchange at hop 0 of the forward ring (this "
            "problem's ring takes 1 hop over 1 rank); on rank 0, exit can fire at no hop");
  EXPECT_EQ(refusal("0:0:throw:backward", full, 1, true), "");
  EXPECT_EQ(refusal("1:0:exit:backward", full, 2),
            "RINGATTN_FAULT=1:0:exit:backward names the backward ring, but this run has none (the phase backward "
            "needs --backward)");
  EXPECT_EQ(refusal("4:0:exit", full, 4), "RINGATTN_FAULT=4:0:exit names rank 4, but the world has 4 ranks (0..3)");
}

// The dK/dV ring (phase grads) has its own hops: exchange s (1..P) runs when some accumulator
// travels in it (hop 1's never does: hop 0's gradients stay home), a rank sends in it when the
// accumulator it passes on holds rows, and it folds (throw) where it received one, at a hop that
// computed or at P, which brings its own accumulator home.
TEST(FaultPlan, RefusesGradsPlansThatCanNeverFire) {
  // Causal contiguous over 2 ranks: only rank 0's block is seen remotely (by rank 1, at hop 1), so
  // only exchange 2 runs, rank 1 sending rank 0's accumulator home.
  const GlobalProblem causal = ring_problem(512, true, Sharding::Contiguous);
  EXPECT_EQ(refusal("1:2:corrupt:grads", causal, 2, true), "");
  EXPECT_EQ(refusal("0:2:throw:grads", causal, 2, true), "");
  EXPECT_EQ(refusal("1:2:exit:grads", causal, 2, true), "");
  EXPECT_EQ(refusal("0:1:exit:grads", causal, 2, true),
            "RINGATTN_FAULT=0:1:exit:grads can never fire: rank 0 posts no dK/dV exchange at hop 1 of the grads ring "
            "(the dK/dV accumulators of this problem travel at hop 2 over 2 ranks); on rank 0, exit can fire at hop 2");
  EXPECT_EQ(refusal("0:2:corrupt:grads", causal, 2, true),
            "RINGATTN_FAULT=0:2:corrupt:grads can never fire: rank 0 sends no accumulator at hop 2 of the grads ring "
            "(the dK/dV accumulators of this problem travel at hop 2 over 2 ranks); on rank 0, corrupt can fire at no "
            "hop");
  EXPECT_EQ(refusal("1:2:throw:grads", causal, 2, true),
            "RINGATTN_FAULT=1:2:throw:grads can never fire: rank 1 folds in no received accumulator at hop 2 of the "
            "grads ring (the dK/dV accumulators of this problem travel at hop 2 over 2 ranks); on rank 1, throw can "
            "fire at no hop");
  // A window over 4 ranks: the K/V ring takes 2 hops, but the accumulators of blocks 0..2 travel
  // on to their homes (hops 2..4); block 3's is seen by no other rank and never travels.
  const GlobalProblem windowed = ring_problem(512, true, Sharding::Contiguous, Window{16, 0});
  EXPECT_EQ(refusal("2:3:hang:grads", windowed, 4, true), "");
  EXPECT_EQ(refusal("0:4:throw:grads", windowed, 4, true), "");
  EXPECT_EQ(refusal("1:3:corrupt:grads", windowed, 4, true),
            "RINGATTN_FAULT=1:3:corrupt:grads can never fire: rank 1 sends no accumulator at hop 3 of the grads ring "
            "(the dK/dV accumulators of this problem travel at hops 2..4 over 4 ranks); on rank 1, corrupt can fire at "
            "hops 2, 4");
  EXPECT_EQ(refusal("1:3:throw:grads", windowed, 4, true),
            "RINGATTN_FAULT=1:3:throw:grads can never fire: rank 1 folds in no received accumulator at hop 3 of the "
            "grads ring (the dK/dV accumulators of this problem travel at hops 2..4 over 4 ranks); on rank 1, throw "
            "can fire at hop 4");
  EXPECT_EQ(refusal("3:4:throw:grads", windowed, 4, true),
            "RINGATTN_FAULT=3:4:throw:grads can never fire: rank 3 folds in no received accumulator at hop 4 of the "
            "grads ring (the dK/dV accumulators of this problem travel at hops 2..4 over 4 ranks); on rank 3, throw "
            "can fire at no hop");
  const GlobalProblem full = ring_problem(64, false, Sharding::Zigzag);
  EXPECT_EQ(refusal("3:1:error:grads", full, 4, true),
            "RINGATTN_FAULT=3:1:error:grads can never fire: rank 3 posts no dK/dV exchange at hop 1 of the grads ring "
            "(the dK/dV accumulators of this problem travel at hops 2..4 over 4 ranks); on rank 3, error can fire at "
            "hops 2..4");
  EXPECT_EQ(refusal("3:5:error:grads", full, 4, true),
            "RINGATTN_FAULT=3:5:error:grads can never fire: rank 3 posts no dK/dV exchange at hop 5 of the grads ring "
            "(the dK/dV accumulators of this problem travel at hops 2..4 over 4 ranks); on rank 3, error can fire at "
            "hops 2..4");
  for (const char* plan : {"3:2:exit:grads", "3:3:throw:grads", "3:4:corrupt:grads", "0:4:error:grads"})
    EXPECT_EQ(refusal(plan, full, 4, true), "") << plan;
  // One rank: the backward has no second ring.
  EXPECT_EQ(refusal("0:1:exit:grads", full, 1, true),
            "RINGATTN_FAULT=0:1:exit:grads can never fire: rank 0 posts no dK/dV exchange at hop 1 of the grads ring "
            "(the dK/dV accumulators of this problem travel at no hop over 1 rank); on rank 0, exit can fire at no "
            "hop");
  EXPECT_EQ(refusal("1:2:exit:grads", full, 2),
            "RINGATTN_FAULT=1:2:exit:grads names the grads ring, but this run has none (the phase grads needs "
            "--backward)");
}

TEST(FlightRecorder, KeepsTheLastEventsInOrder) {
  FlightRecorder r(4);
  for (int hop = 0; hop < 6; ++hop) r.record(hop, HopEvent::Posted, hop + 1, 100u * unsigned(hop));
  const auto ev = r.events();
  ASSERT_EQ(ev.size(), 4u);
  for (size_t i = 0; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].hop, int(i) + 2);
    EXPECT_EQ(ev[i].peer, int(i) + 3);
    if (i > 0) {
      EXPECT_GE(ev[i].t, ev[i - 1].t);
    }
  }
  const std::string d = r.dump();
  EXPECT_NE(d.find("hop 5 posted peer 6 500 bytes"), std::string::npos) << d;
  EXPECT_EQ(d.find("hop 1 "), std::string::npos) << d;
  r.clear();
  EXPECT_TRUE(r.events().empty());
}

// A pass names its phase: the events after begin_pass carry it, and the dump says which ring.
TEST(FlightRecorder, PassesNameTheirRing) {
  FlightRecorder r(8);
  const uint64_t before = r.pass();
  r.begin_pass(RingPhase::Forward);
  r.record(1, HopEvent::Posted, 2, 10);
  r.begin_pass(RingPhase::Backward);
  r.record(1, HopEvent::Failed);
  EXPECT_EQ(r.pass(), before + 2);
  EXPECT_EQ(r.phase(), RingPhase::Backward);
  const auto ev = r.events();
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].phase, RingPhase::Forward);
  EXPECT_EQ(ev[1].phase, RingPhase::Backward);
  const std::string d = r.dump();
  EXPECT_NE(d.find("s hop 1 posted peer 2 10 bytes\n"), std::string::npos) << d;
  EXPECT_NE(d.find("s backward hop 1 failed\n"), std::string::npos) << d;
}

}  // namespace
}  // namespace ringattn

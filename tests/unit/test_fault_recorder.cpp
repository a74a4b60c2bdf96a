// Fault-plan parsing and the flight recorder.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "ringattn/fault.hpp"
#include "ringattn/flight_recorder.hpp"

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

TEST(FaultPlan, RejectsMalformedText) {
  for (const char* bad : {"1:2", "a:1:exit", "1:-2:exit", "1:2:explode", "1:2:exit:4", "::exit", "1:2:"}) {
    try {
      parse_fault_plan(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("RANK:HOP:KIND"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
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

}  // namespace
}  // namespace ringattn

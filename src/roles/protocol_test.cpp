// The control bodies of the runtime protocol: round trips and refusal of malformed or hostile input.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "protocol.h"

namespace deloco::proto {
namespace {

TEST(Protocol, HelloWelcomeBeatLeaveRoundTrip) {
  Hello h{3, 0xdeadbeefcafef00dull, 1234, false};
  auto s = encode_hello(h);
  Hello g = parse_hello(s.data(), s.size());
  EXPECT_EQ(g.learner, 3);
  EXPECT_EQ(g.instance, h.instance);
  EXPECT_EQ(g.step, 1234);
  EXPECT_FALSE(g.want_state);

  Welcome w;
  w.round = 17;
  w.versions = {4, 5};
  w.resume_step = 99;
  w.chunks = 3;
  w.chunk_elements = 10;
  w.elements = 25;
  w.state_hash = 0x0123456789abcdefull;
  s = encode_welcome(w);
  Welcome v = parse_welcome(s.data(), s.size());
  EXPECT_EQ(v.round, 17u);
  EXPECT_EQ(v.versions, w.versions);
  EXPECT_EQ(v.chunks, 3);
  EXPECT_EQ(v.state_hash, w.state_hash);

  Beat b{10, 2560, 1.5, 0.02};
  s = encode_beat(b);
  Beat c = parse_beat(s.data(), s.size());
  EXPECT_EQ(c.step, 10);
  EXPECT_DOUBLE_EQ(c.busy_seconds, 1.5);
  s = encode_leave("done");
  EXPECT_EQ(parse_leave(s.data(), s.size()), "done");
}

TEST(Protocol, RefusesMalformedBodiesNamingTheField) {
  auto expect_error = [](const std::string& body, const char* needle, auto parse) {
    try {
      parse(body.data(), body.size());
      ADD_FAILURE() << "accepted: " << body;
    } catch (const WireError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("not json", "not a JSON object", parse_hello);
  expect_error("[1,2]", "not a JSON object", parse_hello);
  expect_error(R"({"instance":"00000000000000aa","step":0,"want_state":true})", "'learner'", parse_hello);
  expect_error(R"({"learner":-1,"instance":"00000000000000aa","step":0,"want_state":true})", "out of range", parse_hello);
  expect_error(R"({"learner":1,"instance":"xyz","step":0,"want_state":true})", "", parse_hello);
  expect_error(R"({"learner":1,"instance":"00000000000000aa","step":0,"want_state":1})", "want_state", parse_hello);
  expect_error(R"({"step":1,"tokens":1,"busy_seconds":-1,"step_time":0})", "busy_seconds", parse_beat);
  expect_error(R"({"reason":"explode"})", "leave reason", parse_leave);
  expect_error(std::string(kMaxControlBytes + 1, ' '), "exceeds", parse_hello);
  // chunks that do not cover the elements
  expect_error(R"({"round":1,"versions":[1],"resume_step":0,"chunks":2,"chunk_elements":10,"elements":50,"state_hash":"0000000000000001"})",
               "cover", parse_welcome);
}

TEST(Protocol, LayoutFlattensAndUnflattensExactly) {
  std::vector<at::Tensor> ts{torch::randn({3, 4}), torch::randn({5}), torch::randn({2, 2, 2})};
  Layout l = make_flat_layout({"a", "b", "c"}, ts);
  EXPECT_EQ(l.elements, 12 + 5 + 8);
  at::Tensor flat = torch::empty({l.elements});
  flatten_into(ts, flat.data_ptr<float>());
  auto back = unflatten(flat, l);
  ASSERT_EQ(back.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(back[i], ts[i]));
}

}  // namespace
}  // namespace deloco::proto

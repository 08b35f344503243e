// The standby's journal (replication.h): a standby that applies what the leader journaled — through the wire
// encoding — holds the leader's Θ, outer state and decisions bit for bit, merge after merge, also when it follows
// late from an image; malformed entries are refused naming the problem.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>

#include "deloco/learner.h"
#include "replication.h"
#include "wire/quantize.h"

namespace deloco::repl {
namespace replication_cases {

struct Model {
  std::vector<std::pair<std::string, at::Tensor>> global;
  std::vector<Fragment> fragments;
  std::vector<FlatLayout> layouts;
};

Model model() {
  torch::manual_seed(7);
  Model m;
  m.global = {{"w1", torch::randn({8, 6})}, {"b1", torch::randn({6})}, {"w2", torch::randn({6, 5})}, {"b2", torch::randn({5})}};
  std::vector<std::pair<std::string, int64_t>> sizes;
  for (const auto& [n, t] : m.global) sizes.emplace_back(n, t.numel() * 4);
  m.fragments = plan_fragments(sizes, 2, 10);
  for (const auto& f : m.fragments) {
    std::vector<at::Tensor> ts;
    for (const auto& n : f.names)
      for (const auto& [gn, t] : m.global)
        if (gn == n) ts.push_back(t);
    m.layouts.push_back(make_flat_layout(f.names, ts));
  }
  return m;
}

SyncOptions options() {
  SyncOptions o;
  o.learners = 3;
  o.quorum = 2;  // K < M: bases fall behind, so kept versions and staleness matter
  o.fragments = 2;
  o.grace = true;
  o.staleness = "poly";
  o.staleness_exponent = 0.5;
  o.dynamic_local_updates = true;
  o.overlap = 2;  // τ > 0: the grace window can open
  o.wait_for_answer = false;  // Decoupled DiLoCo
  return o;
}

// Encodes, sends over "the wire" (bytes) and decodes, as the nodes do.
Entry wire_trip(const Entry& e, int64_t learners, int64_t fragments) {
  const EncodedEntry enc = encode(e, 0xabcdef);
  const Bytes payload = Bytes::copy(enc.payload.data(), enc.payload.size());
  return decode(enc.header, payload, learners, fragments);
}

// The leader: journals each entry (Journal::record, as SyncerNode::Impl::journal does), and leaves in `e` what the
// standby would read of it: the frame the journal queued, decoded.
struct Leader {
  Syncer core;
  std::vector<FlatLayout> layouts;
  Journal journal;
  Applied run(Entry& e) {
    Applied a = journal.record(core, layouts, e, /*epoch=*/1, /*replicate=*/true, 0xabcdef, WireLimits{});
    const std::vector<proto::Frame> frames = journal.take_frames();
    EXPECT_EQ(frames.size(), 1u);
    const MessageHeader h = decode_header(frames[0].header.data(), frames[0].header.size(), WireLimits{});
    e = decode(h, frames[0].payload, 3, 2);
    EXPECT_EQ(e.seq, journal.seq());
    return a;
  }
};

std::vector<float> flat_of(const Syncer& s) {
  std::vector<float> out;
  for (const auto& [n, t] : s.global()) {
    auto c = t.contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

// A random but reproducible stream of pushes from 3 learners against the versions they last saw, int4 on the wire,
// rounds, a disconnection and a retirement.
struct Driver {
  std::mt19937 rng{11};
  std::vector<std::vector<int64_t>> seen;  // [learner][fragment] version last received
  Driver() : seen(3, std::vector<int64_t>(2, 0)) {}
  Entry push(const Model& m, double t, int64_t learner, int64_t p) {
    std::normal_distribution<float> g(0.0f, 0.01f);
    std::vector<float> d(static_cast<size_t>(m.layouts[p].elements));
    for (auto& x : d) x = g(rng);
    Entry e;
    e.kind = EntryKind::kReceive;
    e.t = t;
    e.learner = learner;
    e.fragment = p;
    e.encoding = Encoding::kInt4;
    e.base = seen[learner][p];
    e.c_steps = 10;
    e.c_tokens = 10 * 64;
    e.step = 10 * static_cast<int64_t>(t);
    e.step_time = 2.0 + 1.0 * static_cast<double>(learner);  // slow steps: τ·ξ_step exceeds the quorum wait
    e.payload = Bytes::from_string(encode_floats(d.data(), d.size(), Encoding::kInt4));
    return e;
  }
};

TEST(Replication, AStandbyThatAppliesTheJournalHoldsTheLeadersStateBitForBit) {
  const Model m = model();
  Leader leader{Syncer(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{}), m.layouts};
  Syncer standby(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  Driver d;
  int64_t merges = 0, checked = 0;
  for (int64_t step = 1; step <= 60; ++step) {
    const double t = 0.37 * static_cast<double>(step);
    std::vector<Entry> batch;
    const int64_t learner = step % 3, p = (step / 3) % 2;
    if (step == 25) {  // learner 2 drops out for a while, then comes back
      Entry c;
      c.kind = EntryKind::kConnected;
      c.learner = 2;
      c.flag = false;
      batch.push_back(c);
    }
    if (step == 35) {
      Entry c;
      c.kind = EntryKind::kConnected;
      c.learner = 2;
      c.flag = true;
      batch.push_back(c);
    }
    if (step == 50) {
      Entry r;
      r.kind = EntryKind::kRetire;
      r.t = t;
      r.learner = 1;
      batch.push_back(r);
    }
    if (!(step >= 25 && step < 35 && learner == 2) && !(step >= 50 && learner == 1))
      batch.push_back(d.push(m, t, learner, p));
    Entry round;
    round.kind = EntryKind::kRound;
    round.t = t + 0.01;
    round.fragment = p;
    batch.push_back(round);
    Entry obs;
    obs.kind = EntryKind::kObserveSync;
    obs.upload = 0.01 * static_cast<double>(step % 5);
    obs.merge = 0.002;
    obs.broadcast = 0.03;
    batch.push_back(obs);
    for (Entry& e : batch) {
      const Applied mine = leader.run(e);
      const Entry got = wire_trip(e, 3, 2);
      EXPECT_EQ(got.seq, e.seq);
      const Applied theirs = apply(standby, got, m.layouts);
      EXPECT_EQ(mine.received, theirs.received);
      ASSERT_EQ(theirs.rounds.size(), got.results.size());
      for (size_t i = 0; i < theirs.rounds.size(); ++i) {
        EXPECT_EQ(compare(got.results[i], check_of(theirs.rounds[i])), "") << "step " << step;
        ++checked;
        if (mine.rounds[i].merged()) {
          ++merges;
          for (int64_t k : mine.rounds[i].outcome.learners) d.seen[k][p] = mine.rounds[i].outcome.version;
        }
      }
    }
  }
  EXPECT_GT(merges, 10);
  EXPECT_GT(checked, 50);
  EXPECT_EQ(flat_of(leader.core), flat_of(standby));
  const auto lo = leader.core.outer_state(), so = standby.outer_state();
  ASSERT_EQ(lo.size(), so.size());
  for (const auto& [k, t] : lo) EXPECT_TRUE(torch::equal(t, so.at(k))) << k;
  EXPECT_EQ(leader.core.versions(), standby.versions());
  EXPECT_EQ(leader.core.stale_bases(), standby.stale_bases());
  EXPECT_EQ(leader.core.grace(), standby.grace());
  // The drain at the end of a run, too.
  Entry last = d.push(m, 30.0, 0, 1);
  leader.run(last);
  apply(standby, wire_trip(last, 3, 2), m.layouts);
  Entry drain;
  drain.kind = EntryKind::kDrain;
  drain.t = 31.0;
  leader.run(drain);
  const Entry got = wire_trip(drain, 3, 2);
  const Applied theirs = apply(standby, got, m.layouts);
  ASSERT_GE(theirs.rounds.size(), 1u);
  ASSERT_EQ(theirs.rounds.size(), got.results.size());
  for (size_t i = 0; i < theirs.rounds.size(); ++i) EXPECT_EQ(compare(got.results[i], check_of(theirs.rounds[i])), "");
  EXPECT_EQ(flat_of(leader.core), flat_of(standby));
  // The final round (sync.final_round): final states are receive entries marked final, held apart from the rounds;
  // the final entry makes the final model on both. Without the mark the standby would merge them as pushes.
  for (int64_t k = 0; k < 3; ++k)
    for (int64_t p = 0; p < 2; ++p) {
      Entry f = d.push(m, 32.0, k, p);
      f.flag = true;
      leader.run(f);
      const Entry fg = wire_trip(f, 3, 2);
      EXPECT_TRUE(fg.flag);
      EXPECT_EQ(apply(standby, fg, m.layouts).received, SyncReject::kNone);
    }
  EXPECT_EQ(standby.finals_held(), 6);
  EXPECT_EQ(standby.pending(0) + standby.pending(1), 0);
  Entry fin;
  fin.kind = EntryKind::kFinal;
  fin.t = 33.0;
  const Applied lf = leader.run(fin);
  EXPECT_EQ(lf.rounds.size(), 2u);
  const Entry fgot = wire_trip(fin, 3, 2);
  const Applied ft = apply(standby, fgot, m.layouts);
  ASSERT_EQ(ft.rounds.size(), 2u);
  ASSERT_EQ(fgot.results.size(), 2u);
  for (size_t i = 0; i < ft.rounds.size(); ++i) EXPECT_EQ(compare(fgot.results[i], check_of(ft.rounds[i])), "");
  EXPECT_EQ(flat_of(leader.core), flat_of(standby));
  EXPECT_EQ(leader.core.versions(), standby.versions());
}

// net.broadcast_encoding = auto: the leader switches the delta broadcast's codec between merges; each round entry
// carries the encoding, so the standby encodes the same deltas and holds the same Θ (and broadcast residual). Without
// the field (an entry that lost it) the standby's Θ differs: the field is what keeps them together.
TEST(Replication, RoundsCarryTheDeltaCodecSoAStandbyEncodesTheSameDeltas) {
  const Model m = model();
  const std::vector<Codec> codecs{Codec(Encoding::kFp32), Codec(Encoding::kBf16), Codec(Encoding::kInt4)};
  auto make = [&] {
    Syncer s(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
    s.set_delta_broadcast(codecs[0]);
    s.set_delta_codecs(codecs);
    return s;
  };
  Leader leader{make(), m.layouts};
  Syncer standby = make(), blind = make();
  Driver d;
  const Encoding order[] = {Encoding::kFp32, Encoding::kInt4, Encoding::kBf16, Encoding::kInt4};
  int64_t merges = 0;
  for (int64_t step = 1; step <= 40; ++step) {
    const double t = 0.37 * static_cast<double>(step);
    const int64_t learner = step % 3, p = (step / 3) % 2;
    Entry push = d.push(m, t, learner, p);
    Entry round;
    round.kind = EntryKind::kRound;
    round.t = t + 0.01;
    round.fragment = p;
    round.delta_encoding = static_cast<int64_t>(order[(step / 5) % 4]);
    for (Entry* e : {&push, &round}) {
      const Applied mine = leader.run(*e);
      const Entry got = wire_trip(*e, 3, 2);
      EXPECT_EQ(got.delta_encoding, e->delta_encoding);
      apply(standby, got, m.layouts);
      Entry stripped = got;
      stripped.delta_encoding = 0;
      apply(blind, stripped, m.layouts);
      for (const RoundResult& r : mine.rounds)
        if (r.merged()) {
          ++merges;
          for (int64_t k : r.outcome.learners) d.seen[k][p] = r.outcome.version;
        }
    }
    EXPECT_EQ(standby.delta_encoding(), leader.core.delta_encoding());
  }
  EXPECT_GT(merges, 10);
  EXPECT_EQ(flat_of(leader.core), flat_of(standby));
  for (size_t f = 0; f < 2; ++f)
    EXPECT_TRUE(torch::equal(leader.core.broadcast_residual()[f], standby.broadcast_residual()[f])) << f;
  EXPECT_NE(flat_of(leader.core), flat_of(blind));
  // An encoding the standby's list lacks is refused by its core, not applied silently.
  Entry bad;
  bad.kind = EntryKind::kRound;
  bad.t = 100;
  bad.fragment = 0;
  bad.delta_encoding = static_cast<int64_t>(Encoding::kInt8);
  bad.results = {RoundCheck{}};
  EXPECT_THROW(apply(standby, bad, m.layouts), SyncError);
}

// net.encoding = auto: a round entry carries the longest fitted period, which sets a rebasing learner's grace window
// (Syncer::set_link_period), so the standby decides its rounds with the leader's window.
TEST(Replication, RoundsCarryTheLinkPeriodThatSpansTheGraceWindow) {
  const Model m = model();
  SyncOptions o = options();
  o.apply = "rebase";
  Leader leader{Syncer(o, m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{}), m.layouts};
  Syncer standby(o, m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  Driver d;
  Entry push = d.push(m, 1.0, 0, 0);
  Entry round;
  round.kind = EntryKind::kRound;
  round.t = 1.01;
  round.fragment = 0;
  round.link_period = 4 * o.sync_every;
  for (Entry* e : {&push, &round}) {
    leader.run(*e);
    const Entry got = wire_trip(*e, 3, 2);
    EXPECT_EQ(got.link_period, e->link_period);
    apply(standby, got, m.layouts);
  }
  EXPECT_EQ(leader.core.stats().period, 4 * o.sync_every);
  EXPECT_EQ(standby.stats().period, leader.core.stats().period);
  // An entry without the field leaves the period as it was.
  Entry later;
  later.kind = EntryKind::kRound;
  later.t = 2;
  later.fragment = 1;
  leader.run(later);
  const Entry got = wire_trip(later, 3, 2);
  EXPECT_EQ(got.link_period, -1);
  apply(standby, got, m.layouts);
  EXPECT_EQ(standby.stats().period, 4 * o.sync_every);
}

TEST(Replication, ALateStandbyFollowsFromAnImageThatTheLeaderAppliesToo) {
  const Model m = model();
  Leader leader{Syncer(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{}), m.layouts};
  Driver d;
  for (int64_t step = 1; step <= 20; ++step) {
    Entry e = d.push(m, 0.5 * static_cast<double>(step), step % 3, step % 2);
    leader.run(e);
    Entry r;
    r.kind = EntryKind::kRound;
    r.t = 0.5 * static_cast<double>(step);
    r.fragment = step % 2;
    leader.run(r);
  }
  Entry waiting = d.push(m, 11.0, 0, 0);  // a push still waiting for its round when the standby arrives
  leader.run(waiting);
  ASSERT_FALSE(leader.core.waiting(0).empty());
  // A standby that has seen none of it, built from the same config.
  Syncer standby(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  Entry im;
  im.kind = EntryKind::kImage;
  im.image = leader.core.image();
  im.counters = {{"merges", 5}};
  leader.run(im);  // the resync point, on the leader too: its waiting push is dropped
  EXPECT_TRUE(leader.core.waiting(0).empty());
  const Entry got = wire_trip(im, 3, 2);
  EXPECT_EQ(got.counters["merges"], 5);
  apply(standby, got, m.layouts);
  EXPECT_EQ(flat_of(leader.core), flat_of(standby));
  EXPECT_EQ(leader.core.versions(), standby.versions());
  // What restore() alone would not carry: the moving averages the grace window and the local updates come from.
  EXPECT_GT(leader.core.grace(), 0.0);
  EXPECT_EQ(leader.core.grace(), standby.grace());
  for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(leader.core.local_updates(k), standby.local_updates(k)) << k;
  EXPECT_NE(leader.core.local_updates(0), leader.core.local_updates(2));
  int64_t merges = 0;
  for (int64_t step = 21; step <= 40; ++step) {
    for (Entry e : {d.push(m, 0.5 * static_cast<double>(step), step % 3, step % 2)}) {
      leader.run(e);
      apply(standby, wire_trip(e, 3, 2), m.layouts);
    }
    Entry r;
    r.kind = EntryKind::kRound;
    r.t = 0.5 * static_cast<double>(step);
    r.fragment = step % 2;
    const Applied a = leader.run(r);
    const Entry rg = wire_trip(r, 3, 2);
    const Applied b = apply(standby, rg, m.layouts);
    EXPECT_EQ(compare(rg.results[0], check_of(b.rounds[0])), "") << step;
    merges += a.rounds[0].merged() ? 1 : 0;
  }
  EXPECT_GT(merges, 5);
  EXPECT_EQ(flat_of(leader.core), flat_of(standby));
}

TEST(Replication, AnImageForAnotherClusterChangesNothing) {
  const Model m = model();
  Syncer a(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  SyncOptions four = options();
  four.learners = 4;
  Syncer b(four, m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  const auto before = flat_of(a);
  Syncer::Image im = b.image();
  im.global.begin()->second = im.global.begin()->second + 1;  // a different Θ, too
  try {
    a.resync(im);
    FAIL() << "resynced from an image of 4 learners";
  } catch (const SyncError& e) {
    EXPECT_NE(std::string(e.what()).find("4 learners"), std::string::npos) << e.what();
  }
  EXPECT_EQ(flat_of(a), before);
  Syncer::Image bad = a.image();
  bad.global.begin()->second = torch::full_like(bad.global.begin()->second, std::nanf(""));
  EXPECT_THROW(a.resync(bad), SyncError);  // a poisoned image is refused like a poisoned checkpoint
  EXPECT_EQ(flat_of(a), before);
}

TEST(Replication, MalformedEntriesAreRefusedNamingTheProblem) {
  Entry e;
  e.kind = EntryKind::kConnected;
  e.learner = 1;
  e.flag = true;
  const EncodedEntry ok = encode(e, 1);
  EXPECT_NO_THROW(decode(ok.header, ok.payload, 3, 2));
  const auto refused = [](const MessageHeader& h, const std::string& payload, const std::string& needle) {
    try {
      decode(h, Bytes::from_string(payload), 3, 2);
      ADD_FAILURE() << "accepted; expected an error mentioning '" << needle << "'";
    } catch (const WireError& x) {
      EXPECT_NE(std::string(x.what()).find(needle), std::string::npos) << x.what();
    }
  };
  const std::string body = ok.payload.str();
  refused(ok.header, body.substr(0, 3), "shorter than its length prefix");
  std::string overrun = body;
  overrun[2] = '\x7f';
  refused(ok.header, overrun, "overruns the frame");
  MessageHeader unknown = ok.header;
  unknown.fragment_id = 99;
  refused(unknown, body, "entry kind 99 is unknown");
  const auto json_body = [](const std::string& j) {
    std::string b(4, '\0');
    b[0] = static_cast<char>(j.size() & 0xff);
    b[1] = static_cast<char>((j.size() >> 8) & 0xff);
    return b + j;
  };
  refused(ok.header, json_body(R"({"learner":7,"connected":true})"), "'learner' = 7 is out of range");
  refused(ok.header, json_body(R"({"learner":1,"connected":3})"), "'connected' is not a boolean");
  refused(ok.header, json_body("[1,2]"), "not a JSON object");
  MessageHeader recv = ok.header;
  recv.fragment_id = static_cast<uint32_t>(EntryKind::kReceive);
  refused(recv, json_body(R"({"t":1,"learner":0,"fragment":5,"encoding":1,"base":0,"c_steps":1,"c_tokens":1,"step":1,"step_time":0.1})"),
          "'fragment' = 5 is out of range");
  MessageHeader img = ok.header;
  img.fragment_id = static_cast<uint32_t>(EntryKind::kImage);
  refused(img, json_body(R"({"versions":[0],"merged":0})"), "'versions' is not a list of 2");
  // A receive whose push bytes are short: decoded fine, refused by apply (decode_push) before the core sees it.
  const Model m = model();
  Syncer s(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  Entry short_push = Driver().push(m, 1.0, 0, 0);
  short_push.payload = Bytes::from_string(short_push.payload.str().substr(0, 5));
  const EncodedEntry sp = encode(short_push, 1);
  const Entry got = decode(sp.header, sp.payload, 3, 2);
  EXPECT_THROW(apply(s, got, m.layouts), WireError);
  EXPECT_EQ(s.pending(0), 0);
}

// A follow request carries the asker's state (merges, slot) through the wire; an older peer's carries none (-1),
// and values out of range are refused naming the field.
TEST(Replication, AFollowRequestCarriesTheAskersState) {
  Entry f;
  f.kind = EntryKind::kFollow;
  f.epoch = 3;
  f.merges = 41;
  f.slot = 1;
  const Entry got = wire_trip(f, 2, 2);
  EXPECT_EQ(got.kind, EntryKind::kFollow);
  EXPECT_EQ(got.epoch, 3);
  EXPECT_EQ(got.merges, 41);
  EXPECT_EQ(got.slot, 1);
  Entry bare;
  bare.kind = EntryKind::kFollow;
  const Entry old = wire_trip(bare, 2, 2);
  EXPECT_EQ(old.merges, -1);
  EXPECT_EQ(old.slot, -1);
  const EncodedEntry enc = encode(f, 1);
  const auto body = [](const std::string& j) {
    std::string b(4, '\0');
    b[0] = static_cast<char>(j.size() & 0xff);
    return b + j;
  };
  for (const auto& [json, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"merges":-2})", "'merges' = -2 is out of range"},
           {R"({"slot":2})", "'slot' = 2 is out of range"},
           {R"({"slot":"primary"})", "'slot' is not an integer"}}) {
    try {
      decode(enc.header, Bytes::from_string(body(json)), 2, 2);
      ADD_FAILURE() << json << " was accepted";
    } catch (const WireError& x) {
      EXPECT_NE(std::string(x.what()).find(needle), std::string::npos) << x.what();
    }
  }
}

// A pair with no leader elects exactly one of its two syncers: the newer state (epoch, then merges), then the
// primary. Checked both ways round for every case, so the two syncers, each deciding alone, never both lead; a pair
// whose slots are equal or unknown elects nobody.
TEST(Replication, ALeaderlessPairElectsExactlyOneSyncerTheNewerState) {
  struct Case {
    PairState a, b;
    int winner;  // 0: a, 1: b, -1: neither
  };
  const std::vector<Case> cases = {
      {{2, 0, 1}, {1, 90, 0}, 0},   // a newer epoch beats more merges
      {{1, 20, 0}, {1, 0, 1}, 0},   // a restarted leader's checkpoint beats a standby that never held an image
      {{1, 18, 0}, {1, 20, 1}, 1},  // a standby that replicated further beats an older checkpoint
      {{1, 5, 1}, {1, 5, 0}, 1},    // a tie: the primary
      {{1, 5, 0}, {1, 5, 0}, -1},   // both say they are the primary: nobody
      {{1, 5, -1}, {1, 3, 1}, -1},  // an older peer that does not say its slot: nobody
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const bool a = leads_leaderless(c.a, c.b), b = leads_leaderless(c.b, c.a);
    EXPECT_EQ(a, c.winner == 0) << "case " << i;
    EXPECT_EQ(b, c.winner == 1) << "case " << i;
    EXPECT_FALSE(a && b) << "case " << i;
  }
}

// A standby taking over drops the pushes the rounds wait on (their learners count them refused and push the progress
// again) but keeps the final states (sync.final_round): a learner past its last step has nothing to push again, and
// its state merges once whichever syncer holds it. So the final round after the takeover still has it, and a standby
// that follows the new leader gets it again after the image (waiting_pushes).
TEST(Replication, ATakeoverDropsTheWaitingPushesAndKeepsTheFinalStates) {
  const Model m = model();
  Syncer core(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  Journal j;
  Driver d;
  const auto record = [&](Entry e) {
    return j.record(core, m.layouts, std::move(e), /*epoch=*/1, /*replicate=*/false, 1, WireLimits{});
  };
  record(d.push(m, 1.0, 0, 0));  // waits for its quorum (K = 2)
  Entry f = d.push(m, 2.0, 1, 1);
  f.flag = true;  // learner 1's final state of fragment 1
  EXPECT_EQ(record(f).received, SyncReject::kNone);
  ASSERT_EQ(core.waiting(0), (std::vector<int64_t>{0}));
  ASSERT_EQ(core.finals_held(), 1);
  // The takeover (SyncerNode::Impl::forget_learners).
  core.drop_waiting();
  j.forget_pushes();
  EXPECT_TRUE(core.waiting(0).empty());
  EXPECT_EQ(core.finals_held(), 1);
  const std::vector<Entry> w = j.waiting_pushes(core, 2);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(w[0].flag);
  EXPECT_EQ(w[0].learner, 1);
  EXPECT_EQ(w[0].fragment, 1);
  Entry fin;
  fin.kind = EntryKind::kFinal;
  fin.t = 3.0;
  const Applied a = record(fin);
  ASSERT_EQ(a.rounds.size(), 1u);
  EXPECT_TRUE(a.rounds[0].merged());
  EXPECT_EQ(a.rounds[0].outcome.learners, (std::vector<int64_t>{1}));
  EXPECT_EQ(core.finals_merged(), 1);
}

// The same after a takeover by the standby, which held nothing it journaled itself: what it followed, it holds as the
// leader did, so the final state survives the takeover and, when a new standby asks to follow, the image (which
// drops every round) and is held by the new standby too. Before the follower kept them, the final state was lost
// at that image on both syncers, silently.
TEST(Replication, AStandbyThatTookOverHandsOnTheFinalStatesItFollowed) {
  const Model m = model();
  Leader leader{Syncer(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{}), m.layouts};
  Syncer standby(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  Journal sj;
  Driver d;
  const auto both = [&](Entry e) {  // the leader records it; the standby applies what crossed the wire, and follows
    leader.run(e);
    sj.follow(e, apply(standby, e, m.layouts));
  };
  both(d.push(m, 1.0, 0, 0));  // waits for its quorum (K = 2)
  Entry f = d.push(m, 2.0, 1, 1);
  f.flag = true;  // learner 1's final state of fragment 1
  both(f);
  ASSERT_EQ(standby.finals_held(), 1);
  EXPECT_EQ(sj.seq(), 2u);
  // The standby takes over (SyncerNode::Impl::forget_learners): the waiting push goes, the final state stays.
  standby.drop_waiting();
  sj.forget_pushes();
  ASSERT_EQ(standby.finals_held(), 1);
  const std::vector<Entry> w = sj.waiting_pushes(standby, 2);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(w[0].flag);
  EXPECT_EQ(w[0].learner, 1);
  EXPECT_EQ(w[0].fragment, 1);
  // A new standby asks to follow it (syncer_standby.cpp, kFollow): the image, then what waited, on both.
  Entry im;
  im.kind = EntryKind::kImage;
  im.image = standby.image();
  im.counters = nlohmann::json::object();
  sj.record(standby, m.layouts, im, /*epoch=*/2, /*replicate=*/false, 1, WireLimits{});
  EXPECT_EQ(standby.finals_held(), 0);  // the image dropped it here too
  EXPECT_TRUE(sj.waiting_pushes(standby, 2).empty());
  for (Entry e : w) {
    e.results.clear();
    EXPECT_EQ(sj.record(standby, m.layouts, e, 2, false, 1, WireLimits{}).received, SyncReject::kNone);
  }
  EXPECT_EQ(standby.finals_held(), 1);
  Syncer fresh(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  apply(fresh, wire_trip(im, 3, 2), m.layouts);
  for (const Entry& e : w) apply(fresh, wire_trip(e, 3, 2), m.layouts);
  EXPECT_EQ(fresh.finals_held(), 1);
}

// sync.final_round: a learner past its last step (kFinished) travels to the standby, with its flag, and so does the
// mark in an image; a standby that applies them decides its rounds as the leader does (no round waits for it).
TEST(Replication, AFinishedLearnerTravelsAsAnEntryAndInTheImage) {
  const Model m = model();
  SyncOptions o = options();
  o.final_round = true;
  Syncer leader(o, m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  Syncer standby(o, m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  Entry f;
  f.kind = EntryKind::kFinished;
  f.t = 5.0;
  f.learner = 2;
  f.flag = true;
  const Entry got = wire_trip(f, 3, 2);
  EXPECT_EQ(got.kind, EntryKind::kFinished);
  EXPECT_EQ(got.learner, 2);
  EXPECT_TRUE(got.flag);
  EXPECT_DOUBLE_EQ(got.t, 5.0);
  apply(leader, f, m.layouts);
  apply(standby, got, m.layouts);
  EXPECT_TRUE(standby.finished(2));
  // The image carries it: a fresh standby resynced from the leader holds the mark.
  Entry im;
  im.kind = EntryKind::kImage;
  im.image = leader.image();
  im.counters = nlohmann::json::object();
  Syncer fresh(o, m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  apply(fresh, wire_trip(im, 3, 2), m.layouts);
  EXPECT_TRUE(fresh.finished(2));
  EXPECT_FALSE(fresh.finished(1));
  // Learners 0 and 1 push fragment 0 (K = 2): with learner 2 finished nobody else can come, so the round merges at
  // once on both, where otherwise it would wait in its grace window for learner 2.
  Driver d;
  Syncer unmarked(o, m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  for (int64_t k = 0; k < 2; ++k) {
    const Entry e = d.push(m, 6.0, k, 0);
    EXPECT_EQ(apply(leader, e, m.layouts).received, SyncReject::kNone);
    EXPECT_EQ(apply(fresh, wire_trip(e, 3, 2), m.layouts).received, SyncReject::kNone);
    EXPECT_EQ(apply(unmarked, e, m.layouts).received, SyncReject::kNone);
  }
  EXPECT_EQ(leader.decide(6.0, 0).kind, RoundDecision::kMerge);
  EXPECT_EQ(fresh.decide(6.0, 0).kind, RoundDecision::kMerge);
  EXPECT_EQ(unmarked.decide(6.0, 0).kind, RoundDecision::kWaitUntil);  // learner 2 may still push
  // A malformed flag is refused, naming the field.
  nlohmann::json bad = {{"t", 1.0}, {"learner", 0}, {"finished", "yes"}};
  const std::string js = bad.dump();
  EncodedEntry enc = encode(f, 0xabcdef);
  std::string payload(4, '\0');
  payload[0] = static_cast<char>(js.size() & 0xff);
  payload[1] = static_cast<char>((js.size() >> 8) & 0xff);
  payload += js;
  try {
    decode(enc.header, Bytes::copy(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()), 3, 2);
    ADD_FAILURE() << "a finished entry with a string flag was accepted";
  } catch (const WireError& e) {
    EXPECT_NE(std::string(e.what()).find("'finished'"), std::string::npos) << e.what();
  }
}

TEST(Replication, TheJournalNumbersEntriesAndKeepsThePushesRoundsWaitOnForTheNextImage) {
  const Model m = model();
  Syncer core(options(), m.fragments, m.global, MergePlan::preset("decoupled"), OuterOptions{});
  Journal j;
  Driver d;
  const auto record = [&](Entry e, bool replicate) {
    return j.record(core, m.layouts, std::move(e), /*epoch=*/3, replicate, 1, WireLimits{});
  };
  record(d.push(m, 1.0, 0, 0), /*replicate=*/false);
  record(d.push(m, 1.0, 1, 1), false);
  EXPECT_EQ(j.seq(), 2u);
  EXPECT_TRUE(j.take_frames().empty());  // no standby: nothing queued
  // An entry the core cannot take changes nothing here either.
  Entry bad = d.push(m, 1.0, 2, 0);
  bad.fragment = 7;
  EXPECT_THROW(record(bad, true), SyncError);
  EXPECT_EQ(j.seq(), 2u);
  EXPECT_TRUE(j.take_frames().empty());
  // The pushes the rounds wait on, as their entries, fragment by fragment.
  std::vector<Entry> w = j.waiting_pushes(core, 2);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].learner, 0);
  EXPECT_EQ(w[0].fragment, 0);
  EXPECT_EQ(w[1].learner, 1);
  EXPECT_EQ(w[1].fragment, 1);
  EXPECT_EQ(w[1].seq, 2u);
  EXPECT_EQ(w[1].epoch, 3);
  // A second push to fragment 0 makes its quorum (K = 2): the round merges, and its pushes wait no more.
  record(d.push(m, 1.5, 2, 0), true);
  Entry r;
  r.kind = EntryKind::kRound;
  r.t = 100.0;  // past any grace window
  r.fragment = 0;
  const Applied a = record(r, true);
  ASSERT_EQ(a.rounds.size(), 1u);
  ASSERT_TRUE(a.rounds[0].merged());
  EXPECT_EQ(j.take_frames().size(), 2u);
  w = j.waiting_pushes(core, 2);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].fragment, 1);
  // The resync point: an image drops the core's rounds; the waiting push received again after it waits again.
  Entry im;
  im.kind = EntryKind::kImage;
  im.image = core.image();
  record(im, true);
  EXPECT_TRUE(core.waiting(1).empty());
  j.forget_pushes();
  for (Entry& e : w) {
    e.results.clear();
    record(e, true);
  }
  EXPECT_EQ(core.waiting(1), (std::vector<int64_t>{1}));
  EXPECT_EQ(j.seq(), 6u);  // each entry numbered once: three pushes, the round, the image, the push received again
  EXPECT_EQ(j.waiting_pushes(core, 2).size(), 1u);
}

}  // namespace
}  // namespace deloco::repl

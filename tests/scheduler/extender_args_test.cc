// ExtenderArgs as the extender reads them: the fast path (NodeNames scanned by hand, the rest parsed) must
// give what the general path (the whole body through the bounded SAX parser) gives, on every body, valid or
// not; fuzz/extender_args_fuzz.cc checks the same on generated inputs.
#include "scheduler/extender_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kPod[] = R"({"metadata":{"name":"p","namespace":"default","uid":"u1"}})";

std::string Body(const std::string& names_part) {
  return std::string(R"({"Pod":)") + kPod + names_part + "}";
}

// Both paths agree; returns the fast path's answer.
absl::StatusOr<ExtenderArgsDoc> ReadBoth(const std::string& body) {
  absl::StatusOr<ExtenderArgsDoc> fast = ReadExtenderArgs(body, ArgsPath::kFast);
  absl::StatusOr<ExtenderArgsDoc> general = ReadExtenderArgs(body, ArgsPath::kGeneral);
  EXPECT_EQ(fast.ok(), general.ok()) << body;
  if (fast.ok() && general.ok()) {
    EXPECT_EQ(fast->doc, general->doc) << body;
    EXPECT_EQ(fast->has_names, general->has_names) << body;
    EXPECT_EQ(fast->names, general->names) << body;
    EXPECT_FALSE(general->fast);
  } else if (!fast.ok() && !general.ok()) {
    EXPECT_EQ(fast.status(), general.status()) << body;
  }
  return fast;
}

TEST(ExtenderArgsTest, PlainNamesAreViewsIntoTheBody) {
  const std::string body = Body(R"(,"NodeNames":["node-1", "node-2" ,"node-1"],"Nodes":null)");
  absl::StatusOr<ExtenderArgsDoc> args = ReadBoth(body);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->fast);
  EXPECT_TRUE(args->has_names);
  EXPECT_THAT(args->names, ElementsAre("node-1", "node-2", "node-1"));
  for (std::string_view n : args->names) {
    EXPECT_TRUE(n.data() >= body.data() && n.data() < body.data() + body.size()) << "copied: " << n;
  }
  EXPECT_FALSE(args->doc.contains("NodeNames"));
  EXPECT_TRUE(args->doc.contains("Pod"));
}

TEST(ExtenderArgsTest, TheScanCutsOutTheListsOnly) {
  std::optional<NodeNamesScan> scan = ScanNodeNames(R"( {"nodenames" : [ "a" ], "Pod":{"x":[1,"]"]}} )");
  ASSERT_TRUE(scan.has_value());
  EXPECT_EQ(scan->rest, R"( {"nodenames" : null, "Pod":{"x":[1,"]"]}} )");
  EXPECT_THAT(scan->names, ElementsAre("a"));
}

TEST(ExtenderArgsTest, ValidBodiesGiveTheSameAnswerOnBothPaths) {
  for (const std::string& body : std::vector<std::string>{
           Body(R"(,"NodeNames":[])"),
           Body(R"(,"NodeNames":null)"),
           Body(""),
           Body(R"(,"nodeNAMES":["a"],"NodeNames":["b","c"])"),  // every NodeNames counts, in any case
           Body(R"(,"NodeNames":["a"],"NodeNames":null)"),
           Body(R"(,"NodeNames":[""])"),
           Body(R"(,"NodeNames":["caf\u00e9","tab\t"])"),  // escapes: the general path
           Body(R"(,"NodeNames":["über"])"),               // UTF-8: the general path
           Body(R"(,"Node\u004eames":["a"])"),             // a key with escapes: the general path
           Body(R"(,"Nodes":{"items":[{"metadata":{"name":"n1"}}]},"x":[{"NodeNames":5}])"),
           Body(R"(,"NodeNames":["a"],"s":"\"NodeNames\":[1]")"),
           "\xEF\xBB\xBF" + Body(R"(,"NodeNames":["a"])"),  // a byte-order mark: the parser skips it
           " \t\r\n" + Body(R"(,"NodeNames":["a"])") + " \n",
       }) {
    absl::StatusOr<ExtenderArgsDoc> args = ReadBoth(body);
    EXPECT_TRUE(args.ok()) << body << ": " << args.status();
  }
  EXPECT_TRUE(ReadExtenderArgs(Body(R"(,"NodeNames":["a"])"))->fast);
  EXPECT_FALSE(ReadExtenderArgs(Body(R"(,"NodeNames":["caf\u00e9"])"))->fast);
}

TEST(ExtenderArgsTest, MalformedBodiesGetTheSameErrorOnBothPaths) {
  const std::string deep = std::string(200, '[') + std::string(200, ']');
  for (const auto& [body, message] : std::vector<std::pair<std::string, std::string>>{
           {"", "not valid JSON"},
           {"{", "not valid JSON"},
           {"[]", "must be a JSON object"},
           {"null", "must be a JSON object"},
           {Body(R"(,"NodeNames":["a",1])"), "NodeNames must be a list of node names"},
           {Body(R"(,"NodeNames":"a")"), "NodeNames must be a list of node names"},
           {Body(R"(,"NodeNames":{})"), "NodeNames must be a list of node names"},
           {Body(R"(,"NodeNames":[["a"]])"), "NodeNames must be a list of node names"},
           {Body(R"(,"NodeNames":[null])"), "NodeNames must be a list of node names"},
           {Body(R"(,"NodeNames":["a" "b"])"), "not valid JSON"},
           {Body(R"(,"NodeNames":["a",])"), "not valid JSON"},
           {Body(R"(,"NodeNames":["a"])").substr(0, 60), "not valid JSON"},
           {Body(R"(,"NodeNames":["a"])") + "x", "not valid JSON"},
           {Body(R"(,"NodeNames":["\xff"])"), "not valid JSON"},    // not UTF-8
           {Body(R"(,"NodeNames":["a	b"])"), "not valid JSON"},  // a raw tab
           {Body(R"(,"NodeNames":["\q"])"), "not valid JSON"},      // no such escape
           {Body(R"(,"NodeNames":[1e999])"), "not valid JSON"},     // out of a double's range
           {Body(R"(,"NodeNames":[tru])"), "not valid JSON"},
           {Body(R"(,"NodeNames":["a"],"x":[})"), "not valid JSON"},
           {Body(R"(,"x":[},"NodeNames":["a"]])"), "not valid JSON"},
           {Body(R"(,"x":"unterminated)"), "not valid JSON"},
           {Body(R"(,"NodeNames":["a"],"x":nul)"), "not valid JSON"},
           {Body(R"(,"NodeNames":nullx)"), "not valid JSON"},
           {Body(R"(,"NodeNames":["a"],"x":)" + deep), "nested deeper than 128 levels"},
           {Body(R"(,"x":)" + deep + R"(,"NodeNames":["a",1])"), "nested deeper than 128 levels"},
           {Body(R"(,"NodeNames":["a",1],"x":)" + deep), "NodeNames must be a list of node names"},
       }) {
    absl::StatusOr<ExtenderArgsDoc> args = ReadBoth(body);
    ASSERT_FALSE(args.ok()) << body;
    EXPECT_THAT(std::string(args.status().message()), HasSubstr(message)) << body;
  }
}

// "Pod" and "pod" in one body were both kept and the exact name won; Go's decoder (kube-scheduler's) matches
// names in any case and keeps the last. No kube-scheduler sends a field twice: refused, on both paths.
TEST(ExtenderArgsTest, TopLevelFieldsGivenTwiceInAnyCaseAreRefused) {
  for (const std::string& body : std::vector<std::string>{
           Body(R"(,"pod":{"metadata":{"name":"other"}})"),
           Body(R"(,"NodeNames":["a"],"POD":null)"),
           Body(R"(,"NodeNames":["caf\u00e9"],"pOd":1)"),  // escapes: the general path
           R"({"Nodes":null,"nodes":{"items":[]},"Pod":{}})",
       }) {
    absl::StatusOr<ExtenderArgsDoc> args = ReadBoth(body);
    ASSERT_FALSE(args.ok()) << body;
    EXPECT_THAT(std::string(args.status().message()), HasSubstr("\" twice (field names match in any case"))
        << body;
  }
  // The same names at other levels are the Pod's own business.
  EXPECT_TRUE(ReadBoth(R"({"Pod":{"metadata":{"name":"p"},"x":{"pod":1,"Pod":2}}})").ok());
}

TEST(ExtenderArgsTest, NamesOfTheGeneralPathOutliveAMove) {
  absl::StatusOr<ExtenderArgsDoc> args = ReadExtenderArgs(Body(R"(,"NodeNames":["caf\u00e9","b"])"));
  ASSERT_TRUE(args.ok());
  ExtenderArgsDoc moved = *std::move(args);
  EXPECT_THAT(moved.names, ElementsAre("café", "b"));
  EXPECT_THAT(ReadExtenderArgs(Body(""))->names, IsEmpty());
}

}  // namespace
}  // namespace tessera::scheduler

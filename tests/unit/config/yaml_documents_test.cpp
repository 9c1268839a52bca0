// The cluster file's YAML loading (lib/config/yaml_documents.h): streams on
// which yaml-cpp 0.7's LoadAll never returns are refused with a syntax error
// at the offending character, and the document rules still hold.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "config/config.h"

namespace pmirror::config {
namespace {

using ::testing::HasSubstr;

constexpr const char* kGood =
    "nodes:\n"
    "  - {name: a, address: 10.0.0.1}\n"
    "  - {name: b, address: 10.0.0.2}\n"
    "volumes:\n"
    "  - {name: v, size: 1MiB, primary: a, replicas: [b], path: /pmem/v,\n"
    "     allowed_peers: [app], secret: 0123456789abcdef}\n";

std::string refusal(const std::string& text) {
  auto parsed = parse_cluster_config(text);
  EXPECT_FALSE(parsed.ok()) << "accepted:\n" << text;
  if (parsed.ok()) return {};
  EXPECT_EQ(parsed.status().code(), Errc::kConfigError);
  return parsed.status().message();
}

// Before the fix each of these made YAML::LoadAll collect empty documents
// until the process ran out of memory (std::bad_alloc, uncaught).
TEST(YamlDocumentsTest, StrayCommaIsASyntaxErrorAtTheComma) {
  EXPECT_THAT(refusal(","), HasSubstr("<config>:1:1: YAML syntax error"));
  EXPECT_THAT(refusal(",\n---\n"), HasSubstr("<config>:1:1: YAML syntax error"));
  EXPECT_THAT(refusal(std::string(kGood) + "---\n,\n"),
              HasSubstr("<config>:8:1: YAML syntax error"));
  // What tests/fuzz/config_fuzz found first (corpus/config/regress-loadall-stray-comma).
  EXPECT_THAT(refusal(std::string(",odes: []\n---\nv\x1a\0umes: []\n", 25)),
              HasSubstr("<config>:1:1: YAML syntax error"));
}

TEST(YamlDocumentsTest, SecondDocumentIsStillRefusedAtItsFirstLine) {
  EXPECT_THAT(refusal(std::string(kGood) + "---\n" + kGood),
              HasSubstr("<config>:8:1: found 2 YAML documents ('---')"));
  EXPECT_THAT(refusal(std::string(kGood) + "---\na: 1\n---\nb: 2\n"),
              HasSubstr("found 3 YAML documents"));
}

TEST(YamlDocumentsTest, GoodFileAndEmptyFile) {
  auto parsed = parse_cluster_config(kGood);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->volumes.at(0).name, "v");
  EXPECT_THAT(refusal(""), HasSubstr("the configuration is empty"));
  EXPECT_THAT(refusal("---\n...\n"), HasSubstr("the configuration is empty"));
}

// yaml-cpp stops deep nesting (its depth guard) before the stack overflows;
// its message, "bad file", is replaced by one that says what is wrong.
TEST(YamlDocumentsTest, DeepNestingIsRefusedNotACrash) {
  EXPECT_THAT(refusal("nodes: " + std::string(100000, '[')),
              HasSubstr("YAML syntax error: nested more than"));
  std::string block = "nodes:\n";
  for (int depth = 1; depth < 5000; ++depth) block += std::string(2 * depth, ' ') + "-\n";
  EXPECT_THAT(refusal(block), HasSubstr("levels deep; a cluster file needs a few"));
}

}  // namespace
}  // namespace pmirror::config

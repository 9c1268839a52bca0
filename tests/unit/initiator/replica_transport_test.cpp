// A replica names its transport by string; the tests' fake fabric is
// reachable only while a test has installed one.
#include <gtest/gtest.h>

#include "initiator/initiator.h"
#include "transport/fake/fake_transport.h"

namespace pmirror::initiator {
namespace {

TEST(ReplicaTransportTest, NamesTheTransportsOfTheClusterFile) {
  EXPECT_EQ(*replica_transport("tcp"), transport::Kind::kTcp);
  EXPECT_EQ(*replica_transport("rdma"), transport::Kind::kRdma);
  auto unknown = replica_transport("udp");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("udp"), std::string::npos);
}

TEST(ReplicaTransportTest, FakeOnlyWhileAFabricIsInstalled) {
  ASSERT_EQ(transport::fake::installed_fabric(), nullptr);
  EXPECT_EQ(replica_transport("fake").status().code(), Errc::kInvalidArgument);
  {
    transport::fake::ScopedFabric installed(transport::fake::FakeFabric::create());
    EXPECT_EQ(*replica_transport("fake"), transport::Kind::kFake);
  }
  EXPECT_EQ(replica_transport("fake").status().code(), Errc::kInvalidArgument);
}

TEST(ReplicaTransportTest, OpenRefusesAnUnknownTransportBeforeTouchingAnything) {
  VolumeOptions options;
  options.name = "v";
  options.local_path = "/nonexistent-dir/never-created.img";
  options.identity = "app";
  options.replicas = {{"127.0.0.1", 7450, "fake", "secret", ""}};
  auto opened = Volume::open(options);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), Errc::kInvalidArgument) << opened.status().to_string();
  EXPECT_NE(opened.status().message().find("'fake'"), std::string::npos)
      << opened.status().to_string();
}

}  // namespace
}  // namespace pmirror::initiator

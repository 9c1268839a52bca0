// Kinds, their one parser (transport/kind.h), and the registry that maps a
// kind to the implementation serving it (transport/registry.h).
#include <gtest/gtest.h>

#include <atomic>

#include "transport/kind.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace pmirror::transport {
namespace {

TEST(TransportKind, NamesAndTheOneParser) {
  EXPECT_EQ(kind_name(Kind::kTcp), "tcp");
  EXPECT_EQ(kind_name(Kind::kRdma), "rdma");
  EXPECT_EQ(kind_name(Kind::kFake), "fake");
  EXPECT_EQ(configurable_kind_names(), "tcp, rdma");
  EXPECT_EQ(*parse_kind("tcp"), Kind::kTcp);
  auto udp = parse_kind("udp");
  ASSERT_FALSE(udp.ok());
  EXPECT_EQ(udp.status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(udp.status().message(), "'udp' is not one of tcp, rdma");
  // The tests' fake is named, never parsed: no configuration reaches it.
  EXPECT_EQ(parse_kind("fake").status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(parse_kind("TCP").status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(opcode_name(Opcode::kRecv), "recv");
}

TEST(TransportKind, RdmaParsesOnlyWhereItIsBuilt) {
  auto rdma = parse_kind("rdma");
  if (kind_info(Kind::kRdma).built) {
    ASSERT_TRUE(rdma.ok()) << rdma.status().to_string();
    EXPECT_EQ(*rdma, Kind::kRdma);
  } else {
    ASSERT_FALSE(rdma.ok());
    EXPECT_EQ(rdma.status().code(), Errc::kUnsupported);
    EXPECT_EQ(rdma.status().message(),
              "this build of pmirror has no rdma transport (built with PMIRROR_RDMA=OFF)");
  }
}

TEST(TransportRegistry, BuiltInTransportsAnswerWithTheirCapabilities) {
  auto tcp = capabilities(Kind::kTcp);
  ASSERT_TRUE(tcp.ok()) << tcp.status().to_string();
  EXPECT_TRUE(tcp->read_flushes_writes_on_any_backing);
  auto rdma = capabilities(Kind::kRdma);
  if (kind_info(Kind::kRdma).built) {
    ASSERT_TRUE(rdma.ok()) << rdma.status().to_string();
    EXPECT_FALSE(rdma->read_flushes_writes_on_any_backing);
  } else {
    EXPECT_EQ(rdma.status().code(), Errc::kUnsupported);
    EXPECT_NE(rdma.status().message().find("PMIRROR_RDMA=OFF"), std::string::npos);
    EXPECT_EQ(listen(Kind::kRdma, "127.0.0.1", 0, {}).status().code(), Errc::kUnsupported);
  }
  EXPECT_EQ(*kind_for_name("tcp"), Kind::kTcp);
}

TEST(TransportRegistry, AFreshRegistryHasWhatRegistrationAdds) {
  Registry registry;
  auto none = registry.find(Kind::kTcp);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Errc::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("'tcp' is not registered"), std::string::npos)
      << none.status().message();
  register_built_transports(registry);
  auto tcp = registry.find(Kind::kTcp);
  ASSERT_TRUE(tcp.ok()) << tcp.status().to_string();
  EXPECT_EQ((*tcp)->kind, Kind::kTcp);
  EXPECT_EQ(registry.find(Kind::kRdma).ok(), kind_info(Kind::kRdma).built);
  EXPECT_FALSE(registry.find(Kind::kFake).ok());
}

// What a test-only transport does (the fake fabric through
// fake::install_fabric): registered, it is reached by listen/connect and
// answers capabilities; a replica may name it; removed, it is gone again.
TEST(TransportRegistry, ATestTransportIsReachableOnlyWhileRegistered) {
  ASSERT_EQ(capabilities(Kind::kFake).status().code(), Errc::kFailedPrecondition);
  EXPECT_NE(capabilities(Kind::kFake).status().message().find("registered by a test"),
            std::string::npos)
      << capabilities(Kind::kFake).status().message();
  EXPECT_EQ(listen(Kind::kFake, "target", 0, {}).status().code(), Errc::kFailedPrecondition);
  EXPECT_EQ(kind_for_name("fake").status().code(), Errc::kInvalidArgument);

  std::atomic<int> listens{0};
  std::atomic<int> connects{0};
  Provider test;
  test.kind = Kind::kFake;
  test.capabilities.read_flushes_writes_on_any_backing = true;
  test.listen = [&](const std::string& address, uint16_t port, const ConnectionOptions&,
                    const AdmissionOptions&) -> Result<std::unique_ptr<Listener>> {
    ++listens;
    return Status(Errc::kUnsupported, "listen " + address + ":" + std::to_string(port));
  };
  test.connect = [&](const std::string& address, uint16_t port,
                     const ConnectionOptions&) -> Result<std::unique_ptr<Connection>> {
    ++connects;
    return Status(Errc::kUnsupported, "connect " + address + ":" + std::to_string(port));
  };
  Registry::instance().add(test);
  EXPECT_EQ(listen(Kind::kFake, "target", 7, {}).status().message(), "listen target:7");
  EXPECT_EQ(connect(Kind::kFake, "target", 8, {}).status().message(), "connect target:8");
  EXPECT_EQ(listens.load(), 1);
  EXPECT_EQ(connects.load(), 1);
  ASSERT_TRUE(capabilities(Kind::kFake).ok());
  EXPECT_TRUE(capabilities(Kind::kFake)->read_flushes_writes_on_any_backing);
  EXPECT_EQ(*kind_for_name("fake"), Kind::kFake);
  // Still never parsed from a configuration.
  EXPECT_EQ(parse_kind("fake").status().code(), Errc::kInvalidArgument);

  Registry::instance().remove(Kind::kFake);
  EXPECT_EQ(capabilities(Kind::kFake).status().code(), Errc::kFailedPrecondition);
  EXPECT_EQ(kind_for_name("fake").status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(listens.load(), 1);
}

}  // namespace
}  // namespace pmirror::transport

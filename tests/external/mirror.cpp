// An application of libpmirror's C++ API, built outside the pmirror tree
// against an installed one only (install_and_mirror.sh), as C++17.
//
//   mirror-cpp LOCAL_PATH TARGET_PORT SECRET MESSAGE
#include <pmirror/pmirror.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "mirror-cpp: %s\n", what.c_str());
  std::exit(1);
}

void check(const pmirror::Status& status, const std::string& what) {
  if (!status.ok()) die(what + ": " + status.to_string());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: mirror-cpp LOCAL_PATH PORT SECRET MESSAGE\n");
    return 2;
  }
  const std::string message = argv[4];

  pmirror::VolumeOptions options;
  options.name = "cpp";
  options.local_path = argv[1];
  options.size = 1 << 20;
  options.create = true;
  options.identity = "app";
  pmirror::ReplicaSpec replica;
  replica.address = "127.0.0.1";
  replica.port = static_cast<uint16_t>(std::atoi(argv[2]));
  replica.secret = argv[3];
  replica.node = "target";

  // The tests' in-process fake fabric is not reachable from here.
  replica.transport = "fake";
  options.replicas = {replica};
  auto refused = pmirror::Volume::open(options);
  if (refused.ok() || refused.status().code() != pmirror::Errc::kInvalidArgument ||
      refused.status().message().find("fake") == std::string::npos) {
    die("transport \"fake\" was not refused: " + refused.status().to_string());
  }

  options.replicas[0].transport = "tcp";
  auto opened = pmirror::Volume::open(options);
  if (!opened.ok()) die("open: " + opened.status().to_string());
  pmirror::Volume& volume = **opened;

  check(volume.write(4096, message.data(), message.size()), "write");
  uint64_t last = 0;
  for (uint64_t offset = 65536; offset < 131072; offset += 4096) {
    std::memset(volume.data() + offset, static_cast<int>(offset >> 12), 4096);
    auto started = volume.persist_async(offset, 4096);
    if (!started.ok()) die("persist_async: " + started.status().to_string());
    last = *started;
  }
  check(volume.wait(last), "wait");

  auto replicas = volume.replicas();
  if (replicas.size() != 1 || replicas[0].state != pmirror::ReplicaState::kConnected ||
      replicas[0].transport != "tcp") {
    die("expected one connected tcp replica");
  }
  std::printf("mirror-cpp: replica %s %s, method %s\n", replicas[0].address.c_str(),
              std::string(pmirror::replica_state_name(replicas[0].state)).c_str(),
              replicas[0].method.c_str());

  auto verified = volume.verify("", false);
  if (!verified.ok()) die("verify: " + verified.status().to_string());
  if (verified->size() != 1 || !(*verified)[0].status.ok() || !(*verified)[0].mismatches.empty()) {
    die("verify: expected the replica to equal the local copy");
  }
  if (volume.status_json().find("\"name\":\"target\"") == std::string::npos) {
    die("status_json does not name the replica");
  }
  pmirror::Status past_end = volume.persist(volume.size(), 1);
  if (past_end.code() != pmirror::Errc::kInvalidArgument) {
    die("a persist past the end was not refused: " + past_end.to_string());
  }
  std::printf("mirror-cpp: wrote cpp (%s)\n", std::string(pmirror::errc_name(past_end.code())).c_str());
  return 0;
}

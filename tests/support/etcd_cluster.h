// Test support: a real etcd cluster (N members on 127.0.0.1, free ports, a
// temp folder for data and logs) that a test can kill, stop, resume and
// restart member by member. Every member is SIGKILLed and the folder removed
// at the end.
//
//   std::string error;
//   auto cluster = EtcdCluster::start(3, &error);
//   ASSERT_TRUE(cluster) << error;
//   auto client = EtcdClient::create({.endpoints = cluster->endpoints()});
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace pmirror::testing {

// The etcd binary: $PMIRROR_ETCD, else /usr/bin/etcd. Empty, with *error
// saying what to install, when it is not there.
std::string etcd_binary(std::string* error);

class EtcdCluster {
 public:
  // Starts `members` members and waits (up to `timeout`) until every one
  // answers a linearizable read (so the cluster has a leader). nullptr, with
  // *error saying why and the tail of the logs, when it does not come up.
  static std::unique_ptr<EtcdCluster> start(
      int members, std::string* error,
      std::chrono::milliseconds timeout = std::chrono::seconds(60));
  ~EtcdCluster();  // SIGKILLs every member, removes the folder
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  // "http://127.0.0.1:P", one per member, in member order.
  std::vector<std::string> endpoints() const;
  std::string endpoint(int i) const;

  void kill(int i);    // SIGKILL and reap (no-op if not running)
  void stop(int i);    // SIGSTOP: the process hangs, its ports still accept
  void resume(int i);  // SIGCONT
  // Kills member i if it runs, starts it again on its data (it rejoins as
  // the same member) and waits until every running member answers. false,
  // with *error, if it does not.
  bool restart(int i, std::string* error,
               std::chrono::milliseconds timeout = std::chrono::seconds(60));

  // Waits until every running, not stopped member answers a linearizable
  // read. false, with *error (the members that did not, log tails).
  bool wait_ready(std::chrono::milliseconds timeout, std::string* error);

  std::string log(int i) const;  // everything member i wrote
  std::string log_tail(int i, size_t lines = 15) const;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  struct Member {
    std::string name;
    uint16_t client_port = 0;
    uint16_t peer_port = 0;
    std::string data_dir;
    std::string log_path;
    pid_t pid = -1;
    bool stopped = false;
    bool died = false;  // exited without being killed
  };
  EtcdCluster() = default;
  bool spawn(int i, std::string* error);
  bool exited(int i);  // reaps it if it has
  std::string tails() const;

  std::string binary_;
  std::filesystem::path dir_;
  std::string token_;
  std::string initial_cluster_;
  std::vector<Member> members_;
};

}  // namespace pmirror::testing

// The control socket: server, client, events, errors.
#include "control/control.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

namespace pmirror::control {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/pmctl-XXXXXX";
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Handler echo_handler() {
  return [](const json& request) -> Result<json> {
    const std::string command = request["command"];
    if (command == "echo") return request;
    if (command == "missing") return Result<json>(Errc::kNotFound, "no volume 'x'");
    if (command == "throw") return json::parse("{not json");
    if (command == "sleep") {
      std::this_thread::sleep_for(1500ms);
      return json("slept");
    }
    return unknown_command(request);
  };
}

// A raw client: connect, write bytes, read lines.
class RawClient {
 public:
  explicit RawClient(const std::string& path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawClient() { ::close(fd_); }
  bool connected() const { return connected_; }
  int fd() const { return fd_; }
  bool send(const std::string& data) {
    return ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
  }
  // One line, or nullopt at EOF.
  std::optional<std::string> line() {
    for (;;) {
      size_t newline = buffer_.find('\n');
      if (newline != std::string::npos) {
        std::string out = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        return out;
      }
      char chunk[4096];
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string buffer_;
};

template <typename Predicate>
bool eventually(Predicate predicate, std::chrono::milliseconds limit = 5s) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return predicate();
}

TEST(ControlServer, RoundTrip) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok()) << server.status().message();
  EXPECT_EQ((*server)->path(), path);
  json request = {{"command", "echo"}, {"n", 42}, {"text", "h\xc3\xa9llo"}};
  auto reply = control::request(path, request);
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(*reply, request);
}

// A command listed in concurrent_commands is answered while another
// request holds the handler (libpmirror: status during a verify); the
// others still wait their turn.
TEST(ControlServer, AConcurrentCommandIsAnsweredWhileAnotherRequestRuns) {
  TempDir dir;
  std::string path = dir.path() + "/c.sock";
  std::mutex mutex;
  std::condition_variable wake;
  bool release = false, holding = false;
  std::atomic<int> echoes_during_hold{0};
  ServerOptions options;
  options.concurrent_commands = {"status"};
  auto server = Server::start(
      path,
      [&](const json& request) -> Result<json> {
        const std::string command = request["command"];
        std::unique_lock lock(mutex);
        if (command == "hold") {
          holding = true;
          wake.notify_all();
          wake.wait(lock, [&] { return release; });
          return json("released");
        }
        if (command == "echo" && !release) ++echoes_during_hold;
        return json(command);
      },
      options);
  ASSERT_TRUE(server.ok()) << server.status().message();
  std::thread holder([&] {
    auto reply = control::request(path, {{"command", "hold"}}, 60s);
    EXPECT_TRUE(reply.ok() && *reply == "released") << reply.status().message();
  });
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(wake.wait_for(lock, 60s, [&] { return holding; }));
  }
  // While "hold" runs: status is answered (if it waited, the hold would
  // never be released and this would time out).
  auto status = control::request(path, {{"command", "status"}}, 60s);
  ASSERT_TRUE(status.ok()) << status.status().message();
  EXPECT_EQ(*status, "status");
  // An ordinary command waits for the hold to end.
  std::thread echo([&] {
    auto reply = control::request(path, {{"command", "echo"}}, 60s);
    EXPECT_TRUE(reply.ok()) << reply.status().message();
  });
  std::this_thread::sleep_for(100ms);  // give it a chance to overtake (it must not)
  {
    std::lock_guard lock(mutex);
    release = true;
  }
  wake.notify_all();
  holder.join();
  echo.join();
  EXPECT_EQ(echoes_during_hold.load(), 0) << "a serialised command ran during the hold";
}

TEST(ControlServer, SeveralRequestsOnOneConnection) {
  TempDir dir;
  std::string path = dir.path() + "/s.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  RawClient client(path);
  ASSERT_TRUE(client.connected());
  ASSERT_TRUE(client.send("{\"command\":\"echo\",\"i\":1}\n{\"command\":\"echo\",\"i\":2}\n"));
  for (int i = 1; i <= 2; ++i) {
    auto line = client.line();
    ASSERT_TRUE(line);
    json reply = json::parse(*line);
    EXPECT_EQ(reply["ok"], true);
    EXPECT_EQ(reply["result"]["i"], i);
  }
}

TEST(ControlServer, GarbageGetsAnErrorReplyAndTheConnectionSurvives) {
  TempDir dir;
  std::string path = dir.path() + "/s.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  RawClient client(path);
  ASSERT_TRUE(client.send(std::string("not json at all\n[1,2]\n{\"command\":7}\n\x01\xff\xfe\n") +
                          "{\"command\":\"echo\"}\n"));
  for (int i = 0; i < 4; ++i) {
    auto line = client.line();
    ASSERT_TRUE(line);
    json reply = json::parse(*line);
    EXPECT_EQ(reply["ok"], false) << *line;
    EXPECT_EQ(reply["error"]["code"], "invalid argument") << *line;
    EXPECT_FALSE(reply["error"]["message"].get<std::string>().empty());
  }
  auto line = client.line();
  ASSERT_TRUE(line);
  EXPECT_EQ(json::parse(*line)["ok"], true);
}

TEST(ControlServer, OversizedRequestIsRefusedAndClosed) {
  TempDir dir;
  std::string path = dir.path() + "/s.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  RawClient client(path);
  std::string big(kMaxRequestBytes + 4096, 'x');
  client.send(big);
  auto line = client.line();
  ASSERT_TRUE(line);
  json reply = json::parse(*line);
  EXPECT_EQ(reply["ok"], false);
  EXPECT_NE(reply["error"]["message"].get<std::string>().find("larger than 65536"),
            std::string::npos);
  EXPECT_FALSE(client.line());  // closed
  // The server still serves others.
  EXPECT_TRUE(control::request(path, {{"command", "echo"}}).ok());
}

TEST(ControlServer, UnknownCommandErrorAndHandlerErrors) {
  TempDir dir;
  std::string path = dir.path() + "/s.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  auto unknown = control::request(path, {{"command", "frobnicate"}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), Errc::kInvalidArgument);
  EXPECT_EQ(unknown.status().message(), "unknown command 'frobnicate'");
  auto missing = control::request(path, {{"command", "missing"}});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Errc::kNotFound);
  EXPECT_EQ(missing.status().message(), "no volume 'x'");
  auto thrown = control::request(path, {{"command", "throw"}});
  ASSERT_FALSE(thrown.ok());
  EXPECT_EQ(thrown.status().code(), Errc::kInternal);
  EXPECT_TRUE(control::request(path, {{"command", "echo"}}).ok());
}

TEST(ControlServer, SecondServerOnTheSamePathIsRefused) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  auto first = Server::start(path, echo_handler());
  ASSERT_TRUE(first.ok());
  auto second = Server::start(path, echo_handler());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Errc::kAlreadyExists);
  // "another <comm> is already running (pid N) on PATH"
  std::string expected = "is already running (pid " + std::to_string(::getpid()) + ") on " + path;
  EXPECT_NE(second.status().message().find(expected), std::string::npos)
      << second.status().message();
  EXPECT_EQ(second.status().message().rfind("another ", 0), 0u);
  // The first is untouched.
  EXPECT_TRUE(control::request(path, {{"command", "echo"}}).ok());
}

// Leaves a socket file nobody listens on, as a killed process does.
void make_stale_socket(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ::close(fd);
}

TEST(ControlServer, StaleSocketIsReplaced) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  make_stale_socket(path);
  auto stale = control::request(path, {{"command", "echo"}});
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), Errc::kConnectionError);
  EXPECT_NE(stale.status().message().find("stale socket " + path), std::string::npos);
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok()) << server.status().message();
  EXPECT_TRUE(control::request(path, {{"command", "echo"}}).ok());
}

TEST(ControlServer, PathThatIsNotASocketIsLeftAlone) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  std::ofstream(path) << "precious";
  auto server = Server::start(path, echo_handler());
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("is not a socket"), std::string::npos);
  std::ifstream in(path);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "precious");
}

TEST(ControlServer, SocketIsOwnerOnlyAndParentIsCreated) {
  TempDir dir;
  std::string parent = dir.path() + "/run/pmirror";
  std::string path = parent + "/pmirrord.sock";
  ::umask(0);  // the mode must not depend on the caller's umask
  auto server = Server::start(path, echo_handler());
  ::umask(022);
  ASSERT_TRUE(server.ok()) << server.status().message();
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(::stat(parent.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
}

TEST(ControlServer, DestructorRemovesTheSocket) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  {
    auto server = Server::start(path, echo_handler());
    ASSERT_TRUE(server.ok());
    EXPECT_TRUE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  auto gone = control::request(path, {{"command", "echo"}});
  EXPECT_EQ(gone.status().code(), Errc::kNotFound);
}

TEST(ControlServer, EventsReachTwoSubscribersInOrder) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  constexpr int kEvents = 200;
  std::vector<int> seen[2];
  std::thread subscribers[2];
  Status results[2];
  for (int s = 0; s < 2; ++s) {
    subscribers[s] = std::thread([&, s] {
      results[s] = subscribe(path, [&](const json& event) {
        seen[s].push_back(event["i"].get<int>());
        return seen[s].size() < kEvents;
      });
    });
  }
  ASSERT_TRUE(eventually([&] { return (*server)->subscriber_count() == 2; }));
  for (int i = 0; i < kEvents; ++i) (*server)->publish({{"i", i}, {"volume", "db0"}});
  for (int s = 0; s < 2; ++s) {
    subscribers[s].join();
    EXPECT_TRUE(results[s].ok()) << results[s].message();
    ASSERT_EQ(seen[s].size(), static_cast<size_t>(kEvents));
    for (int i = 0; i < kEvents; ++i) EXPECT_EQ(seen[s][i], i);
  }
  // Subscribers that hang up are forgotten.
  EXPECT_TRUE(eventually([&] { return (*server)->subscriber_count() == 0; }));
}

TEST(ControlServer, StalledSubscriberDoesNotBlockPublishers) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  RawClient stalled(path);
  int small = 4096;
  ::setsockopt(stalled.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  ASSERT_TRUE(stalled.send("{\"command\":\"events\"}\n"));
  ASSERT_TRUE(eventually([&] { return (*server)->subscriber_count() == 1; }));

  constexpr int kEvents = 5000;
  std::string payload(2048, 'p');
  // Every publish returns while the subscriber reads nothing at all: a
  // publisher that waited for it would never finish (the generous deadline
  // only keeps a broken build from hanging). Progress, not speed.
  std::atomic<int> published{0};
  std::thread publisher([&] {
    for (int i = 0; i < kEvents; ++i) {
      (*server)->publish({{"i", i}, {"payload", payload}});
      published.store(i + 1);
    }
  });
  bool finished = eventually([&] { return published.load() == kEvents; }, 120s);
  if (!finished) ::shutdown(stalled.fd(), SHUT_RDWR);  // unblock it, then fail
  publisher.join();
  ASSERT_TRUE(finished) << "publish blocked on a subscriber that does not read (" << published
                        << " of " << kEvents << ")";
  // Others are still served meanwhile.
  EXPECT_TRUE(control::request(path, {{"command", "echo"}}).ok());

  // Now read: the ack, then events in order, with {"dropped":N} where some
  // were lost; everything is accounted for.
  auto ack = stalled.line();
  ASSERT_TRUE(ack);
  EXPECT_EQ(json::parse(*ack)["result"]["subscribed"], true);
  int accounted = 0, last = -1, markers = 0;
  while (accounted < kEvents) {
    auto line = stalled.line();
    ASSERT_TRUE(line) << "after " << accounted;
    json event = json::parse(*line);
    if (event.contains("dropped")) {
      accounted += event["dropped"].get<int>();
      ++markers;
      continue;
    }
    int i = event["i"];
    EXPECT_GT(i, last);
    if (markers == 0) {
      EXPECT_EQ(i, last + 1);
    }
    last = i;
    ++accounted;
  }
  EXPECT_EQ(accounted, kEvents);
  EXPECT_GE(markers, 1);
}

TEST(ControlServer, StopsPromptlyWithAStalledSubscriber) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  RawClient stalled(path);
  RawClient idle(path);  // connected, never sends
  ASSERT_TRUE(stalled.send("{\"command\":\"events\"}\n"));
  ASSERT_TRUE(eventually([&] { return (*server)->subscriber_count() == 1; }));
  for (int i = 0; i < 3000; ++i) (*server)->publish({{"payload", std::string(4096, 'x')}});
  // Stopping completes although one client reads nothing and another says
  // nothing (progress: the deadline only guards against a hang).
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    server->reset();
    stopped = true;
  });
  bool finished = eventually([&] { return stopped.load(); }, 120s);
  if (!finished) {
    ::shutdown(stalled.fd(), SHUT_RDWR);
    ::shutdown(idle.fd(), SHUT_RDWR);
  }
  stopper.join();
  EXPECT_TRUE(finished) << "the server's destructor waited for a stalled or idle client";
  EXPECT_FALSE(std::filesystem::exists(path));
}

// Idle connections (connected, silent) never lock a request out: the
// oldest idle one makes room. An idle one is told and closed after the
// idle timeout.
TEST(ControlServer, IdleConnectionsNeverLockARequestOut) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  std::vector<std::unique_ptr<RawClient>> idle;
  for (size_t i = 0; i < kMaxConnections + 36; ++i) {
    idle.push_back(std::make_unique<RawClient>(path));
    ASSERT_TRUE(idle.back()->connected());
  }
  for (int round = 0; round < 3; ++round) {
    auto reply = control::request(path, {{"command", "echo"}, {"round", round}});
    ASSERT_TRUE(reply.ok()) << reply.status().message();
    EXPECT_EQ((*reply)["round"], round);
  }
  // The oldest ones were closed to make room, with a word why.
  auto said = idle.front()->line();
  ASSERT_TRUE(said);
  EXPECT_NE(said->find("was idle"), std::string::npos) << *said;
  EXPECT_FALSE(idle.front()->line()) << "still open";
}

TEST(ControlServer, AnIdleConnectionIsClosedAfterItsTimeout) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  ServerOptions options;
  options.idle_timeout = 200ms;
  auto server = Server::start(path, echo_handler(), options);
  ASSERT_TRUE(server.ok());
  RawClient silent(path);
  timeval guard{30, 0};  // against a hang only
  ::setsockopt(silent.fd(), SOL_SOCKET, SO_RCVTIMEO, &guard, sizeof guard);
  auto said = silent.line();
  ASSERT_TRUE(said) << "closed without a word, or not closed at all";
  json reply = json::parse(*said);
  EXPECT_EQ(reply["error"]["code"], "timeout") << *said;
  EXPECT_FALSE(silent.line()) << "still open after the idle timeout";
  // A client that keeps asking is not idle.
  RawClient busy(path);
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(busy.send("{\"command\":\"echo\"}\n"));
    auto line = busy.line();
    ASSERT_TRUE(line);
    EXPECT_EQ(json::parse(*line)["ok"], true) << *line;
  }
}

// Subscribers count apart from requests and have their own cap.
TEST(ControlServer, SubscribersHaveTheirOwnCap) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  ServerOptions options;
  options.max_connections = 2;
  options.max_subscribers = 3;
  auto server = Server::start(path, echo_handler(), options);
  ASSERT_TRUE(server.ok());
  std::vector<std::unique_ptr<RawClient>> subscribers;
  for (int i = 0; i < 3; ++i) {
    subscribers.push_back(std::make_unique<RawClient>(path));
    ASSERT_TRUE(subscribers.back()->send("{\"command\":\"events\"}\n"));
    auto ack = subscribers.back()->line();
    ASSERT_TRUE(ack);
    EXPECT_EQ(json::parse(*ack)["ok"], true) << *ack;
  }
  EXPECT_EQ((*server)->subscriber_count(), 3u);
  // Requests still go through (subscribers do not take request slots).
  EXPECT_TRUE(control::request(path, {{"command", "echo"}}).ok());
  RawClient fourth(path);
  ASSERT_TRUE(fourth.send("{\"command\":\"events\"}\n"));
  auto refused = fourth.line();
  ASSERT_TRUE(refused);
  EXPECT_EQ(json::parse(*refused)["error"]["code"], "resource exhausted") << *refused;
  // The subscribers still get events.
  (*server)->publish({{"i", 1}});
  for (auto& s : subscribers) {
    auto event = s->line();
    ASSERT_TRUE(event);
    EXPECT_EQ(json::parse(*event)["i"], 1);
  }
}

TEST(ControlServer, SubscribeStopsOnRequest) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  std::stop_source stop;
  Status result(Errc::kInternal, "not run");
  std::thread subscriber([&] {
    result = subscribe(
        path, [](const json&) { return true; }, stop.get_token());
  });
  ASSERT_TRUE(eventually([&] { return (*server)->subscriber_count() == 1; }));
  stop.request_stop();
  subscriber.join();
  EXPECT_TRUE(result.ok()) << result.message();
}

TEST(ControlServer, SubscriberLearnsWhenTheServerGoes) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  Status result;
  std::thread subscriber([&] { result = subscribe(path, [](const json&) { return true; }); });
  ASSERT_TRUE(eventually([&] { return (*server)->subscriber_count() == 1; }));
  server->reset();
  subscriber.join();
  EXPECT_EQ(result.code(), Errc::kClosed);
  EXPECT_NE(result.message().find("closed the connection"), std::string::npos);
}

TEST(ControlClient, MissingSocket) {
  TempDir dir;
  auto reply = control::request(dir.path() + "/pmirrord.sock", {{"command", "status"}});
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), Errc::kNotFound);
  EXPECT_EQ(reply.status().message(),
            "pmirrord is not running (no socket at " + dir.path() + "/pmirrord.sock)");
}

TEST(ControlClient, NotASocket) {
  TempDir dir;
  std::string path = dir.path() + "/pmirrord.sock";
  std::ofstream(path) << "x";
  auto reply = control::request(path, {{"command", "status"}});
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), Errc::kInvalidArgument);
  EXPECT_NE(reply.status().message().find(path + " is not a socket"), std::string::npos);
}

TEST(ControlClient, Timeout) {
  TempDir dir;
  std::string path = dir.path() + "/s.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  auto reply = control::request(path, {{"command", "sleep"}}, 200ms);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), Errc::kTimeout);
  EXPECT_EQ(reply.status().message(), "no answer from " + path + " within 200 ms");
}

TEST(ControlClient, PathTooLong) {
  auto reply = control::request("/tmp/" + std::string(200, 'a'), {{"command", "status"}});
  EXPECT_EQ(reply.status().code(), Errc::kInvalidArgument);
}

TEST(ControlClient, PermissionDeniedForOtherUsers) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch to another user";
  TempDir dir;
  ::chmod(dir.path().c_str(), 0755);
  std::string path = dir.path() + "/pmirrord.sock";
  auto server = Server::start(path, echo_handler());
  ASSERT_TRUE(server.ok());
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(100);
    auto reply = control::request(path, {{"command", "echo"}});
    std::string message = reply.ok() ? "ok" : reply.status().message();
    [[maybe_unused]] ssize_t n = ::write(pipe_fds[1], message.data(), message.size());
    ::_exit(reply.ok() ? 0 : static_cast<int>(reply.status().code()));
  }
  ::close(pipe_fds[1]);
  std::string message;
  char chunk[512];
  ssize_t n;
  while ((n = ::read(pipe_fds[0], chunk, sizeof(chunk))) > 0) message.append(chunk, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), static_cast<int>(Errc::kPermissionDenied)) << message;
  EXPECT_EQ(message, "permission denied on " + path + ": run as root");
}

TEST(ControlPaths, RuntimeDirAndSocketNames) {
  ::setenv("PMIRROR_RUNTIME_DIR", "/tmp/elsewhere", 1);
  EXPECT_EQ(runtime_dir(), "/tmp/elsewhere");
  EXPECT_EQ(initiator_socket_path(42), "/tmp/elsewhere/initiator-42.sock");
  EXPECT_EQ(daemon_socket_path(), "/tmp/elsewhere/pmirrord.sock");
  ::unsetenv("PMIRROR_RUNTIME_DIR");
  EXPECT_EQ(runtime_dir(), "/run/pmirror");
  EXPECT_EQ(daemon_socket_path(), "/run/pmirror/pmirrord.sock");
  EXPECT_EQ(initiator_socket_path(7, "/x"), "/x/initiator-7.sock");
}

TEST(ControlPaths, ListInitiatorSockets) {
  TempDir dir;
  for (const char* name : {"initiator-12.sock", "initiator-3.sock", "pmirrord.sock",
                           "initiator-x.sock", "initiator-.sock", "initiator-5.sock.old"}) {
    std::ofstream(dir.path() + "/" + name) << "";
  }
  auto sockets = list_initiator_sockets(dir.path());
  ASSERT_TRUE(sockets.ok());
  ASSERT_EQ(sockets->size(), 2u);
  EXPECT_EQ((*sockets)[0].pid, 3);
  EXPECT_EQ((*sockets)[0].path, dir.path() + "/initiator-3.sock");
  EXPECT_EQ((*sockets)[1].pid, 12);
  auto none = list_initiator_sockets(dir.path() + "/missing");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(ControlErrc, NamesRoundTrip) {
  for (uint16_t code = 0; code <= static_cast<uint16_t>(Errc::kResourceExhausted); ++code) {
    EXPECT_EQ(errc_from_name(errc_name(static_cast<Errc>(code))), static_cast<Errc>(code));
  }
  EXPECT_EQ(errc_from_name("nonsense"), Errc::kInternal);
}

}  // namespace
}  // namespace pmirror::control

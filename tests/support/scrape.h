// Reading a Prometheus endpoint in tests: the body of GET /metrics, and the
// samples of one series.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <sstream>
#include <string>

namespace pmirror::testing {

// GET http://127.0.0.1:port/metrics: the body ("" when nothing answered).
inline std::string scrape(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return "";
  }
  std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char buffer[8192];
  for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) response.append(buffer, n);
  ::close(fd);
  size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The samples of series `name` in a scrape: labels as written between the
// braces ("volume=\"v\",role=\"primary\",peer=\"n1\"") -> value.
inline std::map<std::string, double> samples(const std::string& text, const std::string& name) {
  std::map<std::string, double> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name + "{", 0) != 0 && line.rfind(name + " ", 0) != 0) continue;
    std::string labels;
    size_t value_at = name.size() + 1;
    if (line[name.size()] == '{') {
      size_t close = line.rfind('}');
      if (close == std::string::npos) continue;
      labels = line.substr(name.size() + 1, close - name.size() - 1);
      value_at = close + 2;
    }
    if (value_at > line.size()) continue;
    try {
      out[labels] = std::stod(line.substr(value_at));
    } catch (...) {
    }
  }
  return out;
}

}  // namespace pmirror::testing

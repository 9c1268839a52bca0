// Shared pieces of the configuration: reading files (the config itself and
// secret files) and the value syntaxes (sizes, durations, host:port). The
// cluster schema is in cluster.cpp.
#include "config/config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "common/unique_fd.h"
#include "config/config_internal.h"

namespace pmirror::config {
namespace {

// Largest configuration file we read; far beyond any sane config, it only
// stops us from slurping a device or a mistaken multi-gigabyte path.
constexpr off_t kMaxConfigFileSize = 16 << 20;

}  // namespace

// Same rules as auth::read_secret_file (kept local so the config library
// does not link OpenSSL and the protocol code): a regular file, no
// group/other permission bits, non-empty, at most 4 KiB, one trailing
// newline stripped.
Result<std::string> read_secret_file(const std::string& path) {
  // O_NONBLOCK: a FIFO named by mistake must not hang the daemon in open().
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    Status status = errno_status(err == EACCES ? Errc::kPermissionDenied : Errc::kNotFound,
                                 "cannot open secret file " + path, err);
    if (err != ENOENT) return status;
    return Status(status.code(), status.message() + "; create it with `umask 077; openssl rand " +
                                     "-base64 32 > " + path + "`");
  }
  UniqueFd closer(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_status(Errc::kIoError, "cannot stat " + path, errno);
  if (!S_ISREG(st.st_mode)) {
    return Status(Errc::kInvalidArgument, "secret file " + path + " is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status(Errc::kPermissionDenied,
                  "secret file " + path + " has mode " + mode +
                      ", which lets group or others access it; run `chmod 600 " + path + "`");
  }
  if (st.st_size > static_cast<off_t>(kMaxSecretFileSize)) {
    return Status(Errc::kInvalidArgument, "secret file " + path + " is " +
                                              std::to_string(st.st_size) +
                                              " bytes; a secret file holds at most " +
                                              std::to_string(kMaxSecretFileSize) + " bytes");
  }
  std::string contents(kMaxSecretFileSize + 1, '\0');
  size_t length = 0;
  while (length < contents.size()) {
    ssize_t n = ::read(fd, contents.data() + length, contents.size() - length);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(Errc::kIoError, "cannot read secret file " + path, errno);
    }
    if (n == 0) break;
    length += static_cast<size_t>(n);
  }
  if (length > kMaxSecretFileSize) {  // grew after fstat
    return Status(Errc::kInvalidArgument, "secret file " + path + " is larger than " +
                                              std::to_string(kMaxSecretFileSize) + " bytes");
  }
  contents.resize(length);
  if (!contents.empty() && contents.back() == '\n') contents.pop_back();
  if (contents.empty()) {
    return Status(Errc::kInvalidArgument,
                  "secret file " + path + " is empty; put the shared secret in it");
  }
  return contents;
}

std::string default_metadata_path(const std::string& data_path, const std::string& volume) {
  if (data_path.rfind("/dev/dax", 0) == 0) return "/var/lib/pmirror/" + volume + ".pmirror";
  return data_path + ".pmirror";
}

Result<std::string> read_config_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return errno_status(Errc::kConfigError, "cannot open configuration file " + path, errno);
  }
  UniqueFd closer(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return errno_status(Errc::kConfigError, "cannot stat configuration file " + path, errno);
  }
  if (!S_ISREG(st.st_mode)) {
    return Status(Errc::kConfigError, "configuration file " + path + " is not a regular file" +
                                          (S_ISDIR(st.st_mode) ? " (it is a directory)" : ""));
  }
  if (st.st_size > kMaxConfigFileSize) {
    return Status(Errc::kConfigError, "configuration file " + path + " is " +
                                          std::to_string(st.st_size) +
                                          " bytes; that is not a pmirror configuration");
  }
  std::string text;
  char buffer[8192];
  while (true) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(Errc::kConfigError, "cannot read configuration file " + path, errno);
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

Result<uint64_t> parse_size(std::string_view text) {
  auto invalid = [&](const std::string& why) {
    return Status(Errc::kInvalidArgument, "invalid size '" + std::string(text) + "': " + why);
  };
  if (text.empty()) return invalid("empty");
  if (text.front() == '-') return invalid("a size cannot be negative");
  if (text.front() == '+') return invalid("write the number without a sign");
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) {
    return invalid(
        "expected a number of bytes, optionally with a K/M/G/T suffix (e.g. 4096, "
        "64MiB, 1G)");
  }
  uint64_t number = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + digits, number);
  if (ec == std::errc::result_out_of_range) return invalid("too large");
  if (ec != std::errc() || end != text.data() + digits) return invalid("not a number");

  std::string_view rest = text.substr(digits);
  if (!rest.empty() && (rest.front() == '.' || rest.front() == ',')) {
    return invalid("fractions are not allowed; use a smaller unit (e.g. 1536MiB, not 1.5GiB)");
  }
  // "64 MiB" reads naturally; allow spaces between number and unit.
  size_t spaces = 0;
  while (spaces < rest.size() && rest[spaces] == ' ') ++spaces;
  if (spaces != 0 && spaces == rest.size()) return invalid("trailing spaces");
  rest.remove_prefix(spaces);

  unsigned shift = 0;
  if (!rest.empty()) {
    switch (rest.front()) {
      case 'K':
      case 'k':
        shift = 10;
        break;
      case 'M':
      case 'm':
        shift = 20;
        break;
      case 'G':
      case 'g':
        shift = 30;
        break;
      case 'T':
      case 't':
        shift = 40;
        break;
      default:
        break;
    }
    if (shift != 0) rest.remove_prefix(1);
    if (shift != 0 && (rest == "" || rest == "B" || rest == "iB")) {
      // ok
    } else if (shift == 0 && rest == "B") {
      // plain bytes with a B
    } else {
      return invalid("unknown unit '" + std::string(text.substr(digits)) +
                     "'; use K, M, G or T, optionally followed by iB or B (all powers of 1024)");
    }
  }
  if (number == 0) return invalid("a size must be greater than zero");
  if (shift != 0 && number > (UINT64_MAX >> shift)) return invalid("too large");
  return number << shift;
}

Result<uint64_t> parse_rate(std::string_view text) {
  if (text == "unlimited" || text == "0" || text == "0/s") return uint64_t{0};
  constexpr std::string_view kPerSecond = "/s";
  if (text.size() <= kPerSecond.size() ||
      text.substr(text.size() - kPerSecond.size()) != kPerSecond) {
    return Status(Errc::kInvalidArgument,
                  "invalid rate '" + std::string(text) +
                      "': expected a size per second such as 100MiB/s, or 'unlimited'");
  }
  auto size = parse_size(text.substr(0, text.size() - kPerSecond.size()));
  if (!size.ok()) {
    return Status(Errc::kInvalidArgument,
                  "invalid rate '" + std::string(text) + "': " +
                      size.status().message().substr(size.status().message().find("': ") + 3));
  }
  return *size;
}

Result<std::chrono::milliseconds> parse_duration(std::string_view text) {
  auto invalid = [&](const std::string& why) {
    return Status(Errc::kInvalidArgument, "invalid duration '" + std::string(text) + "': " + why);
  };
  if (text.empty()) return invalid("empty");
  if (text.front() == '-') return invalid("a duration cannot be negative");
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) return invalid("expected a number with a unit: ms, s or m (e.g. 200ms, 5s)");
  uint64_t number = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + digits, number);
  if (ec != std::errc() || end != text.data() + digits) return invalid("too large");
  std::string_view unit = text.substr(digits);
  if (!unit.empty() && (unit.front() == '.' || unit.front() == ',')) {
    return invalid("fractions are not allowed; use a smaller unit (e.g. 1500ms, not 1.5s)");
  }
  uint64_t scale = 0;
  if (unit == "ms") {
    scale = 1;
  } else if (unit == "s") {
    scale = 1000;
  } else if (unit == "m") {
    scale = 60 * 1000;
  } else if (unit.empty()) {
    return invalid("a unit is required: ms, s or m (e.g. " + std::string(text) + "s or " +
                   std::string(text) + "ms)");
  } else {
    return invalid("unknown unit '" + std::string(unit) + "'; use ms, s or m");
  }
  // A day is far more than any heartbeat or back-off could sensibly be.
  constexpr uint64_t kMaxMilliseconds = 24ull * 3600 * 1000;
  if (number > kMaxMilliseconds / scale) return invalid("too large (at most 24 hours)");
  return std::chrono::milliseconds(static_cast<int64_t>(number * scale));
}

std::string check_host(std::string_view host) {
  const std::string text(host);
  if (host.empty()) return "the host is empty";
  if (host.find(':') != std::string_view::npos) {
    in6_addr ignored{};
    if (::inet_pton(AF_INET6, text.c_str(), &ignored) == 1) return {};
    return "'" + text + "' is not an IPv6 address";
  }
  // All digits and dots: meant as an IPv4 address, whatever a resolver
  // would make of it (999.999.1.1 is no host name either).
  if (host.find_first_not_of("0123456789.") == std::string_view::npos) {
    in_addr ignored{};
    if (::inet_pton(AF_INET, text.c_str(), &ignored) == 1) return {};
    return "'" + text +
           "' is not an IPv4 address (four numbers 0..255 separated by dots, without leading "
           "zeros)";
  }
  // A DNS host name (RFC 1123): labels of 1..63 letters, digits and '-',
  // not starting or ending with '-', separated by dots (one trailing dot
  // allowed); at most 253 characters.
  std::string_view name = host;
  if (name.back() == '.') name.remove_suffix(1);
  if (name.size() > 253) {
    return "'" + text + "' is " + std::to_string(name.size()) +
           " characters; a host name has at most 253";
  }
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    std::string_view label =
        name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (label.empty()) return "'" + text + "' is not a host name (an empty label between dots)";
    if (label.size() > 63) {
      return "'" + text + "' is not a host name (the label '" + std::string(label) + "' is " +
             std::to_string(label.size()) + " characters; at most 63)";
    }
    for (char c : label) {
      bool good =
          (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
      if (!good) {
        return "'" + text +
               "' is not an IP address or host name (a host name has only letters, "
               "digits, '-' and dots)";
      }
    }
    if (label.front() == '-' || label.back() == '-') {
      return "'" + text + "' is not a host name (the label '" + std::string(label) +
             "' starts or ends with '-')";
    }
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return {};
}

Result<HostPort> parse_host_port(std::string_view text) {
  auto invalid = [&](const std::string& why) {
    return Status(Errc::kInvalidArgument, "invalid address '" + std::string(text) + "': " + why);
  };
  std::string_view host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return invalid("missing ']' after the IPv6 address");
    host = text.substr(1, close - 1);
    std::string_view rest = text.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return invalid("expected ':PORT' after ']'");
    port_text = rest.substr(1);
    in6_addr ignored{};
    if (::inet_pton(AF_INET6, std::string(host).c_str(), &ignored) != 1) {
      return invalid("'" + std::string(host) + "' is not an IPv6 address");
    }
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) {
      return invalid("expected HOST:PORT (e.g. 127.0.0.1:9942)");
    }
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return invalid("write an IPv6 address in brackets, e.g. [::1]:9942");
    }
  }
  if (host.empty()) return invalid("the host is missing (e.g. 127.0.0.1:9942)");
  if (std::string problem = check_host(host); !problem.empty()) return invalid(problem);
  uint32_t port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (port_text.empty() || ec != std::errc() || end != port_text.data() + port_text.size() ||
      port < 1 || port > 65535) {
    return invalid("the port must be a number 1..65535");
  }
  return HostPort{std::string(host), static_cast<uint16_t>(port)};
}

std::string HostPort::to_string() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

}  // namespace pmirror::config

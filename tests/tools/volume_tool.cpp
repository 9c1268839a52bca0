// pmirror-volume-tool: small operations on a volume for lab scripts, where
// devdax cannot be read(2) by cmp or sha256sum.
//   pmirror-volume-tool zero   PATH SIZE   zero the first SIZE bytes and persist
//   pmirror-volume-tool digest PATH SIZE   print the SHA-256 of the first SIZE bytes
#include <openssl/evp.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "config/config.h"
#include "region/region.h"

int main(int argc, char** argv) {
  if (argc != 4 || (std::strcmp(argv[1], "zero") != 0 && std::strcmp(argv[1], "digest") != 0)) {
    std::fprintf(stderr, "usage: %s zero|digest PATH SIZE\n", argv[0]);
    return 2;
  }
  auto size = pmirror::config::parse_size(argv[3]);
  if (!size.ok()) {
    std::fprintf(stderr, "SIZE: %s\n", size.status().message().c_str());
    return 2;
  }
  auto region = pmirror::region::Region::open({argv[2], *size, false});
  if (!region.ok()) {
    std::fprintf(stderr, "%s\n", region.status().message().c_str());
    return 1;
  }
  if (std::strcmp(argv[1], "zero") == 0) {
    std::memset((*region)->data(), 0, *size);
    pmirror::Status persisted = (*region)->persist(0, *size);
    if (!persisted.ok()) {
      std::fprintf(stderr, "%s\n", persisted.message().c_str());
      return 1;
    }
    return 0;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  if (EVP_Digest((*region)->data(), *size, digest, &digest_len, EVP_sha256(), nullptr) != 1) {
    std::fprintf(stderr, "SHA-256 failed\n");
    return 1;
  }
  for (unsigned int i = 0; i < digest_len; ++i) std::printf("%02x", digest[i]);
  std::printf("\n");
  return 0;
}

// The C API over Volume. Every entry point catches everything: an exception
// (std::bad_alloc, say) must not unwind into C frames.
#include <string>

#include "initiator/initiator.h"
#include "initiator/pmirror.h"

struct pmirror_volume {
  std::unique_ptr<pmirror::initiator::Volume> volume;
};

namespace {

thread_local std::string last_error;

int fail(const pmirror::Status& status) {
  last_error = status.message();
  return -static_cast<int>(status.code());
}

int ok() {
  last_error.clear();
  return 0;
}

template <typename F>
int guarded(F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    last_error = std::string("internal error: ") + e.what();
  } catch (...) {
    last_error = "internal error: unknown exception";
  }
  return -PMIRROR_E_INTERNAL;
}

int check_volume(const pmirror_volume* volume) {
  if (volume == nullptr || !volume->volume) {
    last_error = "volume is NULL";
    return -PMIRROR_E_INVALID_ARGUMENT;
  }
  return 0;
}

}  // namespace

extern "C" {

int pmirror_open(const struct pmirror_options* options, pmirror_volume** volume) {
  return guarded([&] {
    using namespace pmirror;
    if (options == nullptr || volume == nullptr) {
      return fail(Status(Errc::kInvalidArgument, "options and volume must not be NULL"));
    }
    *volume = nullptr;
    initiator::VolumeOptions o;
    o.name = options->name ? options->name : "";
    o.local_path = options->local_path ? options->local_path : "";
    o.size = options->size;
    o.create = options->create != 0;
    o.identity = options->identity ? options->identity : "";
    if (options->max_in_flight != 0) o.max_in_flight = options->max_in_flight;
    if (options->replica_count > 0 && options->replicas == nullptr) {
      return fail(Status(Errc::kInvalidArgument, "replica_count > 0 but replicas is NULL"));
    }
    for (size_t i = 0; i < options->replica_count; ++i) {
      const pmirror_replica& r = options->replicas[i];
      initiator::ReplicaSpec spec;
      if (r.address == nullptr) {
        return fail(
            Status(Errc::kInvalidArgument, "replica " + std::to_string(i) + " has no address"));
      }
      spec.address = r.address;
      spec.port = r.port != 0 ? r.port : 7450;
      auto kind = transport::parse_kind(r.transport ? r.transport : "tcp");
      if (!kind.ok()) return fail(kind.status());
      spec.transport = *kind;
      spec.secret = r.secret ? r.secret : "";
      o.replicas.push_back(std::move(spec));
    }
    auto opened = initiator::Volume::open(o);
    if (!opened.ok()) return fail(opened.status());
    *volume = new pmirror_volume{std::move(opened).value()};
    return ok();
  });
}

void pmirror_close(pmirror_volume* volume) {
  (void)guarded([&] {
    delete volume;
    return 0;
  });
}

void* pmirror_data(const pmirror_volume* volume) {
  return volume && volume->volume ? volume->volume->data() : nullptr;
}

uint64_t pmirror_size(const pmirror_volume* volume) {
  return volume && volume->volume ? volume->volume->size() : 0;
}

int pmirror_persist(pmirror_volume* volume, uint64_t offset, uint64_t length) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    pmirror::Status s = volume->volume->persist(offset, length);
    return s.ok() ? ok() : fail(s);
  });
}

int pmirror_write(pmirror_volume* volume, uint64_t offset, const void* source, uint64_t length) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    if (source == nullptr && length > 0) {
      return fail(pmirror::Status(pmirror::Errc::kInvalidArgument, "source is NULL"));
    }
    pmirror::Status s = volume->volume->write(offset, source, length);
    return s.ok() ? ok() : fail(s);
  });
}

int pmirror_persist_async(pmirror_volume* volume, uint64_t offset, uint64_t length,
                          uint64_t* sequence) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    auto started = volume->volume->persist_async(offset, length);
    if (!started.ok()) return fail(started.status());
    if (sequence != nullptr) *sequence = *started;
    return ok();
  });
}

int pmirror_wait(pmirror_volume* volume, uint64_t sequence) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    pmirror::Status s = volume->volume->wait(sequence);
    return s.ok() ? ok() : fail(s);
  });
}

int pmirror_drain(pmirror_volume* volume) {
  return guarded([&] {
    if (int bad = check_volume(volume)) return bad;
    pmirror::Status s = volume->volume->drain();
    return s.ok() ? ok() : fail(s);
  });
}

const char* pmirror_errormsg(void) { return last_error.c_str(); }

}  // extern "C"

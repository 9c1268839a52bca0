// Names the calling thread (top -H, ps -L, /proc/PID/task/TID/comm, perf,
// gdb): an operator sees which of pmirrord's threads spends the CPU.
#pragma once

#include <pthread.h>

namespace pmirror {

// Linux keeps 15 characters; a longer name is refused and the thread keeps
// its old one, which is harmless.
inline void name_this_thread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace pmirror

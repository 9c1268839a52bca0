/* PMIRROR_EXPORT marks what libpmirror.so exports. The library is built
 * with hidden visibility and a linker version script
 * (lib/initiator/libpmirror.map); only what is marked here and matched there
 * is visible to applications. For an application the macro changes nothing. */
#ifndef PMIRROR_EXPORT_H
#define PMIRROR_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define PMIRROR_EXPORT __attribute__((visibility("default")))
#else
#define PMIRROR_EXPORT
#endif

#endif /* PMIRROR_EXPORT_H */

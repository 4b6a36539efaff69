// export.h: what the shared library exports.
//
// libbytescale.so is compiled with hidden visibility (CMakeLists.txt: C_VISIBILITY_PRESET hidden),
// so only declarations marked here are reachable by programs and bindings that link it; helpers
// shared between the library's own files (make_dirs, now_seconds, the JSON and file helpers, the
// training engine) stay inside it. The public API is the headers `make install` installs
// (docs/architecture.md, "The installed library").
//
//   BS_API                 on one declaration: `BS_API int bs_version_major(void);`
//   BS_API_BEGIN/BS_API_END around all the declarations of a public header (one pair per header, so
//                          a header's own lines stay as they are)
//
// The static library and the command do not care: visibility only decides what a shared object
// exports. Compilers without GCC's visibility attributes export everything, as before.
#ifndef BYTESCALE_EXPORT_H
#define BYTESCALE_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define BS_API __attribute__((visibility("default")))
#define BS_API_BEGIN _Pragma("GCC visibility push(default)")
#define BS_API_END _Pragma("GCC visibility pop")
#else
#define BS_API
#define BS_API_BEGIN
#define BS_API_END
#endif

#endif

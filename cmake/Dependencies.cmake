# Every dependency comes from Debian packages installed by scripts/install-deps.sh,
# or from the CUDA toolkit. See docs/ARCHITECTURE.md ("Dependencies").
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.11 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
find_package(PkgConfig REQUIRED)
# cpp-httplib in Debian is a compiled library: its pkg-config flags (OpenSSL/zlib/brotli
# macros) must match the .so's, or class layouts differ and the server crashes.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

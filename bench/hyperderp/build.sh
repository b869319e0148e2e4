#!/usr/bin/env bash
# Builds Hyper-DERP's `hyper-derp` server binary from a source tree outside
# this repository, for bench/run.sh --hyperderp. Not run by CI; nothing of
# Hyper-DERP is committed here. See bench/README.md ("Hyper-DERP").
#
# usage: bench/hyperderp/build.sh SRC_DIR WORK_DIR
#   SRC_DIR   a checkout of github.com/hyper-derp/Hyper-DERP
#   WORK_DIR  where dependency sources, liburing and the build go
#             (outside every git worktree); the binary ends up in
#             WORK_DIR/build/hyper-derp
#
# Environment:
#   HD_GIT     where to get dependency repositories, with {owner} and {name}
#              replaced; default https://github.com/{owner}/{name}.git (a
#              local mirror works too, e.g. /srv/mirror/{owner}+{name}/repo)
#   SPDLOG_TAG, MSGPACK_TAG, RYML_TAG, CROW_TAG, LIBURING_TAG
#              dependency versions; the defaults are those the source's
#              cmake/3rd_party_libs/fetch.cmake names (liburing: newest
#              release; Debian 12's liburing 2.3 is older than the 2.9 the
#              package declares)
#   JOBS       parallel compile jobs (default 2)
#   CC, CXX    compilers (default clang-19, clang++-19 with libc++-19)
#
# Debian 12 packages needed: clang-19 libc++-19-dev libc++abi-19-dev cmake
#   ninja-build libsodium-dev libssl-dev libbpf-dev libzmq3-dev cppzmq-dev
#   libcli11-dev libasio-dev libmnl-dev
set -euo pipefail

if [ "${CI:-}" = true ]; then
  echo "build.sh: not for CI (builds a third-party server for a manual comparison)" >&2
  exit 2
fi
[ $# -eq 2 ] || { sed -n '5,9p' "$0" >&2; exit 2; }
src=$(realpath "$1")
work=$(mkdir -p "$2" && realpath "$2")
[ -f "$src/CMakeLists.txt" ] && [ -f "$src/src/main.cc" ] \
  || { echo "build.sh: $src is not a Hyper-DERP source tree" >&2; exit 2; }

github='https://github.com/{owner}/{name}.git'
git_src=${HD_GIT:-$github}
jobs=${JOBS:-2}
cc=${CC:-clang-19}
cxx=${CXX:-clang++-19}
deps=$work/deps

# checkout OWNER/NAME REF DIR: the tree of REF (tag, branch or commit) in DIR.
# From a local mirror (HD_GIT a directory) by `git archive`, leaving out blobs
# the mirror lacks (large benchmark data, for instance), which are named.
checkout() {
  local repo=$1 ref=$2 dir=$3 url missing
  url=${git_src//\{owner\}/${repo%/*}}
  url=${url//\{name\}/${repo#*/}}
  if [ -f "$dir/.hd-ref" ] && [ "$(cat "$dir/.hd-ref")" = "$url $ref" ]; then
    return
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  if [ -d "$url" ]; then
    missing=$(git --git-dir="$url" rev-list --objects --missing=print "$ref" |
      sed -n 's/^?//p')
    local exclude=()
    if [ -n "$missing" ]; then
      while read -r _ _ sha path; do
        if grep -qx "$sha" <<<"$missing"; then
          echo "build.sh: $repo $ref: $path is absent from the mirror, left out" >&2
          exclude+=(":(exclude)$path")
        fi
      done < <(git --git-dir="$url" ls-tree -r "$ref")
    fi
    git --git-dir="$url" archive "$ref" -- . "${exclude[@]}" | tar -x -C "$dir"
  else
    git -C "$dir" init -q
    git -C "$dir" fetch -q --depth 1 "$url" "$ref"
    git -C "$dir" -c advice.detachedHead=false checkout -q FETCH_HEAD
  fi
  echo "$url $ref" >"$dir/.hd-ref"
}

# submodules DIR: check out DIR's submodules at their recorded commits.
submodules() {
  local dir=$1 key path url sha repo src ref
  [ -f "$dir/.gitmodules" ] || return 0
  read -r src ref <"$dir/.hd-ref"
  git config -f "$dir/.gitmodules" --get-regexp '^submodule\..*\.path$' |
    while read -r key path; do
      url=$(git config -f "$dir/.gitmodules" --get "${key%.path}.url")
      repo=${url#https://github.com/}
      repo=${repo%.git}
      if [ -d "$dir/.git" ]; then
        sha=$(git -C "$dir" ls-tree HEAD "$path" | awk '{print $3}')
      else
        sha=$(git --git-dir="$src" ls-tree "$ref" "$path" | awk '{print $3}')
      fi
      checkout "$repo" "$sha" "$dir/$path"
      submodules "$dir/$path"
    done
}

checkout gabime/spdlog "${SPDLOG_TAG:-v1.15.2}" "$deps/spdlog"
checkout msgpack/msgpack-c "${MSGPACK_TAG:-cpp-6.1.1}" "$deps/msgpack-cxx"
checkout biojppm/rapidyaml "${RYML_TAG:-v0.8.0}" "$deps/ryml"
submodules "$deps/ryml"
checkout CrowCpp/Crow "${CROW_TAG:-v1.3.0.0}" "$deps/crow"
# Crow's CMake downloads CPM.cmake (a release asset: the repository's
# cmake/CPM.cmake with its version filled in; CMake checks the hash) unless
# CPM_SOURCE_CACHE already holds it.
cpm_version=$(sed -n 's/^set(CPM_DOWNLOAD_VERSION \([0-9.]*\))$/\1/p' "$deps/crow/cmake/CPM.cmake")
checkout cpm-cmake/CPM.cmake "v$cpm_version" "$deps/cpm"
mkdir -p "$work/cpm-cache/cpm"
sed "s/1.0.0-development-version/$cpm_version/" "$deps/cpm/cmake/CPM.cmake" \
  >"$work/cpm-cache/cpm/CPM_$cpm_version.cmake"
checkout axboe/liburing "${LIBURING_TAG:-liburing-2.15}" "$deps/liburing"

# liburing, static, into WORK_DIR/liburing.
uring=$work/liburing
if [ ! -f "$uring/lib/liburing.a" ]; then
  (cd "$deps/liburing" && CC=$cc ./configure --prefix="$uring" >/dev/null &&
    make -s -C src -j"$jobs" && make -s -C src install >/dev/null)
fi

# The einheit operator CLI is a separate program the Debian package bundles;
# the server does not link it. Its sub-build fetches a further dozen
# repositories, so an empty `einheit` target satisfies the check in
# fetch.cmake instead.
mkdir -p "$work/einheit-absent"
cat >"$work/einheit-absent/CMakeLists.txt" <<'CMAKE'
# The einheit CLI is not built for the benchmark; hyper-derp does not link it.
add_custom_target(einheit)
CMAKE

# Debian 12's asio (1.24, which Crow includes) uses std::nested_exception and
# std::terminate without including <exception>; libc++ 19 no longer includes
# it transitively in C++23, hence the -include.
cmake -S "$src" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="-stdlib=libc++ -include exception" \
  -DCMAKE_EXE_LINKER_FLAGS=-stdlib=libc++ \
  -DBUILD_TESTING=OFF \
  -DURING_LIB="$uring/lib/liburing.a" -DURING_INCLUDE_DIR="$uring/include" \
  -DCPM_SOURCE_CACHE="$work/cpm-cache" \
  -DCLANG_BPF="$(command -v "$cc")" \
  -DEINHEIT_SOURCE_DIR="$work/einheit-absent" \
  -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
  -DFETCHCONTENT_SOURCE_DIR_SPDLOG="$deps/spdlog" \
  -DFETCHCONTENT_SOURCE_DIR_MSGPACK-CXX="$deps/msgpack-cxx" \
  -DFETCHCONTENT_SOURCE_DIR_RYML="$deps/ryml" \
  -DFETCHCONTENT_SOURCE_DIR_CROW="$deps/crow"
cmake --build "$work/build" --target hyper-derp -j "$jobs"
echo "built $work/build/hyper-derp"

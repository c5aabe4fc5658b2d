# Sourced by deploy/local/build.sh and tests/gpu/make_kit.sh from the
# checkout's root: sets `compiler_cache` to the CMake flags that compile
# through ccache where it is installed (deploy/local/install_deps.sh installs
# it), else to nothing. Paths under the checkout are hashed relative to it
# (CCACHE_BASEDIR), so ./build and ./build-cuda share the entries of every
# source compiled the same way in both: most of the CUDA build's sources.
# A cache directory that cannot be written (a read-only home) leaves it
# out rather than failing every compile.
compiler_cache=()
if command -v ccache >/dev/null; then
  cache_dir=$(ccache -k cache_dir 2>/dev/null || true)
  if [ -n "$cache_dir" ] && mkdir -p "$cache_dir" 2>/dev/null && [ -w "$cache_dir" ]; then
    export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
    compiler_cache=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  else
    echo "ccache: cache directory '$cache_dir' not writable; compiling without it" >&2
    compiler_cache=(-DCMAKE_C_COMPILER_LAUNCHER= -DCMAKE_CXX_COMPILER_LAUNCHER=)
  fi
fi

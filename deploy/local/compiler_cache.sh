# Sourced by deploy/local/build.sh and tests/gpu/make_kit.sh from the
# checkout's root: sets `compiler_cache` to the CMake flags that compile
# through ccache where it is installed (deploy/local/install_deps.sh installs
# it), else to nothing. Paths under the checkout are hashed relative to it
# (CCACHE_BASEDIR), so ./build and ./build-cuda share the entries of every
# source compiled the same way in both: most of the CUDA build's sources.
compiler_cache=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
  compiler_cache=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

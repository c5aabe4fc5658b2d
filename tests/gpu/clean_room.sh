#!/bin/sh
# The GPU run kit's binaries where Debian's libraries are gone: check_kit.sh
# runs this (POSIX sh: dash needs only glibc) in a mount namespace in which
# /usr/lib/x86_64-linux-gnu holds glibc alone and /etc/ld.so.cache is empty,
# the CUDA toolkit still at /usr/local/cuda. Checks:
#   1. Debian's libraries are really hidden (/usr/bin/mkdir, which needs
#      libselinux, cannot start);
#   2. the loader resolves every library of every binary and test;
#   3. `--help` of every binary, `--gtest_list_tests` of every test;
#   4. pdserve_make_model writes a Qwen3 model;
#   5. a router, a prefill and a decode worker (CPU) serve the demo model,
#      and pdserve_client streams its greedy continuation of a verse.
# With a fourth argument, resolve-only, 1 and 2 alone.
#   clean_room.sh KIT_DIR REPO_ROOT TMP_DIR [resolve-only]
set -u
kit=$1
root=$2
tmp=$3
only=${4:-}
ldso=/lib64/ld-linux-x86-64.so.2
pids=""
trap 'for p in $pids; do kill -9 "$p" 2>/dev/null; done' EXIT

fail() {
  echo "clean room: FAILED: $*"
  exit 1
}

# 1.
if /usr/bin/mkdir "$tmp/probe" 2>/dev/null; then fail "Debian's libraries are still visible"; fi
echo "clean room: Debian's libraries hidden (/usr/bin/mkdir cannot start)"

# 2.
n=0
for b in "$kit"/bin/* "$kit"/tests/*; do
  case "$b" in *.tsv) continue ;; esac
  if ! "$ldso" --list "$b" > "$tmp/list.txt" 2>&1; then fail "$b: $(cat "$tmp/list.txt")"; fi
  while read -r line; do
    case "$line" in *"not found"*) fail "$b: $line" ;; esac
  done < "$tmp/list.txt"
  n=$((n + 1))
done
echo "clean room: the loader resolves every library of $n binaries"
[ "$only" != resolve-only ] || exit 0

# 3.
for b in "$kit"/bin/*; do
  "$b" --help > "$tmp/help.txt" 2>&1 || fail "$b --help: $(cat "$tmp/help.txt")"
done
tab=$(printf '\t')
while IFS="$tab" read -r name timeout; do
  (cd "$kit/tests" && "./$name" --gtest_list_tests > "$tmp/list.txt" 2>&1) ||
    fail "$name --gtest_list_tests: $(cat "$tmp/list.txt")"
done < "$kit/tests/tests.tsv"
echo "clean room: --help of every binary and --gtest_list_tests of every test ran"

# 4.
"$kit/bin/pdserve_make_model" --out_dir="$tmp/model" --arch=qwen3 --dtype=bf16 \
  > "$tmp/make_model.txt" 2>&1 || fail "pdserve_make_model: $(cat "$tmp/make_model.txt")"
[ -s "$tmp/model/config.json" ] && [ -s "$tmp/model/model.safetensors" ] ||
  fail "pdserve_make_model wrote no model"
echo "clean room: pdserve_make_model wrote a Qwen3 model"

# 5.
wait_ready() {  # FILE PID NAME
  i=0
  while [ $i -lt 600 ]; do
    [ -s "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || fail "$3 exited: $(cat "${1%.ready}.log")"
    sleep 0.1
    i=$((i + 1))
  done
  fail "$3 not ready after 60 s"
}
field() {  # READY_FILE KEY: a string value of the ready file's JSON
  read -r json < "$1"
  v=${json#*\"$2\":\"}
  echo "${v%%\"*}"
}
model=$root/tools/demo_model
"$kit/bin/pdserve_router" --model_dir="$model" --ready_file="$tmp/router.ready" \
  > "$tmp/router.log" 2>&1 &
pids="$pids $!"
wait_ready "$tmp/router.ready" $! router
internal=127.0.0.1:$(field "$tmp/router.ready" internal_port)
for role in prefill decode; do
  "$kit/bin/pdserve_${role}_worker" --model_dir="$model" --router="$internal" --threads=1 \
    --ready_file="$tmp/$role.ready" > "$tmp/$role.log" 2>&1 &
  pids="$pids $!"
  wait_ready "$tmp/$role.ready" $! "$role worker"
done
prompt="For hatred does not cease by hatred at any time:"
want=" hatred ceases by love, this is an old rule. 5"
i=0
while :; do  # until the router lists both workers
  if "$kit/bin/pdserve_client" --router="$(field "$tmp/router.ready" grpc_address)" \
      --prompt="$prompt" --max_tokens=16 > "$tmp/text.txt" 2> "$tmp/client.txt"; then
    break
  fi
  i=$((i + 1))
  [ $i -lt 30 ] || fail "pdserve_client: $(cat "$tmp/client.txt")"
  sleep 1
done
read -r text < "$tmp/text.txt"
case " $text" in
  "$want"*) ;;
  *) fail "the demo model continued \"$prompt\" with \"$text\", not \"$want\"" ;;
esac
echo "clean room: a CPU cluster of the kit's services streamed \"$text\""

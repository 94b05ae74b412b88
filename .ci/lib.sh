# Sourced by .ci/run and .ci/install-as-users: the README's commands as CI reads them, and
# how a step is run where a system binary (a Redis server, a C compiler) cannot be found.

# The README's two commands, read from its first sh block so CI runs what it says.
mapfile -t readme_commands < <(
  awk '/^```sh$/ { inside = 1; next } inside && /^```$/ { exit }
       inside && /^[^#]/ { print }' README.md
)
if [ "${#readme_commands[@]}" -ne 2 ]; then
  echo "expected the README's two commands in its first sh block, found ${#readme_commands[@]}" >&2
  exit 1
fi

# Every Redis or Valkey server binary a test could find: on the PATH or in the usual places.
system_redis_servers() {
  local name dir
  for name in redis-server valkey-server redis-stack-server; do
    for dir in ${PATH//:/ } /usr/bin /usr/sbin /usr/local/bin /bin /sbin; do
      if [ -f "$dir/$name" ] && [ -x "$dir/$name" ]; then readlink -f "$dir/$name"; fi
    done
  done | sort -u
}
export -f system_redis_servers

# Every C or C++ compiler a build could find: the names setuptools and CC conventions use,
# on the PATH or in the usual places (gcc is /usr/bin/x86_64-linux-gnu-gcc-12 behind cc,
# gcc and the triplet names alike, hence readlink).
c_compilers() {
  local dir binary
  for dir in ${PATH//:/ } /usr/bin /usr/local/bin /bin; do
    for binary in "$dir"/{cc,c++,gcc,g++,clang,clang++,tcc} "$dir"/{gcc,g++,clang}-[0-9]* \
        "$dir"/*-linux-gnu-{gcc,g++} "$dir"/*-linux-gnu-{gcc,g++}-[0-9]*; do
      if [ -f "$binary" ] && [ -x "$binary" ]; then readlink -f "$binary"; fi
    done
  done | sort -u
}
export -f c_compilers

# Run "$@" where none of the binaries that the functions named in $1 list can be found or
# run. Each is covered by /dev/null in a private mount namespace, so shutil.which,
# `test -x` and an exec by absolute path all fail, while the machine outside keeps its
# copy. A shorter PATH would not do: redis-server and gcc live in /usr/bin beside python3
# and everything else.
without() {
  local listers=$1 hidden
  shift
  mapfile -t hidden < <(for lister in $listers; do "$lister"; done)
  if [ "${#hidden[@]}" -eq 0 ]; then
    echo "nothing to hide ($listers)"
    "$@"
    return
  fi
  echo "hiding ${hidden[*]} (unshare --mount)"
  LISTERS=$listers unshare --mount -- bash -c '
    set -euo pipefail
    mount --make-rprivate /
    for binary in "${@:2:$1}"; do mount --bind /dev/null "$binary"; done
    shift "$(($1 + 1))"
    still=$(for lister in $LISTERS; do "$lister"; done)
    if [ -n "$still" ]; then
      echo "still reachable: $still" >&2
      exit 1
    fi
    exec "$@"
  ' hide "${#hidden[@]}" "${hidden[@]}" "$@"
}

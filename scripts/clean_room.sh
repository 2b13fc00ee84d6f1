#!/usr/bin/env bash
# Clean room: proves that README's two commands work on a brand-new minimal Debian 12.
#
# It builds a minimal Debian 12 root (debootstrap --variant=minbase, from the mirror this machine's
# apt uses), copies the COMMITTED tree into it (git archive HEAD: an uncommitted file cannot hide a
# missing one), installs `make` (the only thing minbase lacks to type the commands), then runs, as
# root in a chroot with an empty environment and CI=true:
#     make train     # scripts/setup.sh must install everything else, then build and train
#     make test      # the whole test suite
# A package that setup.sh forgets, but that every dev machine has by accident, fails here.
#
# Time on 2 cores: about 10 minutes: debootstrap 1-1.5 min (2-5 s when the cached base is
# unpacked instead), make train ~5.5 min (apt ~45 s, build ~3.5 min, training 20-90 s), make
# test ~4 min. On a machine busy with other work it takes longer (23 min at load 6), and the
# timed tests may fail there (cli.default_run allows 2 minutes). Needs root and the Debian mirror;
# disk: ~1.5 GB under $TMPDIR (default /var/tmp) while it runs, removed at exit.
#
# Usage: bash scripts/clean_room.sh [--jobs N] [--log-dir DIR] [--no-cache]
#   --jobs N       JOBS for make (default: nproc)
#   --log-dir DIR  keep the full log of each phase there (default: a new temporary directory)
#   --no-cache     debootstrap afresh instead of unpacking the cached pristine base root
#
# Cache: the pristine minbase root (nothing installed yet) is kept as a tarball in
# /var/cache/zerone-clean-room/, keyed by suite + mirrors, and rebuilt after 30 days. Every run
# unpacks a fresh copy, so no run ever starts from a root where packages were already installed.
# Mounts (the root itself, proc, sys, dev, dev/pts, dev/shm) live in a private mount namespace and are unmounted,
# and the root removed, on every exit: success, failure, Ctrl-C, SIGTERM.
set -euo pipefail
{ # The whole script is one compound command, read before it runs: editing or checking out this
  # file while it runs cannot change what runs.

suite=bookworm
cache_dir=/var/cache/zerone-clean-room
cache_max_age_days=30
jobs="$(nproc)"
log_dir=""
use_cache=1

usage() { sed -n '/^# Usage:/,/^#$/{/^#$/d; s/^# \{0,1\}//; p}' "$0"; }
die() { echo "clean room: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) [ $# -ge 2 ] || die "--jobs needs a number"; jobs="$2"; shift 2 ;;
    --jobs=*) jobs="${1#*=}"; shift ;;
    --log-dir) [ $# -ge 2 ] || die "--log-dir needs a directory"; log_dir="$2"; shift 2 ;;
    --log-dir=*) log_dir="${1#*=}"; shift ;;
    --no-cache) use_cache=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs wants a positive number, got '$jobs'"

# Preconditions: these fail (never skip) so that CI cannot pass without proving anything.
[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot and mounts need it)"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
git_() { git -c safe.directory="$repo" -C "$repo" "$@"; }
commit="$(git_ rev-parse --short HEAD)" || die "$repo is not a git checkout with a commit"

# Run in a private mount namespace: mounts made here are invisible to the rest of the machine and
# vanish with this process even if it is killed with SIGKILL (the trap below unmounts them anyway).
if [ -z "${ZERONE_CLEAN_ROOM_NS:-}" ] && unshare --mount --propagation private true 2>/dev/null; then
  export ZERONE_CLEAN_ROOM_NS=1
  args=(--jobs "$jobs")
  [ -z "$log_dir" ] || args+=(--log-dir "$log_dir")
  [ "$use_cache" -eq 1 ] || args+=(--no-cache)
  exec unshare --mount --propagation private -- bash "${BASH_SOURCE[0]}" "${args[@]}"
fi

# ---------------------------------------------------------------------------------------------
# Timing and logs

if [ -z "$log_dir" ]; then log_dir="$(mktemp -d /tmp/zerone-clean-room-logs.XXXXXX)"; fi
mkdir -p "$log_dir"
log_dir="$(cd "$log_dir" && pwd)"
start_all=$SECONDS
timings=()
phase=""
phase_log=""
phase_start=0

fmt() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
begin() {  # begin NAME LOGFILE
  phase="$1"; phase_log="$log_dir/$2"; phase_start=$SECONDS
  : >"$phase_log"
  echo "clean room: $phase ... (log: $phase_log)"
}
end() {
  local t=$((SECONDS - phase_start))
  timings+=("$phase $(fmt "$t")")
  echo "clean room: $phase done in $(fmt "$t")"
  phase=""
}

# ---------------------------------------------------------------------------------------------
# Mirrors: the ones this machine's apt already uses (deb822 .sources or one-line sources.list).

# Prints "URI COMPONENTS..." of the first deb source that lists SUITE.
host_source() {
  local want="$1" f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    awk -v want="$want" '
      function flush() {
        if (types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " want " ") && uris != "" && !found) {
          split(uris, u, " "); print u[1], (comps == "" ? "main" : comps); found = 1
        }
        types = uris = suites = comps = ""
      }
      /^[ \t]*#/ { next }
      /^[ \t]*$/ { flush(); next }
      { key = tolower($1); sub(/^[^:]*:[ \t]*/, ""); }
      key == "types:" { types = $0 } key == "uris:" { uris = $0 }
      key == "suites:" { suites = $0 } key == "components:" { comps = $0 }
      END { flush() }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    awk -v want="$want" '
      $1 == "deb" { sub(/^deb[ \t]+(\[[^]]*\][ \t]+)?/, "");
        if ($2 == want) { uri = $1; $1 = $2 = ""; sub(/^ +/, ""); print uri, $0 } }' "$f"
  done
}

read -r mirror components <<<"$(host_source "$suite" | head -n1)" || true
read -r security_mirror _ <<<"$(host_source "$suite-security" | head -n1)" || true
mirror="${mirror:-http://deb.debian.org/debian}"; mirror="${mirror%/}"
components="${components:-main}"
security_mirror="${security_mirror:-http://deb.debian.org/debian-security}"; security_mirror="${security_mirror%/}"
echo "clean room: commit $commit, Debian $suite from $mirror (security: $security_mirror), JOBS=$jobs"
echo "clean room: logs in $log_dir"
if [ -n "$(git_ status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  echo "clean room: note: uncommitted changes in $repo are NOT tested (only HEAD $commit is)"
fi

# The mirror must answer: without it nothing can be proved, so this is a failure, not a skip.
probe="$(mktemp)"
if ! /usr/lib/apt/apt-helper download-file "$mirror/dists/$suite/InRelease" "$probe" >/dev/null 2>&1; then
  rm -f "$probe"; die "cannot reach the Debian mirror $mirror (no network?)"
fi
rm -f "$probe"

# ---------------------------------------------------------------------------------------------
# The root and its clean-up

work="$(mktemp -d "${TMPDIR:-/var/tmp}/zerone-clean-room.XXXXXX")"
work="$(cd "$work" && pwd -P)"   # as /proc/*/root and the mount table spell it
root="$work/root"
mkdir "$root"

# Mount points under $root, deepest first (from this namespace's mount table).
mounts_under_root() {
  awk -v r="$root" '{ p = $5; gsub(/\\040/, " ", p); if (p == r || index(p, r "/") == 1) print p }' \
    /proc/self/mountinfo | sort -r
}

# Stops what still runs inside the root (an interrupted make, a stray MPI daemon: all started by
# this script; TERM, then KILL), unmounts everything under it (deepest first, lazily if busy) and
# removes it, but only once nothing is mounted there any more. Idempotent.
torn_down=0
teardown() {
  local pids p m i
  [ "$torn_down" -eq 0 ] || return 0
  torn_down=1
  echo "clean room: removing the root $work"
  for i in 1 2 3; do
    pids=()
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && pids+=("${p#/proc/}")
    done
    [ ${#pids[@]} -eq 0 ] && break
    kill "$([ "$i" -lt 3 ] && echo -TERM || echo -KILL)" "${pids[@]}" 2>/dev/null
    sleep 1
  done
  while read -r m; do
    [ -n "$m" ] || continue
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || echo "clean room: cannot unmount $m" >&2
  done < <(mounts_under_root)
  if [ -n "$(mounts_under_root)" ]; then
    echo "clean room: mounts remain under $root; NOT removing it:" >&2
    mounts_under_root >&2
    return 1
  fi
  # --one-file-system: never descend into another file system, whatever happened above.
  rm -rf --one-file-system "$work"
}

# shellcheck disable=SC2317 # called by the trap
on_exit() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ -n "$signal" ]; then
    echo "clean room: interrupted by $signal in phase '${phase:-set-up}'" >&2
  elif [ "$rc" -ne 0 ] && [ -n "$phase" ]; then
    echo "clean room: FAILED in phase '$phase' after $(fmt $((SECONDS - phase_start))); last lines of $phase_log:" >&2
    tail -n 60 "$phase_log" >&2
  fi
  [ -z "$cached" ] || rm -f "$cached.tmp.$$"
  teardown || { [ "$rc" -ne 0 ] || rc=1; }
  if [ "$rc" -ne 0 ]; then
    echo "clean room: FAIL (commit $commit, $(fmt $((SECONDS - start_all))) in all; logs: $log_dir)" >&2
  fi
  exit "$rc"
}
signal=""
cached=""
trap on_exit EXIT
trap 'signal=SIGINT; exit 130' INT
trap 'signal=SIGTERM; exit 143' TERM

# Runs a command inside the root, as root, with a clean environment; its output goes to the phase
# log, each line stamped with the time (to see where a phase spends it). In the background + wait,
# so that SIGINT/SIGTERM reach the trap at once instead of after the command.
in_root() {
  { chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 CI=true \
      /bin/bash -c "$1" </dev/null 2>&1 |
      while IFS= read -r line; do printf '%(%H:%M:%S)T %s\n' -1 "$line"; done >>"$phase_log"; } &
  wait $!
}

# ---------------------------------------------------------------------------------------------
# 1. A pristine minbase root: unpacked from the cache, or debootstrapped (and then cached).

key="$(printf '%s\n' "$suite" minbase "$mirror" "$security_mirror" "$components" | sha256sum | cut -c1-16)"
cached="$cache_dir/$suite-minbase-$key.tar.gz"
if [ "$use_cache" -eq 1 ] && [ -f "$cached" ] && [ -z "$(find "$cached" -mtime +"$cache_max_age_days")" ]; then
  begin "unpack cached base root" 01-base.log
  echo "unpacking $cached" >>"$phase_log"
  tar --numeric-owner -xzf "$cached" -C "$root" >>"$phase_log" 2>&1 ||
    { rm -f "$cached"; die "cannot unpack $cached (removed it: the next run debootstraps)"; }
  end
else
  begin "debootstrap $suite minbase" 01-base.log
  if ! command -v debootstrap >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    { apt-get install -y --no-install-recommends debootstrap ||
        { apt-get update && apt-get install -y --no-install-recommends debootstrap; }; } >>"$phase_log" 2>&1
  fi
  # shellcheck disable=SC2086 # components: one word per component
  debootstrap --variant=minbase --components="$(echo $components | tr ' ' ,)" \
    "$suite" "$root" "$mirror" >>"$phase_log" 2>&1
  # apt sources as this machine has them: the suite, its updates, its security updates.
  signed_by=""
  [ -f "$root/usr/share/keyrings/debian-archive-keyring.gpg" ] &&
    signed_by="Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: $components
$signed_by

Types: deb
URIs: $security_mirror
Suites: $suite-security
Components: $components
$signed_by
EOF
  rm -rf "$root/var/cache/apt/archives/"*.deb
  if [ "$use_cache" -eq 1 ]; then
    mkdir -p "$cache_dir"
    tar --numeric-owner -czf "$cached.tmp.$$" -C "$root" . >>"$phase_log" 2>&1
    mv -f "$cached.tmp.$$" "$cached"
    echo "cached the pristine base root as $cached" >>"$phase_log"
  fi
  end
fi

# ---------------------------------------------------------------------------------------------
# 2. The committed tree, the machine's network identity, and the mounts.

begin "copy commit $commit, mount" 02-prepare.log
mkdir -p "$root/root/zerone"
git_ archive --format=tar HEAD | tar -x -C "$root/root/zerone"
# What any installed Debian machine has: name resolution for the network and for its own name.
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
if [ ! -s "$root/etc/hosts" ]; then
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
    "$(hostname)" >"$root/etc/hosts"
fi
mount --bind "$root" "$root"      # "/" is a mount point, as on any machine (`unshare -m` needs that)
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t sysfs -o nosuid,nodev,noexec,ro sysfs "$root/sys"       # hwloc (Open MPI) reads it
mount --bind /dev "$root/dev"                                     # /dev itself, without submounts
mount --make-private "$root/dev"                                  # nothing mounted below leaks out
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$root/dev/pts"
mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs "$root/dev/shm"    # MPI shared memory
mounts_under_root >>"$phase_log"
end

# ---------------------------------------------------------------------------------------------
# 3. make: minbase does not have it, and a new user needs it to type `make train`. Only make.

begin "install make" 03-make.log
in_root 'if command -v make >/dev/null; then
           echo "minbase already has make"
         else
           echo "minbase lacks make: installing only make"
           export DEBIAN_FRONTEND=noninteractive
           apt-get update && apt-get install -y --no-install-recommends make
         fi'
end

# ---------------------------------------------------------------------------------------------
# 4. The two README commands, in the copied tree.

begin "make train" 04-make-train.log
in_root "cd /root/zerone && make train JOBS=$jobs"
end

begin "make test" 05-make-test.log
in_root "cd /root/zerone && make test JOBS=$jobs"
summary="$(grep -E 'tests passed|tests failed' "$phase_log" | tail -n1 | cut -d' ' -f2- || true)"
end

teardown
echo "clean room: ${summary:-make test passed}"
printf 'clean room: %s\n' "${timings[@]}"
echo "clean room: PASS: make train + make test on a fresh Debian $suite minbase (commit $commit) in $(fmt $((SECONDS - start_all)))"
exit 0
}

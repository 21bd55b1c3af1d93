# apt_get: apt-get that waits while another package manager run holds apt's or dpkg's lock (a
# fresh machine whose image still runs its own apt at boot, unattended-upgrades, a second setup)
# instead of failing at once with `E: Could not get lock /var/lib/dpkg/lock-frontend` (exit 100),
# and says what it waits for. Sourced by scripts/setup.sh; every apt-get call in scripts/ goes
# through it (tests/test_scripts.py checks).
#
# apt-get's own `-o DPkg::Lock::Timeout=S` makes `install` wait for dpkg's locks, but apt 2.6
# ignores it for the package lists' lock (`apt-get update` fails at once) and the download cache's:
# hence the loop, which retries while a lock is held, until TRACEGUARD_APT_LOCK_TIMEOUT seconds
# (default 900) have passed. TRACEGUARD_APT_LOCKS lists the lock files watched (the tests point
# it, and apt, at a temporary directory).

APT_LOCK_TIMEOUT=${TRACEGUARD_APT_LOCK_TIMEOUT:-900}
APT_LOCKS=${TRACEGUARD_APT_LOCKS:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock}
APT_POLL_S=${TRACEGUARD_APT_POLL_S:-5}

# apt_lock_holder FILE: "PID (NAME)" of the process holding FILE's fcntl lock (the kind apt and
# dpkg take), from /proc/locks; nothing when FILE is missing or free.
apt_lock_holder() {
  local file=$1 dev ino major minor key pid name
  [ -e "$file" ] && [ -r /proc/locks ] || return 0
  dev=$(stat -c %d "$file") && ino=$(stat -c %i "$file") || return 0
  # /proc/locks names a file as MAJOR:MINOR:INODE, major and minor in hex (glibc's dev_t split).
  major=$(( ((dev >> 8) & 0xfff) | ((dev >> 32) & ~0xfff) ))
  minor=$(( (dev & 0xff) | ((dev >> 12) & ~0xff) ))
  key=$(printf '%02x:%02x:%s' "$major" "$minor" "$ino")
  # Fields: "N: POSIX ADVISORY WRITE PID MAJ:MIN:INODE START END"; waiters ("N: -> ...") skipped.
  pid=$(awk -v key="$key" '$2 != "->" && $6 == key { print $5; exit }' /proc/locks)
  [ -n "$pid" ] || return 0
  name=$(cat "/proc/$pid/comm" 2>/dev/null || echo "another namespace's process")
  echo "$pid ($name)"
}

# apt_lock_held: the first watched lock that is held, as "FILE, held by process PID (NAME)".
apt_lock_held() {
  local file holder
  for file in $APT_LOCKS; do
    holder=$(apt_lock_holder "$file")
    if [ -n "$holder" ]; then
      echo "$file, held by process $holder"
      return 0
    fi
  done
  return 1
}

# apt_get ARGS...: `apt-get ARGS...` (noninteractive), waiting for the locks as described above.
apt_get() {
  local deadline=$((SECONDS + APT_LOCK_TIMEOUT)) held last="" rc left
  while :; do
    if held=$(apt_lock_held); then
      left=$((deadline - SECONDS))
      if [ "$left" -le 0 ]; then
        echo "setup: gave up after ${APT_LOCK_TIMEOUT}s waiting for $held (TRACEGUARD_APT_LOCK_TIMEOUT)" >&2
        return 100
      fi
      if [ "$held" != "$last" ]; then
        echo "setup: apt-get $*: waiting for $held (another package manager run; up to ${left}s more)" >&2
        last=$held
      fi
      sleep "$APT_POLL_S"
      continue
    fi
    left=$((deadline - SECONDS))
    rc=0
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$(( left > 1 ? left : 1 ))" "$@" || rc=$?
    # Exit 100 with a lock held: another run took it between the check and apt-get (`update`
    # and the download cache do not wait for it): wait again. Any other failure is the answer.
    if [ "$rc" = 100 ] && apt_lock_held >/dev/null && [ "$SECONDS" -lt "$deadline" ]; then
      continue
    fi
    return "$rc"
  done
}

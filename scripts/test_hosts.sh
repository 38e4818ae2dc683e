#!/usr/bin/env bash
# Test hosts: network namespaces kolo-h1..kolo-hN on this machine, each with its
# own host name (UTS namespace), its own address and its own sshd, joined by a
# bridge. They stand in for a cluster: kolorun reaches them over real ssh, gloo
# and MPI talk across their links, tbf shapes those links.
#
#   scripts/test_hosts.sh up N [--rate RATE] [--holder PID|--holder-parent]
#   scripts/test_hosts.sh down [--holder PID|--holder-parent]
#   scripts/test_hosts.sh run N [--rate RATE] -- COMMAND...   # up, COMMAND, down (always)
#   scripts/test_hosts.sh status          # prints the state file, exit 1 when down
#   scripts/test_hosts.sh exec kolo-hK COMMAND...   # COMMAND inside host K (net + name)
#   scripts/test_hosts.sh link kolo-hK up|down      # take host K's link down or up
#
# Network: bridge kolo-br0 with 198.18.17.1/24 on this machine (name kolo-h0),
# host K at 198.18.17.(10+K)/24 on the eth0 end of a veth pair whose other end
# (kolo-hK-br) is a port of the bridge. 198.18.0.0/15 is the range RFC 2544
# reserves for benchmarking; only these addresses are ever assigned, and only
# these names are written to /etc/hosts (lines ending "# kolo-test-hosts").
# RATE (tbf, e.g. 1gbit, 10gbit) shapes both directions of every host's link:
# egress of eth0 inside the host and egress of its bridge port.
#
# ssh: a client key, one host key per host and a known_hosts are generated when
# the hosts come up; STATE_DIR/ssh_config names them, so
#   ssh -F /run/kolo-hosts/ssh_config kolo-h1 hostname
# logs in as root without a password. STATE_DIR/env holds shell assignments for
# tests: KOLO_TEST_HOSTS, KOLO_TEST_SSH, KOLO_TEST_RATE.
#
# Idempotent: `up` brings whatever is missing to the requested state (adds or
# removes hosts, replaces the shaping) and keeps what is there. `down` removes
# everything `up` made, including every process still running in a host. With
# --holder PID, `up` registers PID as a user of the hosts and `down` removes
# only that registration, tearing down when no registered user is alive (the
# ctest fixture passes its ctest's pid, so concurrent test runs share the hosts).
# Needs root; exit code 77 (ctest's skip code) when not root or when network
# namespaces cannot be made here.
set -euo pipefail

STATE_DIR=/run/kolo-hosts
LOCK=/run/kolo-hosts.lock
BRIDGE=kolo-br0
SUBNET=198.18.17
MARK="# kolo-test-hosts"
MAX_HOSTS=200

die() { echo "test_hosts: $*" >&2; exit 1; }
skip() { echo "test_hosts: SKIP: $*" >&2; exit 77; }
host_ip() { echo "$SUBNET.$((10 + $1))"; }

usage() {
  sed -n '/^#   scripts/p' "$0" | sed 's/^#   /usage: /' >&2
  exit 2
}

need_root() {
  [[ $(id -u) -eq 0 ]] || skip "creating network namespaces needs root (this is uid $(id -u))"
  command -v ip >/dev/null || die "ip not found: apt-get install iproute2"
  [[ -x /usr/sbin/sshd ]] || die "/usr/sbin/sshd not found: apt-get install openssh-server"
  command -v ssh-keygen >/dev/null || die "ssh-keygen not found: apt-get install openssh-client"
}

# Hosts currently present (namespaces named kolo-hK), as numbers.
present_hosts() {
  ip netns list 2>/dev/null | sed -n 's/^kolo-h\([0-9][0-9]*\)\b.*/\1/p' | sort -n
}

# /etc/hosts may be a bind mount (containers): rewrite it in place, never by rename.
hosts_file_set() {
  local count=$1 tmp
  tmp=$(mktemp)
  grep -v -- "$MARK\$" /etc/hosts >"$tmp" || true
  if ((count > 0)); then
    echo "$SUBNET.1 kolo-h0 $MARK" >>"$tmp"
    for ((k = 1; k <= count; k++)); do echo "$(host_ip "$k") kolo-h$k $MARK" >>"$tmp"; done
  fi
  cat "$tmp" >/etc/hosts
  rm -f "$tmp"
}

sshd_pid() {
  local pid_file=$STATE_DIR/h$1/sshd.pid
  [[ -s $pid_file ]] || return 1
  local pid
  pid=$(<"$pid_file")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

keys() {
  mkdir -p -m 700 "$STATE_DIR"
  [[ -s $STATE_DIR/id_ed25519 ]] ||
    ssh-keygen -q -t ed25519 -N '' -C kolo-test-hosts -f "$STATE_DIR/id_ed25519"
  cp "$STATE_DIR/id_ed25519.pub" "$STATE_DIR/authorized_keys"
  chmod 600 "$STATE_DIR/authorized_keys"
  cat >"$STATE_DIR/ssh_config" <<EOF
# Written by scripts/test_hosts.sh for this run of the test hosts.
Host kolo-h*
  User root
  IdentityFile $STATE_DIR/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $STATE_DIR/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
  ConnectTimeout 10
  ServerAliveInterval 5
  ServerAliveCountMax 3
EOF
}

bridge_up() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge || skip "cannot create a bridge here"
  fi
  ip addr replace "$SUBNET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

host_up() {
  local k=$1 ns=kolo-h$1 port=kolo-h$1-br dir=$STATE_DIR/h$1 ip
  ip=$(host_ip "$k")
  if ! ip netns list | grep -q "^$ns\b"; then
    ip netns add "$ns" || skip "cannot create network namespaces here"
  fi
  ip -n "$ns" link set lo up
  if ! ip link show "$port" >/dev/null 2>&1; then
    ip link add "$port" type veth peer name eth0 netns "$ns"
  fi
  ip link set "$port" master "$BRIDGE"
  ip link set "$port" up
  ip -n "$ns" addr replace "$ip/24" dev eth0
  ip -n "$ns" link set eth0 up

  mkdir -p -m 700 "$dir"
  [[ -s $dir/ssh_host_ed25519_key ]] ||
    ssh-keygen -q -t ed25519 -N '' -C "$ns" -f "$dir/ssh_host_ed25519_key"
  cat >"$dir/sshd_config" <<EOF
ListenAddress $ip
Port 22
HostKey $dir/ssh_host_ed25519_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $STATE_DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
X11Forwarding no
MaxStartups 200
MaxSessions 200
EOF
  if ! sshd_pid "$k" >/dev/null; then
    mkdir -p /run/sshd  # sshd's privilege-separation directory
    # A UTS namespace of its own gives the host its name; sshd and every
    # session it starts inherit it.
    ip netns exec "$ns" unshare --uts sh -c "hostname $ns && exec /usr/sbin/sshd -f $dir/sshd_config" ||
      die "sshd of $ns did not start (see above)"
  fi
  for _ in $(seq 50); do sshd_pid "$k" >/dev/null && return 0; sleep 0.1; done
  die "sshd of $ns wrote no pid file"
}

# Every process whose network namespace is host K's: sshd, its sessions, and
# whatever they left behind.
host_pids() { ip netns pids "kolo-h$1" 2>/dev/null || true; }

host_down() {
  local k=$1 ns=kolo-h$1 pids
  pids=$(host_pids "$k")
  if [[ -n $pids ]]; then
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 20); do [[ -z $(host_pids "$k") ]] && break; sleep 0.1; done
    pids=$(host_pids "$k")
    [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
  fi
  ip link del "kolo-h$k-br" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$STATE_DIR/h$k"
}

# Bytes per second of a tc rate such as 10gbit, 500mbit, 100kbit.
rate_bytes() {
  [[ $1 =~ ^([0-9]+)([kmg]?)bit$ ]] || die "--rate '$1': write NUMBER[k|m|g]bit, e.g. 1gbit"
  local n=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in
    k) n=$((n * 1000)) ;; m) n=$((n * 1000000)) ;; g) n=$((n * 1000000000)) ;;
  esac
  echo $((n / 8))
}

burst_bytes() {
  local b=$(($(rate_bytes "$1") / 1000))
  echo $((b > 131072 ? b : 131072))
}

shape() {
  local k=$1 rate=$2 ns=kolo-h$1
  for where in "ip netns exec $ns tc qdisc" "tc qdisc"; do
    local dev=eth0
    [[ $where == "tc qdisc" ]] && dev=kolo-h$k-br
    $where del dev "$dev" root 2>/dev/null || true
    if [[ -n $rate ]]; then
      # burst: 1 ms at the rate, at least 128 KiB (two 64 KiB GSO packets);
      # latency bounds the queue (a deeper one only adds delay for TCP).
      $where add dev "$dev" root tbf rate "$rate" burst "$(burst_bytes "$rate")" latency 50ms ||
        die "tc tbf rate $rate on $dev failed"
    fi
  done
}

write_state() {
  local count=$1 rate=$2 list=""
  for ((k = 1; k <= count; k++)); do list+="${list:+,}kolo-h$k"; done
  cat >"$STATE_DIR/env" <<EOF
KOLO_TEST_HOSTS=$list
KOLO_TEST_SSH='ssh -F $STATE_DIR/ssh_config'
KOLO_TEST_SSH_CONFIG=$STATE_DIR/ssh_config
KOLO_TEST_LAUNCH_ADDR=$SUBNET.1
KOLO_TEST_RATE=${rate:-unshaped}
EOF
}

known_hosts() {
  local count=$1
  : >"$STATE_DIR/known_hosts"
  for ((k = 1; k <= count; k++)); do
    echo "kolo-h$k,$(host_ip "$k") $(cut -d' ' -f1-2 "$STATE_DIR/h$k/ssh_host_ed25519_key.pub")" \
      >>"$STATE_DIR/known_hosts"
  done
}

# Waits until every host answers over ssh with its own name.
check_ssh() {
  local count=$1
  for ((k = 1; k <= count; k++)); do
    local name=""
    for _ in $(seq 50); do
      name=$(ssh -F "$STATE_DIR/ssh_config" "kolo-h$k" hostname 2>/dev/null) && break
      sleep 0.2
    done
    [[ $name == "kolo-h$k" ]] || die "ssh kolo-h$k hostname gave '$name', not kolo-h$k"
  done
}

holders_alive() {
  local file=$STATE_DIR/holders live=""
  [[ -f $file ]] || return 1
  for pid in $(<"$file"); do kill -0 "$pid" 2>/dev/null && live+="$pid "; done
  echo "$live" >"$file"
  [[ -n $live ]]
}

do_up() {
  local count=$1 rate=$2 holder=$3
  [[ $count =~ ^[0-9]+$ ]] && ((count >= 1 && count <= MAX_HOSTS)) ||
    die "up: '$count' is not a host count in 1..$MAX_HOSTS"
  need_root
  keys
  bridge_up
  for k in $(present_hosts); do ((k > count)) && host_down "$k"; done
  for ((k = 1; k <= count; k++)); do host_up "$k"; shape "$k" "$rate"; done
  hosts_file_set "$count"
  known_hosts "$count"
  write_state "$count" "$rate"
  [[ -z $holder ]] || echo "$holder" >>"$STATE_DIR/holders"
  check_ssh "$count"
  echo "test_hosts: up: kolo-h1..kolo-h$count on $SUBNET.0/24, link ${rate:-unshaped}, ssh -F $STATE_DIR/ssh_config"
}

do_down() {
  local holder=$1
  if [[ -n $holder && -f $STATE_DIR/holders ]]; then
    grep -vx -- "$holder" "$STATE_DIR/holders" >"$STATE_DIR/holders.new" || true
    mv "$STATE_DIR/holders.new" "$STATE_DIR/holders"
    if holders_alive; then
      echo "test_hosts: down: still used by $(<"$STATE_DIR/holders")"
      return 0
    fi
  fi
  [[ $(id -u) -eq 0 ]] || skip "removing network namespaces needs root"
  for k in $(present_hosts); do host_down "$k"; done
  ip link del "$BRIDGE" 2>/dev/null || true
  hosts_file_set 0
  rm -rf "$STATE_DIR"
  echo "test_hosts: down"
}

locked() {
  exec 9>"$LOCK"
  flock 9
  "$@"
}

cmd=${1:-}
[[ -n $cmd ]] || usage
shift
case $cmd in
  up | run)
    [[ $# -ge 1 ]] || usage
    count=$1
    shift
    rate="" holder=""
    while [[ $# -gt 0 ]]; do
      case $1 in
        --rate) rate=${2:?--rate needs a value, e.g. 1gbit}; shift 2 ;;
        --holder) holder=${2:?--holder needs a pid}; shift 2 ;;
        --holder-parent) holder=$PPID; shift ;;
        --) shift; break ;;
        *) usage ;;
      esac
    done
    if [[ $cmd == up ]]; then
      [[ $# -eq 0 ]] || usage
      (locked do_up "$count" "$rate" "$holder")
    else
      [[ $# -gt 0 ]] || usage
      trap '(locked do_down "$$") || true' EXIT
      trap 'exit 130' INT
      trap 'exit 143' TERM
      (locked do_up "$count" "$rate" "$$")
      set +e
      "$@"
      exit $?
    fi
    ;;
  down)
    holder=""
    if [[ ${1:-} == --holder ]]; then holder=${2:?--holder needs a pid}; fi
    if [[ ${1:-} == --holder-parent ]]; then holder=$PPID; fi
    (locked do_down "$holder")
    ;;
  status)
    [[ -f $STATE_DIR/env ]] || { echo "test_hosts: down"; exit 1; }
    cat "$STATE_DIR/env"
    ;;
  exec)
    [[ $# -ge 2 ]] || usage
    ns=$1
    shift
    k=${ns#kolo-h}
    pid=$(sshd_pid "$k") || die "$ns is not up (scripts/test_hosts.sh up N)"
    exec nsenter --net=/run/netns/"$ns" --uts=/proc/"$pid"/ns/uts -- "$@"
    ;;
  link)
    [[ $# -eq 2 && ($2 == up || $2 == down) ]] || usage
    ip link set "$1-br" "$2"
    ;;
  *) usage ;;
esac
